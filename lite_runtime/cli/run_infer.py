"""`run_infer_main.py` (console script `lite-infer`): upstream argument names, plus --backend, --model_dir,
--seed, --max_new_tokens.

`--predict_data` takes a prompt or a .txt file (one prompt per line, batched); without it, an
interactive loop reads prompts from stdin until EOF or Ctrl-C.
"""
from __future__ import annotations

import json
import logging
import os
import re
import sys
import time
from types import SimpleNamespace
from typing import List, Optional

import click

from lite_runtime.api.generation_options import GenerationOptions
from lite_runtime.contract.command_line import BOOL, CONTEXT, entry_point
from lite_runtime.contract.errors import ConfigError
from lite_runtime.contract.families import KV_CACHE_DTYPES

log = logging.getLogger("lite_runtime")
RESULT_FILE = "text_generation_result.txt"   # upstream run_mindformer's name, in the working directory
PREDICT_DATA_ALLOWED = "allowed: a prompt text, or a .txt file (UTF-8) with one prompt per line"
# A --predict_data value that is one word ending like a data file: meant as a file, not as the prompt.
_DATA_FILE_NAME = re.compile(r"\S+\.(txt|csv|tsv|json|jsonl|yaml|yml|md|parquet)", re.IGNORECASE)


def _option(*names, help: str, default=None, **kwargs):
    """A click option whose help ends with its default, unless the help already says what the default is."""
    text = help if "default" in help else f"{help} (default: {default})"
    return click.option(*names, default=default, help=text, show_default=False, **kwargs)


