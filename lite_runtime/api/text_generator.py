"""`TextGeneratorInfer`: text in, text out, over one rank's session of an export.

Tokenises, validates the request once, runs the engine (or, for the two-graph forms,
`generation.generate_batches`), detokenises, streams. Under the launcher rank 0 answers on a session
per replica while the other ranks replay its calls.
"""
from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np

from lite_runtime.backends import load_session
from lite_runtime.contract.errors import ArtifactError, ConfigError, DistributedError, ValidationError
from lite_runtime.contract.families import family_from_model_name, get_family
from lite_runtime.decode.constraints import json_matcher
from lite_runtime.decode.engine import Engine, EngineRequest
from lite_runtime.decode.speculation import Speculation
from lite_runtime.distributed.data_parallel import launched_ranks
from lite_runtime.decode.generation import Step, check_prompts, generate_batches, row_budgets
from lite_runtime.api.generation_options import GenerationOptions
from lite_runtime.api.infer_config import InferConfig
from lite_runtime.decode.inputs import InputOfInfer
from lite_runtime.decode.sampling import Sampler, for_sequence
from lite_runtime.decode.streamers import CONTEXT_TOKENS, continuation_text
from lite_runtime.tokenizers import Tokenizer, export_tokenizer, load_tokenizer

log = logging.getLogger("lite_runtime")