# Upstream run_infer_main.py's option names and True/False strings, plus --backend, --model_dir, --seed, ...
OPTIONS = (
    _option("--model_dir", default="", help="export folder (manifest.json, graphs, tokenizer); replaces the graph "
            "paths; default: none, give the two graph paths instead"),
    _option("--backend", default="mslite", help="mslite (MindSpore Lite) or ms (MindSpore's MindIR executor)"),
    _option("--device_id", type=int, default=0, help="the Ascend device the graphs run on"),
    _option("--rank_id", type=int, help="this process's rank of a multi-rank export; default: $RANK_ID, else 0"),
    _option("--model_name", default="common", help="family name such as llama2_7b, checked against the export; "
            "'common' = the family in the manifest"),
    _option("--seq_length", type=int, help="checked against the export's seq_length (graphs have static shapes); "
            "default: the export's"),
    _option("--tokenizer_path", help="tokenizer file or folder; default: the tokenizer shipped in the export"),
    _option("--prefill_model_path", default="", help="prefill graph: an export's mindir_full_checkpoint/"
            "rank_N_graph.mindir or the copy written for infer.prefill_model_path; default: none, use --model_dir"),
    _option("--increment_model_path", default="", help="increment graph: an export's mindir_inc_checkpoint/"
            "rank_N_graph.mindir or the copy written for infer.increment_model_path; default: none, use --model_dir"),
    _option("--config_path", help="GE config.ini (Ascend), or 'prefill.ini,increment.ini'; default: the "
            "export's config.ini when it ships one, else none"),
    _option("--do_sample", type=BOOL, default=False, help="sample the next token instead of taking the most likely"),
    _option("--top_k", type=int, default=1, help="sampling keeps the k most likely tokens"),
    _option("--top_p", type=float, default=1.0, help="sampling keeps the most likely tokens up to this probability "
            "mass"),
    _option("--repetition_penalty", type=float, default=1.0, help="penalise tokens already in the text (> 1 "
            "discourages repeats; 1 = off)"),
    _option("--temperature", type=float, default=1.0, help="divide the logits by this before sampling"),
    _option("--max_length", type=int, help="prompt + new tokens; default: the export's seq_length (a larger value "
            "is capped by it)"),
    _option("--max_output_length", "--max_new_tokens", "max_new_tokens", type=int, default=128,
            help="new tokens per prompt at most"),
    _option("--is_sample_acceleration", type=BOOL, default=False, help="accepted; sampling is always on the host"),
    _option("--add_special_tokens", type=BOOL, help="add the tokenizer's special tokens (such as BOS) to each "
            "prompt; default: only the prefix a family's prompts need (ChatGLM2/3: [gMASK] sop)"),
    _option("--stream", type=BOOL, default=False, help="print each answer while it is generated, one prompt at a "
            "time"),
    _option("--prompt", help="a template with {} where each input goes; default: none, inputs as they are"),
    _option("--chat", type=BOOL, default=False, help="each input is a user's chat message, formatted by the "
            "export's chat template (else the family's chat format), and only the answer is printed"),
    _option("--system_prompt", help="with --chat: a system message before each input; default: none (a "
            "template may add its own)"),
    _option("--dynamic", type=BOOL, default=False, help="upstream's dynamic shapes: True requires an export with "
            "kv_cache packed (one graph; prompts at their own length); such exports run dynamic either way"),
    _option("--paged_attention", type=BOOL, default=False, help="upstream's paged attention: not supported (the "
            "KV cache is a graph input or parameter); leave it False"),
    _option("--pa_block_size", type=int, default=16, help="upstream's paged-attention block size; accepted, unused"),
    _option("--pa_num_blocks", type=int, default=512, help="upstream's paged-attention block count; accepted, "
            "unused"),
    _option("--distributed", type=BOOL, default=False, help="run as one rank of a launched job "
            "(python -m lite_runtime.cli.launch sets it)"),
    _option("--adapter_id", help="SLoRA exports: the adapter every prompt runs with (a name of the export's "
            "lora_adapter.json); unknown or absent: the base model"),
    _option("--strict_adapter", type=BOOL, default=False, help="refuse an unknown --adapter_id instead of running "
            "the base model"),
    _option("--data_parallel", type=int, default=1, help="model replicas under the launcher (a rank table of "
            "data_parallel x the export's ranks): each request's prompts are split over them in order"),
    _option("--predict_data", help="a prompt, or a .txt file (UTF-8) with one prompt per line; default: none, "
            "read prompts from the terminal"),
    _option("--interactive", is_flag=True, default=False,
            help="read prompts from stdin even when it is not a terminal (without --predict_data)"),
    _option("--batch_size", type=int, help="accepted; the export's static batch size is used and prompts run in "
            "batches of it; default: the export's batch size"),
    _option("--save_result", type=BOOL, default=False, help=f"also write the results to {RESULT_FILE} in the "
            "working directory, one line per prompt ({'text_generation_text': [...]}, as upstream run_mindformer)"),
    _option("--generated_time", type=int, default=1, help="repeat each request this many times; each run prints "
            "its timings"),
    _option("--seed", type=int, help="seed of sampling, for the same text every run; default: a fresh random seed"),
    _option("--num_threads", type=int, default=2, help="CPU threads of the runtime"),
    _option("--kv_cache_dtype", type=click.Choice(KV_CACHE_DTYPES), default=KV_CACHE_DTYPES[0],
            help="what an `attention: paged` export's KV store holds (mslite)"),
    _option("--kv_cache_gb", type=click.FloatRange(0, None, min_open=True), help="GiB of an `attention: paged` "
            "export's KV store (mslite); default: every row's seq_length, within half the memory available"),
    _option("--int8_activations", type=BOOL, default=False, help="the products of `weights: int8` on int8 "
            "activations, as llama.cpp's Q8_0 computes them (AVX512-VNNI, mslite): faster at many rows"),
    _option("--truncate", type=BOOL, default=False, help="keep the tail of over-long prompts instead of failing"),
    _option("--speculative", help="ngram or ngram:K: each step also feeds up to K (default 4) tokens guessed from "
            "the text so far and keeps those the model confirms (the same text; faster when answers quote their "
            "input); packed exports; default: off"),
    _option("--json_schema", callback=lambda ctx, param, path: _read_schema(path),
            help="a .json file with a JSON schema each answer follows ({} for any JSON object); packed exports "
                 "with a tokenizer.json; default: free text"),
    _option("--verbose", is_flag=True, default=False, help="log loading and generation details"),
)


def _read_schema(path: Optional[str]) -> Optional[dict]:
    if path is None:
        return None
    try:
        with open(path, encoding="utf-8") as f:
            schema = json.load(f)
    except (OSError, ValueError) as e:
        raise ConfigError(f"--json_schema {path}: not a readable JSON file ({e}); give a .json file with a JSON "
                          "schema") from None
    if not isinstance(schema, dict):
        raise ConfigError(f"--json_schema {path}: holds {type(schema).__name__}, not a JSON schema (an object)")
    return schema


def read_prompts(predict_data: str, template: Optional[str]) -> List[str]:
    if not predict_data.strip():
        raise ConfigError("--predict_data is empty; give a prompt or a .txt file (omit the option to type "
                          "prompts at a terminal)")
    if not predict_data.endswith(".txt"):
        if os.path.exists(predict_data):
            kind = "folder" if os.path.isdir(predict_data) else "file"
            raise ConfigError(f"--predict_data {predict_data} is a {kind}, not a .txt file; {PREDICT_DATA_ALLOWED}")
        if _DATA_FILE_NAME.fullmatch(predict_data):
            raise ConfigError(f"--predict_data file {predict_data} does not exist (and is not a .txt file); "
                              f"{PREDICT_DATA_ALLOWED}")
    if predict_data.endswith(".txt"):
        if not os.path.isfile(predict_data):
            raise ConfigError(f"--predict_data file {predict_data} does not exist")
        with open(predict_data, "rb") as f:
            raw = f.read()
        try:
            text = raw.decode("utf-8-sig")   # a BOM (Windows editors) is not part of the first prompt
        except UnicodeDecodeError as e:
            raise ConfigError(f"--predict_data file {predict_data} is not UTF-8 text: byte 0x{raw[e.start]:02x} "
                              f"at offset {e.start} ({e.reason}); save it as UTF-8") from None
        prompts = [line for line in text.splitlines() if line.strip()]
        if not prompts:
            raise ConfigError(f"--predict_data file {predict_data} holds no prompt")
    else:
        prompts = [predict_data]
    return [apply_template(template, p) for p in prompts]


def apply_template(template: Optional[str], text: str) -> str:
    if not template:
        return text
    if "{}" not in template:
        raise ConfigError(f"--prompt {template!r} must contain {{}} where the input goes")
    return template.replace("{}", text)


def make_generator(args, rank: int):
    from lite_runtime.api.infer_config import InferConfig
    from lite_runtime.api.infer_task import InferTask
    config = InferConfig(prefill_model_path=args.prefill_model_path, increment_model_path=args.increment_model_path,
                         model_name=args.model_name, device_id=args.device_id, rank_id=rank,
                         ge_config_path=args.config_path or "", dynamic=args.dynamic,
                         paged_attention=args.paged_attention, pa_block_size=args.pa_block_size,
                         pa_num_blocks=args.pa_num_blocks, model_dir=args.model_dir, backend=args.backend,
                         tokenizer_path=args.tokenizer_path or "", num_threads=args.num_threads,
                         kv_cache_dtype=args.kv_cache_dtype, kv_cache_gb=args.kv_cache_gb,
                         int8_activations=args.int8_activations, infer_seq_length=args.seq_length, data_parallel=args.data_parallel)
    return InferTask.get_infer_task("text_generation", config)


def generation_options(args) -> GenerationOptions:
    """The command line's GenerationOptions (options of the same names)."""
    return GenerationOptions(**{k: getattr(args, k) for k in GenerationOptions.keywords() if hasattr(args, k)})


def run(args, out=sys.stdout) -> None:
    """Answer --predict_data or stdin prompts (under the launcher: rank 0, run_infer_distributed.py)."""
    from lite_runtime.decode.streamers import TextStreamer
    prompts = read_prompts(args.predict_data, args.prompt) if args.predict_data is not None else None
    if prompts is None and not args.interactive and not sys.stdin.isatty():
        raise ConfigError("no --predict_data and stdin is not a terminal: give --predict_data PROMPT_OR_FILE.txt, "
                          "or --interactive to read prompts from stdin")
    rank = args.rank_id if args.rank_id is not None else int(os.environ.get("RANK_ID", "0"))
    saved = _open_result_file() if args.save_result else None
    try:
        generator = make_generator(args, rank)
    except BaseException:
        if saved is not None:
            saved.close()
        raise
    log.info("loaded %s in %.2f s", args.model_dir or args.prefill_model_path, generator.load_seconds)
    _warn_about_fixed_shapes(args, generator.manifest)
    options = generation_options(args)
    chat = _chat_format(args, generator) if args.chat else None
    if chat is not None and args.add_special_tokens is None:
        # a published template writes every special token itself; the family's format follows BOS
        options = options.updated(add_special_tokens=chat.published is None)

    def infer(prompts, streamer=None):
        return generator.infer(prompts, streamer, options)

    def check_before_printing(texts: List[str]) -> None:
        """Every prompt refused or accepted before any is echoed, the refusal naming this command's option."""
        generator.check_prompts(texts, options, truncate_option="--truncate True")

    def answer(prompts: List[str]) -> None:
        if chat is not None:
            return chat_answer(prompts)
        check_before_printing(prompts)
        for run_index in range(args.generated_time):
            start = time.perf_counter()
            timings = []
            if args.stream:   # one prompt at a time, so each answer streams right after its prompt
                result = []
                for prompt in prompts:
                    out.write(prompt)
                    out.flush()
                    result += infer([prompt], streamer=TextStreamer(generator.tokenizer, file=out))
                    timings.append(generator.last_timing)
            else:
                result = infer(prompts)
                timings.append(generator.last_timing)
                for item in result:
                    out.write(item["text_generation_text"][0] + "\n")
            out.flush()
            if saved is not None and run_index == 0:   # repeats (--generated_time) are for timing
                saved.writelines(f"{item}\n" for item in result)
                saved.flush()
            which = f"run {run_index + 1}/{args.generated_time}: " if args.generated_time > 1 else ""
            print(which + run_summary(generator, timings, len(result), time.perf_counter() - start),
                  file=sys.stderr, flush=True)

    def chat_answer(messages: List[str]) -> None:
        """Each message as one chat: the question, then the answer only (not the formatted prompt)."""
        system = [{"role": "system", "content": args.system_prompt}] if args.system_prompt else []
        texts = [chat.render(system + [{"role": "user", "content": m}]) for m in messages]
        check_before_printing(texts)
        for run_index in range(args.generated_time):
            start, timings = time.perf_counter(), []
            for message, text in zip(messages, texts):
                out.write(f"user: {message}\nassistant: ")
                out.flush()
                streamer = TextStreamer(generator.tokenizer, file=out) if args.stream else None
                result = infer([text], streamer=streamer)
                timings.append(generator.last_timing)
                if streamer is None:
                    out.write(result[0]["text_generation_text"][0][len(text):])
                out.write("\n")
            out.flush()
            which = f"run {run_index + 1}/{args.generated_time}: " if args.generated_time > 1 else ""
            print(which + run_summary(generator, timings, len(texts), time.perf_counter() - start),
                  file=sys.stderr, flush=True)

    try:
        if prompts is not None:
            answer(prompts)
        else:
            _interactive(answer, args.prompt)
    finally:
        generator.close()
        if saved is not None:
            saved.close()