class TextGeneratorInfer:
    """Upstream `TextGeneratorInfer`: `infer(inputs, ...)` -> `[{'text_generation_text': [...]}]`."""

    def __init__(self, config: InferConfig, tokenizer: Union[Tokenizer, str, None] = None,
                 session_factory: Optional[Callable] = None):
        self.config = config
        self.manifest = config.load_manifest()
        if config.model_name != "common":
            named = get_family(family_from_model_name(config.model_name), source=f"model_name {config.model_name!r}")
            held = get_family(self.manifest.family, source=self.manifest.root)
            if named is not held:
                accepted = ", ".join((held.name,) + held.aliases)
                raise ConfigError(f"model_name {config.model_name!r} names family {named.name!r} but the export "
                                  f"{self.manifest.root} holds a {held.name!r} model; model names it accepts start "
                                  f"with: {accepted} (or use 'common')")
        self.tokenizer = _resolve_tokenizer(tokenizer or config.tokenizer_path, self.manifest)
        _check_vocab(self.tokenizer, self.manifest)
        self.inputs = InputOfInfer.get_inputs(self.manifest.family, self.manifest)
        self.manifest.verify_files()
        factory = session_factory or load_session
        prefill_ini, increment_ini = config.ge_config_files(self.manifest)
        ini = ",".join(dict.fromkeys(p for p in (prefill_ini, increment_ini) if p)) or None
        options = {"num_threads": config.num_threads, "device_id": config.device_id, "config_path": ini}
        if config.backend == "mslite":
            options.update(target=config.target, kv_cache_dtype=config.kv_cache_dtype, kv_cache_gb=config.kv_cache_gb,
                           int8_activations=config.int8_activations)
        # Under the launcher (data parallel, or an export of several ranks) rank 0 answers every request
        # on a session per replica and the other ranks replay its calls (distributed/data_parallel.py).
        self.ranks = launched_ranks(config.data_parallel, self.manifest.world_size, self.manifest.root or "the export")
        start = time.perf_counter()
        rank = self.ranks.layout.model_rank if self.ranks else config.rank_id
        self.session = factory(config.backend, self.manifest, rank, **options)
        self.load_seconds = time.perf_counter() - start
        self.sessions = self.ranks.sessions(self.session) if self.ranks and self.ranks.leads else [self.session]
        self.last_timing: Optional[RequestTiming] = None
        self.eos_ids = list(self.manifest.eos_token_id)
        self.pad_id = int(self.manifest.pad_token_id)
        self.options = GenerationOptions()     # every call's defaults (pipeline(...) keywords change them)
        self._engines: Dict[int, Engine] = {}   # per session, made at the first request of a step-graph export

    # --- the upstream call forms ----------------------------------------------------------------
    def infer(self, inputs, streamer=None, options: Optional[GenerationOptions] = None,
              **keywords) -> List[Dict[str, List[str]]]:
        """`keywords`: GenerationOptions fields, changing `options` (default: this generator's)."""
        options = (options or self.options).updated(**keywords)
        if not isinstance(inputs, (str, list, tuple)):
            raise ValidationError(f"inputs must be a prompt (str) or a list of prompts, got {inputs!r}")
        texts = [inputs] if isinstance(inputs, str) else list(inputs)
        if self.ranks is None:
            return self._answer(texts, options, streamer, self.session)
        if not self.ranks.leads:
            return self._rank_0s_answers()
        try:
            answers = self._answer_on_replicas(texts, options, streamer)
        except BaseException as e:
            self.ranks.failed(e)
            raise
        self.ranks.answered(answers)
        return answers

    def _answer_on_replicas(self, texts: List[str], options: GenerationOptions, streamer):
        """Rank 0: each replica answers its in-order share of the prompts, all at once."""
        if len(self.sessions) == 1 or not texts:     # (no prompts: refused there, as with one replica)
            return self._answer(texts, options, streamer, self.sessions[0])
        if streamer is not None:
            raise ConfigError("streamer with data_parallel: each replica answers a share of the prompts; stream "
                              "with data_parallel 1")
        adapter_id = options.adapter_id
        self.adapter_slots(adapter_id, len(texts), options.strict_adapter)  # a bad adapter_id fails before any share
        per_prompt = isinstance(adapter_id, (list, tuple))
        timing = RequestTiming()

        def answer(session, rows):
            chosen = [adapter_id[i] for i in rows] if per_prompt else adapter_id
            return self._answer([texts[i] for i in rows], options.updated(adapter_id=chosen), None, session, timing)
        shares = [(s, rows) for s, rows in zip(self.sessions, self.ranks.shares(range(len(texts)))) if rows]
        with ThreadPoolExecutor(len(shares)) as pool:
            answers = [a for share in pool.map(lambda share: answer(*share), shares) for a in share]
        timing.stop()
        self.last_timing = timing
        return answers

    def _rank_0s_answers(self):
        """A rank other than 0: replay rank 0's calls for this request; returns its answers."""
        message = self.ranks.follow(self.session)
        if "answers" in message:
            return message["answers"]
        raise DistributedError("rank 0 " + (f"failed: {message['error']}" if "error" in message else
                                            "closed its pipeline while this rank was still asking for answers"))

    def follow(self) -> int:
        """A rank other than 0 of run_infer_main: replay rank 0's calls, request after request, until it
        closes; returns the number of calls."""
        while "stop" not in self.ranks.follow(self.session):
            pass
        return self.ranks.calls

    def _answer(self, texts: List[str], options: GenerationOptions, streamer, session,
                timing: Optional["RequestTiming"] = None) -> List[Dict[str, List[str]]]:
        prompts, new_ids = self.generate_ids(texts, options, streamer, session, timing)
        return [{"text_generation_text": [text + continuation_text(self.tokenizer, prompt, ids)]}
                for text, prompt, ids in zip(texts, prompts, new_ids)]

    __call__ = infer

    def generate_ids(self, texts: Sequence[str], options: GenerationOptions = GenerationOptions(),
                     streamer=None, session=None, timing: Optional["RequestTiming"] = None
                     ) -> Tuple[List[List[int]], List[List[int]]]:
        """(prompt token ids, new token ids) per text, on `session` (default: this rank's replica's); EOS is
        included when produced. `timing`: a request's timing that several sessions share."""
        session = self.sessions[0] if session is None else session
        prompts = self._prompt_ids(texts, options, "truncate=True", log.warning)
        eos = self.eos_ids if options.eos_token_id is None else _as_list(options.eos_token_id)
        pick = [Sampler(for_sequence(options.sampling(), i), stop_ids=eos) for i in range(len(prompts))]
        pad = self.pad_id if options.pad_token_id is None else int(options.pad_token_id)
        budgets = row_budgets([len(p) for p in prompts], self.manifest.seq_length, options.max_new_tokens,
                              options.length_limit())
        adapters = self.adapter_slots(options.adapter_id, len(prompts), options.strict_adapter)
        _check_streamer(streamer, len(prompts))
        forward = None
        shared = timing is not None
        if timing is None:
            timing = RequestTiming()
        self.last_timing = timing

        def on_step(offset, step):
            timing.step(int(step.active.sum()))
            if forward is not None:
                forward(offset, step)
        try:
            forward = _stream_to(streamer, prompts) if streamer is not None else None
            if self.manifest.kv_cache == "packed":
                return prompts, self._on_engine(session, prompts, budgets, eos, options, adapters, on_step)
            for name in ("json_schema", "speculative"):
                if getattr(options, name) is not None:
                    self.manifest.require_packed(f"{name} (the engine's)", ConfigError)
            # The two-graph forms (kv_cache io / in_graph: upstream's prefill + increment pair that GE
            # runs on Ascend) have fixed batch shapes and no step over any tokens of any rows, so they
            # keep the static batch loop (the same Sampler picks in both loops).
            return prompts, generate_batches(session, self.inputs, prompts, budgets, eos, pad, pick, on_step, adapters)
        finally:
            if not shared:
                timing.stop()
            if streamer is not None:
                streamer.end()

    def check_prompts(self, texts: Sequence[str], options: GenerationOptions = GenerationOptions(),
                      truncate_option: str = "truncate=True") -> None:
        """Refuse, as generating them would, prompts the export cannot take, before anything runs (a command
        line checks before it prints any prompt); `truncate_option`: the caller's spelling of the option
        that keeps the tail of an over-long prompt instead."""
        self._prompt_ids(texts, options, truncate_option, lambda note: None)

    def _prompt_ids(self, texts: Sequence[str], options: GenerationOptions, truncate_option: str,
                    log_truncation: Callable[[str], None]) -> List[List[int]]:
        """Each text's prompt token ids, checked against the export's seq_length and options' length limit."""
        if not texts:
            raise ValidationError("inputs is empty: give a prompt or a list of prompts")
        for i, text in enumerate(texts):
            if not isinstance(text, str) or not text.strip():
                raise ValidationError(f"prompt {i} is empty or not text ({text!r}); give non-empty text")
        add_special_tokens = options.add_special_tokens
        if add_special_tokens is None:   # the family's prompt format: ChatGLM's [gMASK] sop before the text
            # (v2, v3) or after it (v1: the tokenizer's suffix), none for the others
            add_special_tokens = bool(self.manifest.tokenizer_options.get("prefix_tokens")
                                      or getattr(self.tokenizer, "suffix_ids", None))
        prompts = [self.tokenizer.encode(t, add_special_tokens=add_special_tokens) for t in texts]
        prompts = check_prompts(prompts, self.manifest.seq_length, options.truncate, log_truncation, truncate_option)
        max_length = options.length_limit()
        if max_length is not None:
            for i, prompt in enumerate(prompts):
                if len(prompt) >= max_length:
                    raise ValidationError(
                        f"prompt {i} has {len(prompt)} tokens and max_length is {max_length} (prompt + new tokens): "
                        f"nothing is left to generate; give max_length above {len(prompt)}, or leave it unset "
                        "and limit the answer with max_new_tokens")
        return prompts

    def _on_engine(self, session, prompts, budgets, eos, options: GenerationOptions, adapters,
                   on_step) -> List[List[int]]:
        """The prompts as requests of the engine, submitted together and stepped here until each has
        finished; each prompt samples with its own seed (seed + its index), as a server's choices do."""
        speculation = Speculation.parse(options.speculative, "speculative") if options.speculative else None
        engine = self._engines.get(id(session))
        if engine is None or engine.speculation != speculation:
            engine = self._engines[id(session)] = Engine(session, max_waiting=1 << 30, threaded=False,
                                                         speculation=speculation)
        results: List[List[int]] = [[] for _ in prompts]
        active = np.zeros(len(prompts), bool)
        tokens = np.zeros(len(prompts), np.int32)
        produced = []

        def on_token(i, token):
            results[i].append(token)
            produced.append((i, token))

        sampling = options.sampling()
        for i, (prompt, budget) in enumerate(zip(prompts, budgets)):
            own = for_sequence(sampling, i)
            constraint = None if options.json_schema is None else json_matcher(
                getattr(self.tokenizer, "path", ""), self.manifest.vocab_size, eos, options.json_schema or None,
                "json_schema")
            engine.submit(EngineRequest(list(prompt), budget, own, frozenset(eos), adapters[i] if adapters else 0,
                                        constraint=constraint, on_token=lambda token, _, i=i: on_token(i, token)))

        def after_step():      # a row's k-th token of the step (speculation gives several) in Step k
            pending = list(produced)
            produced.clear()
            while True:
                active[:] = False
                later = []
                for i, token in pending:
                    if active[i]:
                        later.append((i, token))
                    else:
                        active[i], tokens[i] = True, token
                on_step(0, Step(tokens.copy(), active.copy()))
                if not later:
                    return
                pending = later
        engine.run_until_idle(after_step)
        return results

    def adapter_slots(self, adapter_id, prompts: int, strict: bool) -> Optional[List[int]]:
        """Each prompt's SLoRA slot from `adapter_id` (a name, one per prompt, or None: the base model).
        An unknown name runs the base model with a warning naming the known ones (upstream's
        behaviour), or is refused with `strict`. None for an export without adapters."""
        known = {a["name"]: a["slot"] for a in self.manifest.adapters if a.get("type") == "slora"}
        wanted = adapter_id if isinstance(adapter_id, (list, tuple)) else [adapter_id] * prompts
        if len(wanted) != prompts:
            raise ValidationError(f"adapter_id has {len(wanted)} names for {prompts} prompts; give one name, or "
                                  "one per prompt")
        if not known:
            if any(wanted):
                log.warning("adapter_id %s: this export has no SLoRA adapters; the model runs as exported",
                            sorted({str(w) for w in wanted if w}))
            return None
        slots = []
        for name in wanted:
            if name and name not in known:
                message = f"adapter_id {name!r} is not one of this export's adapters ({', '.join(known)})"
                if strict:
                    raise ValidationError(message)
                log.warning("%s: running the base model", message)
            slots.append(known.get(name, 0) if name else 0)
        return slots

    def close(self) -> None:
        for engine in self._engines.values():
            engine.stop()
        for session in self.sessions:     # rank 0's: each tells its replica's ranks to stop, then closes
            session.close()
        if self.ranks is not None:
            self.ranks.close()


class RequestTiming:
    """Time to the first token and the decode rate of one request (all its graph batches)."""

    def __init__(self):
        self.start = time.perf_counter()
        self.first = self.end = None
        self.decode_tokens = 0
        self._lock = threading.Lock()      # replicas' shares step in threads of their own

    def step(self, tokens: int) -> None:
        with self._lock:
            if self.first is None:
                self.first = time.perf_counter()
            else:
                self.decode_tokens += tokens

    def stop(self) -> None:
        self.end = time.perf_counter()

    @property
    def ttft_ms(self) -> float:
        return ((self.first or self.end) - self.start) * 1e3


def _check_streamer(streamer, prompts: int) -> None:
    if streamer is None:
        return
    if not (callable(getattr(streamer, "put", None)) and callable(getattr(streamer, "end", None))):
        raise ValidationError(f"streamer {streamer!r} has no put(new_ids) and end() methods; give a TextStreamer "
                              "or TextIteratorStreamer of lite_runtime.decode.streamers, a transformers streamer, "
                              "or None")
    if _from_transformers(streamer) and prompts != 1:
        raise ValidationError(f"streamer {type(streamer).__name__} (transformers) streams one prompt; this request "
                              f"has {prompts}: stream one prompt per call, or use lite_runtime.decode.streamers."
                              f"TextIteratorStreamer(tokenizer, batch_size={prompts})")