def _chat_format(args, generator):
    from lite_runtime.tokenizers.chat_format import ChatFormat
    if args.prompt:
        raise ConfigError("--chat formats each input with the chat template; --prompt would format it again: "
                          "give one of them")
    m = generator.manifest
    chat = ChatFormat(m.family, m.root, generator.tokenizer)
    log.info("chat: %s", chat.describe())
    return chat


def _open_result_file():
    try:
        return open(RESULT_FILE, "w", encoding="utf-8")
    except OSError as e:
        raise ConfigError(f"--save_result: cannot write {os.path.abspath(RESULT_FILE)}: {e.strerror}") from None


def _warn_about_fixed_shapes(args, manifest) -> None:
    """Values the export's static shapes override: said once, not clamped or ignored silently."""
    if args.max_length is not None and args.max_length > manifest.seq_length:
        log.warning("--max_length %d is above the export's seq_length %d: prompt + new tokens are capped by "
                    "seq_length %d (export with a larger seq_length for longer answers)", args.max_length,
                    manifest.seq_length, manifest.seq_length)
    if args.batch_size is not None and args.batch_size != manifest.batch_size:
        log.warning("--batch_size %d: the export's batch size %d is used (graphs have static shapes); prompts "
                    "run in batches of %d", args.batch_size, manifest.batch_size, manifest.batch_size)


def run_summary(generator, timings, prompts: int, seconds: float) -> str:
    """One line: what ran, load time, time to first token, decode rate."""
    tokens = sum(t.decode_tokens for t in timings)
    decode_s = sum(t.end - t.first for t in timings if t.first is not None)
    rate = f"{tokens / decode_s:.1f} tokens/s" if decode_s > 0 else "no decode steps"
    return (f"{generator.session.backend_name}: {generator.session.runtime}; load {generator.load_seconds:.2f} s; "
            f"TTFT {timings[0].ttft_ms:.1f} ms; decode {rate}; {prompts} prompt(s) in {seconds:.2f} s")


def _interactive(answer, template) -> None:
    try:
        while True:
            sys.stderr.write("> ")
            sys.stderr.flush()
            line = sys.stdin.readline()
            if not line:
                return
            if line.strip():
                answer([apply_template(template, line.rstrip("\n"))])
    except KeyboardInterrupt:
        sys.stderr.write("\n")


def _with_options(function):
    for option in reversed(OPTIONS):
        function = option(function)
    return function


@click.command(context_settings=CONTEXT)
@_with_options
def command(**options):
    """Generate text from an export with MindSpore Lite (or MindSpore)."""
    args = SimpleNamespace(**options)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(name)s: %(message)s")
    if args.data_parallel < 1 or (args.data_parallel > 1 and not args.distributed):
        raise click.UsageError(f"--data_parallel {args.data_parallel}: give 1, or run under the launcher with a rank "
                               "table of that many replicas x the export's ranks (python -m lite_runtime.cli.launch --rank_table "
                               "FILE -- run_infer_main.py --data_parallel N ...)")
    if args.num_threads < 1:
        raise click.UsageError(f"--num_threads {args.num_threads}: give 1 or more (the runtime's CPU threads)")
    if args.distributed:
        from lite_runtime.cli.run_infer_distributed import run_distributed
        run_distributed(args, run, make_generator)
    else:
        run(args)


main = entry_point(command, "run_infer_main.py")