def _from_transformers(streamer) -> bool:
    return any(cls.__module__.split(".")[0] == "transformers" for cls in type(streamer).__mro__)


def _stream_to(streamer, prompts: List[List[int]]):
    """The step callback feeding `streamer`. A transformers streamer gets what transformers' generate
    gives it: the prompt ids as a (1, n) array first (its skip_prompt drops them), then each new
    token as a (1,) array."""
    if _from_transformers(streamer):
        streamer.put(np.array([prompts[0]], dtype=np.int64))

        def on_step(offset, step):
            if offset == 0 and step.active[0]:
                streamer.put(np.array([int(step.tokens[0])], dtype=np.int64))
        return on_step
    if hasattr(streamer, "prime"):
        streamer.prime([p[-CONTEXT_TOKENS:] for p in prompts])
    return _streaming(streamer, len(prompts))


def _streaming(streamer, n_rows: int):
    """Forward each step's new tokens to the streamer: one list per prompt, empty when idle."""
    def on_step(offset, step):
        rows: List[List[int]] = [[] for _ in range(n_rows)]
        for r in np.flatnonzero(step.active):
            if offset + r < n_rows:
                rows[offset + r].append(int(step.tokens[r]))
        streamer.put(rows)
    return on_step


def _check_vocab(tokenizer, manifest) -> None:
    """A tokenizer with more pieces than the model's vocabulary belongs to another model."""
    model_vocab = manifest.vocab_size
    size = getattr(tokenizer, "vocab_size", None)
    if size is not None and size > model_vocab:
        raise ArtifactError(f"the tokenizer has {size} pieces but the model's vocabulary is {model_vocab}: "
                            "they belong to different models; give the model's own tokenizer_path")


def _as_list(value) -> List[int]:
    return [int(v) for v in value] if isinstance(value, (list, tuple)) else [int(value)]


def _resolve_tokenizer(tokenizer, manifest) -> Tokenizer:
    if isinstance(tokenizer, str) and tokenizer:
        return load_tokenizer(tokenizer)
    if tokenizer is not None and not isinstance(tokenizer, str):
        return tokenizer
    if manifest.tokenizer is None:
        raise ArtifactError(f"the export {manifest.root} ships no tokenizer; give tokenizer_path")
    return export_tokenizer(manifest)
