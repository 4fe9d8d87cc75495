"""The OpenAI surface clients use, on the demo model served once for the module (`ms` backend), through
the official `openai` client (raw HTTP for vLLM's and llama.cpp's /tokenize and /detokenize): batched
completions, max_tokens beyond the context, logprob tokens as text with their bytes, /v1/models/{id},
/tokenize and /detokenize, developer and tool-call chat messages, cancelled requests in the metrics,
a body that is not JSON."""
import json
import os
import socket
import time
import urllib.error
import urllib.request

import pytest

from support.http_json import post_json
from support.serving import PROMPTS, client, disconnect_mid_stream, served
from support.tiny_models import REPO, run_cli
from lite_runtime.tokenizers import export_tokenizer

CONTEXT = 128       # the demo export's seq_length
DEMO_YAML = os.path.join(REPO, "tools", "demo_model", "demo.yaml")


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    """(base url, tokenizer): the demo export (kv_cache packed, `ms`) served for the whole module."""
    from lite_runtime.contract.manifest import load_manifest
    out = str(tmp_path_factory.mktemp("demo_openai") / "ms")
    result = run_cli(["-m", "exporter", "--config", DEMO_YAML, "--output_dir", out])
    assert result.returncode == 0, result.stderr[-2000:]
    with served(out, "ms") as (url, _pid):
        yield url, export_tokenizer(load_manifest(out))


def _greedy(**kwargs):
    return dict(model="demo", temperature=0, **kwargs)


# -- 1. batched completions ---------------------------------------------------------------------
def test_a_batch_of_prompts_gets_n_choices_each_in_order_with_usage_summed(demo):
    url, tokenizer = demo
    c = client(url)
    alone = [c.completions.create(prompt=p, **_greedy(max_tokens=6)) for p in PROMPTS[:2]]
    texts = [a.choices[0].text for a in alone]
    assert texts[0] != texts[1]
    batch = c.completions.create(prompt=PROMPTS[:2], n=2, **_greedy(max_tokens=6))
    assert [ch.index for ch in batch.choices] == [0, 1, 2, 3]          # prompt i, choice j: i * n + j
    assert [ch.text for ch in batch.choices] == [texts[0], texts[0], texts[1], texts[1]]
    assert batch.usage.prompt_tokens == sum(a.usage.prompt_tokens for a in alone)       # each prompt once
    assert batch.usage.completion_tokens == 2 * sum(a.usage.completion_tokens for a in alone)
    ids = [tokenizer.encode(p, add_special_tokens=True) for p in PROMPTS[:2]]
    as_ids = c.completions.create(prompt=ids, **_greedy(max_tokens=6))
    assert [ch.text for ch in as_ids.choices] == texts and [ch.index for ch in as_ids.choices] == [0, 1]
    streamed = {}
    for chunk in c.completions.create(prompt=PROMPTS[:2], n=2, stream=True, **_greedy(max_tokens=6)):
        for ch in chunk.choices:
            streamed[ch.index] = streamed.get(ch.index, "") + ch.text
    assert streamed == {0: texts[0], 1: texts[0], 2: texts[1], 3: texts[1]}
    echoed = c.completions.create(prompt=PROMPTS[:2], echo=True, **_greedy(max_tokens=6))
    assert [ch.text for ch in echoed.choices] == [p + t for p, t in zip(PROMPTS, texts)]
    # one string and one list of ids still are one prompt
    assert c.completions.create(prompt=ids[0], **_greedy(max_tokens=6)).choices[0].text == texts[0]


@pytest.mark.parametrize("prompt", [[], [[1, 5], "one,"], [[1, 5], []], [True, 5], 5, [["one,"]]])
def test_a_prompt_of_no_known_shape_is_refused_naming_the_shapes(demo, prompt):
    status, answer = post_json(demo[0] + "/v1/completions", {"model": "demo", "prompt": prompt})
    assert status == 400 and answer["error"]["param"] == "prompt", answer
    assert "a list of strings or a list of lists of token ids" in answer["error"]["message"], answer


# -- 2. max_tokens beyond the context ----------------------------------------------------------
def test_max_tokens_beyond_the_context_is_refused_with_the_numbers(demo):
    import openai
    url, tokenizer = demo
    c = client(url)
    used = len(tokenizer.encode(PROMPTS[0], add_special_tokens=True))
    with pytest.raises(openai.BadRequestError) as e:
        c.completions.create(prompt=PROMPTS[0], **_greedy(max_tokens=200))
    assert e.value.param == "max_tokens" and e.value.code == "context_length_exceeded"
    message = e.value.body["message"]
    assert "max_tokens 200" in message and f"context is {CONTEXT} tokens" in message, message
    assert f"has {used} tokens" in message and f"at most {CONTEXT - used}" in message, message
    with pytest.raises(openai.BadRequestError) as e:      # a batch: which prompt
        c.completions.create(prompt=[PROMPTS[0], "one, " * 40], **_greedy(max_tokens=60))
    assert e.value.param == "max_tokens" and "prompt 1 has" in e.value.body["message"]
    chat = [{"role": "user", "content": "Counting:"}]
    for limit in ("max_tokens", "max_completion_tokens"):
        with pytest.raises(openai.BadRequestError) as e:
            c.chat.completions.create(messages=chat, **_greedy(**{limit: 500}))
        assert e.value.param == limit and f"{limit} 500 is too large" in e.value.body["message"]
    # what fits is answered; an omitted max_tokens means up to the context (chat) or at most 16 (completions)
    assert c.completions.create(prompt=PROMPTS[0], **_greedy(max_tokens=CONTEXT - used)).choices
    assert c.chat.completions.create(messages=chat, **_greedy()).choices[0].finish_reason in ("stop", "length")
    near = [1] + [5] * (CONTEXT - 6)       # 5 tokens of room, below completions' default 16
    assert c.completions.create(prompt=near, model="demo", temperature=0).usage.completion_tokens <= 5
    full = c.completions.create(prompt=near, extra_body={"ignore_eos": True}, **_greedy(max_tokens=5))
    assert full.usage.completion_tokens == 5 and full.choices[0].finish_reason == "length"     # prompt + new = 128
    status, answer = post_json(url + "/generate", {"inputs": PROMPTS[0], "parameters": {"max_new_tokens": 200}})
    assert status == 422 and answer["error"].startswith("parameters.max_new_tokens: max_new_tokens 200"), answer


# -- 3. logprob tokens as text, with their bytes -------------------------------------------------
def test_logprob_tokens_are_their_text_with_their_utf8_bytes(demo):
    url, tokenizer = demo
    c = client(url)
    whole = c.completions.create(prompt=PROMPTS[0], logprobs=2, **_greedy(max_tokens=6)).choices[0]
    assert "".join(whole.logprobs.tokens) == whole.text and whole.text.startswith(" ")
    assert all("\u2581" not in t for top in whole.logprobs.top_logprobs for t in top)
    assert whole.logprobs.tokens[0] == next(iter(whole.logprobs.top_logprobs[0]))      # greedy: the first
    chat = c.chat.completions.create(messages=[{"role": "user", "content": "Counting:"}], logprobs=True,
                                     top_logprobs=2, **_greedy(max_tokens=6)).choices[0]
    entries = [e for chosen in chat.logprobs.content for e in [chosen, *chosen.top_logprobs]]
    assert all(e.bytes == list(e.token.encode()) and "\u2581" not in e.token for e in entries)
    assert "".join(e.token for e in chat.logprobs.content) == chat.message.content
    # a token that is one byte of a multi-byte character: its byte, and as text the byte escaped
    half = next(i for i in range(tokenizer.vocab_size) if tokenizer.id_to_piece(i) == "<0xE4>")
    forced = c.chat.completions.create(messages=[{"role": "user", "content": "Counting:"}], logprobs=True,
                                       logit_bias={str(half): 100}, **_greedy(max_tokens=1)).choices[0]
    assert (forced.logprobs.content[0].token, forced.logprobs.content[0].bytes) == ("\\xe4", [0xE4])
    status, tgi = post_json(url + "/generate", {"inputs": PROMPTS[0], "parameters": {
        "max_new_tokens": 1, "details": True, "decoder_input_details": True}})
    prefill = [t["text"] for t in tgi["details"]["prefill"]]
    assert status == 200 and prefill[:3] == ["<s>", " An", " in"], prefill


@pytest.mark.fast
def test_token_text_reads_each_kind_of_vocabulary(tmp_path):
    """Byte-level BPE (`Ġ`), sentencepiece (`▁`, `<0xNN>`) and tiktoken pieces: the bytes of a text's
    tokens joined are the text's (sentencepiece: after the space it puts first), also where a
    character is split over tokens."""
    from support.tokenizer_files import STREAM_TEXTS, TEXTS, train_byte_level_json, train_sentencepiece, write_tiktoken
    from lite_runtime.serve.text import TokenText
    from lite_runtime.tokenizers import load_tokenizer
    (tmp_path / "sp").mkdir(), (tmp_path / "qwen").mkdir()
    files = {"sp": train_sentencepiece(tmp_path / "sp"),
             "hf": train_byte_level_json(tmp_path / "hf" / "tokenizer.json"),
             "tiktoken": write_tiktoken(tmp_path / "qwen" / "qwen.tiktoken")}
    for kind, path in files.items():
        tokenizer = load_tokenizer(path)
        tokens = TokenText(tokenizer)
        for text in TEXTS + STREAM_TEXTS:
            joined = b"".join(tokens.bytes(t) for t in tokenizer.encode(text))
            assert joined == (" " + text if kind == "sp" and text else text).encode(), (kind, text, joined)
        split = [tokens.bytes(t) for t in tokenizer.encode("中国")]
        assert b"".join(split) == (" 中国" if kind == "sp" else "中国").encode(), (kind, split)
        if kind == "tiktoken":       # [e4 b8][ad e5 9b][bd]
            assert split == [b"\xe4\xb8", b"\xad\xe5\x9b", b"\xbd"]
            assert [tokens.text(t) for t in tokenizer.encode("中国")] == ["\\xe4\\xb8", "\\xad\\xe5\\x9b", "\\xbd"]
        hello = [tokens.text(t) for t in tokenizer.encode("Hello world")]      # not ĠWorld, ▁w
        assert "".join(hello).lstrip(" ") == "Hello world", (kind, hello)


# -- 4. /v1/models/{id}, /tokenize, /detokenize -------------------------------------------------
def test_a_model_is_retrieved_by_its_id_and_an_unknown_one_is_a_404(demo):
    import openai
    url, _ = demo
    c = client(url)
    card = c.models.retrieve("demo")
    assert (card.id, card.object, card.owned_by) == ("demo", "model", "lite_runtime") and card.created > 0
    with pytest.raises(openai.NotFoundError) as e:
        c.models.retrieve("gpt-4o")
    assert e.value.code == "model_not_found" and e.value.param == "model" and "gpt-4o" in e.value.body["message"]


def test_tokenize_and_detokenize_in_vllms_and_llama_cpps_shapes(demo):
    url, tokenizer = demo
    text = "Counting: one, two"
    ids = tokenizer.encode(text, add_special_tokens=True)
    assert ids[0] == tokenizer.bos_token_id
    assert post_json(url + "/tokenize", {"model": "demo", "prompt": text}) == \
        (200, {"tokens": ids, "count": len(ids), "max_model_len": CONTEXT})
    assert post_json(url + "/tokenize", {"prompt": text, "add_special_tokens": False})[1]["tokens"] == ids[1:]
    # llama.cpp: content, add_special false unless asked; with_pieces
    assert post_json(url + "/tokenize", {"content": text})[1]["tokens"] == ids[1:]
    assert post_json(url + "/tokenize", {"content": text, "add_special": True})[1]["tokens"] == ids
    pieces = post_json(url + "/tokenize", {"content": "one 你", "with_pieces": True})[1]["tokens"]
    assert [p["piece"] for p in pieces] == [" one", " ", [0xE4], [0xBD], [0xA0]]      # 你: byte fallback
    assert b"".join(p["piece"].encode() if isinstance(p["piece"], str) else bytes(p["piece"]) for p in pieces) \
        == " one 你".encode()
    # vLLM's chat form: the prompt tokens of the same chat request
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Counting:"}]
    chat = client(url).chat.completions.create(messages=messages, **_greedy(max_tokens=1))
    status, tokenized = post_json(url + "/tokenize", {"model": "demo", "messages": messages})
    assert status == 200 and tokenized["count"] == chat.usage.prompt_tokens == len(tokenized["tokens"])
    # detokenize: the text under vLLM's key and llama.cpp's, special tokens kept
    status, answer = post_json(url + "/detokenize", {"model": "demo", "tokens": ids[1:]})
    assert status == 200 and answer == {"prompt": text, "content": text}
    with_bos = tokenizer.decode(ids, skip_special_tokens=False)
    assert with_bos.startswith("<s>") and post_json(url + "/detokenize", {"tokens": ids})[1]["prompt"] == with_bos
    for route, body, status, param in (("/tokenize", {}, 400, None),
                                       ("/tokenize", {"prompt": "a", "content": "a"}, 400, None),
                                       ("/tokenize", {"model": "other", "prompt": "a"}, 404, "model"),
                                       ("/detokenize", {"tokens": [1, 10 ** 6]}, 400, "tokens"),
                                       ("/detokenize", {"tokens": "one"}, 400, "tokens")):
        got, answer = post_json(url + route, body)
        assert got == status and answer["error"]["param"] == param and answer["error"]["message"], (body, answer)


# -- 5. developer, tool calls and tool answers in chat ------------------------------------------
TOOL_CALL = {"id": "call_1", "type": "function", "function": {"name": "add", "arguments": "{\"a\": 1, \"b\": 2}"}}


def test_developer_messages_are_system_messages_and_tool_call_history_is_accepted(demo):
    url, _ = demo
    c = client(url)
    ask = [{"role": "user", "content": "Counting:"}]
    system = c.chat.completions.create(messages=[{"role": "system", "content": "Be brief."}] + ask,
                                       **_greedy(max_tokens=4))
    developer = c.chat.completions.create(messages=[{"role": "developer", "content": "Be brief."}] + ask,
                                          **_greedy(max_tokens=4))
    assert developer.usage.prompt_tokens == system.usage.prompt_tokens
    assert developer.choices[0].message.content == system.choices[0].message.content
    history = ask + [{"role": "assistant", "content": None, "tool_calls": [TOOL_CALL]},
                     {"role": "tool", "tool_call_id": "call_1", "content": "3"}, {"role": "user", "content": "one,"}]
    assert c.chat.completions.create(messages=history, **_greedy(max_tokens=2)).choices[0].message.role == "assistant"
    for messages, param in (([{"role": "user", "content": None}], "messages.0"),
                            ([{"role": "assistant", "content": None}], "messages.0"),
                            ([{"role": "user", "content": "x", "tool_calls": [TOOL_CALL]}], "messages.0"),
                            ([{"role": "assistant", "content": None, "tool_calls": [{"id": "c"}]}],
                             "messages.0.tool_calls.0.function")):
        status, answer = post_json(url + "/v1/chat/completions", {"model": "demo", "messages": messages})
        assert status == 400 and answer["error"]["param"] == param, (messages, answer)
    # a tool without a name is refused, naming the field
    status, answer = post_json(url + "/v1/chat/completions", {"model": "demo", "messages": ask, "tools": [
        {"type": "function", "function": {}}]})
    assert status == 400 and answer["error"]["param"] == "tools.0.function.name", answer


@pytest.mark.fast
def test_chat_templates_see_tool_calls_as_transformers_passes_them():
    """A transformers-style template reads message.tool_calls[i].function.name / arguments (the
    arguments as sent) and tool_call_id; fields not sent are absent; developer becomes system."""
    import jinja2
    from lite_runtime.serve.chat_protocol import ChatMessage
    dumped = [ChatMessage.model_validate(m).model_dump() for m in (
        {"role": "developer", "content": "Be brief."},
        {"role": "assistant", "content": None, "tool_calls": [TOOL_CALL]},
        {"role": "tool", "tool_call_id": "call_1", "content": "3"})]
    assert dumped == [{"role": "system", "content": "Be brief."},
                      {"role": "assistant", "content": None, "tool_calls": [TOOL_CALL]},
                      {"role": "tool", "content": "3", "tool_call_id": "call_1"}]
    template = jinja2.Environment().from_string(
        "{% for m in messages %}[{{ m.role }}]{% if m.tool_calls is defined %}{% for c in m.tool_calls %}"
        "{{ c.function.name }}({{ c.function.arguments }}){% endfor %}{% elif m.tool_call_id is defined %}"
        "{{ m.tool_call_id }}={{ m.content }}{% else %}{{ m.content }}{% endif %}{% endfor %}")
    assert template.render(messages=dumped) == '[system]Be brief.[assistant]add({"a": 1, "b": 2})[tool]call_1=3'


# -- 6. cancelled requests in the metrics; a body that is not JSON --------------------------------
def _finished(url, reason):
    from prometheus_client.parser import text_string_to_metric_families
    text = urllib.request.urlopen(url + "/metrics", timeout=10).read().decode()
    family = next(f for f in text_string_to_metric_families(text) if f.name == "lite_requests")
    return sum(s.value for s in family.samples if s.name == "lite_requests_total"
               and s.labels.get("finish_reason") == reason)


def _running(url):
    return json.loads(urllib.request.urlopen(url + "/health", timeout=5).read())["running"]


def _wait_for(condition, what, timeout=30):
    deadline = time.time() + timeout
    while not condition():
        assert time.time() < deadline, what
        time.sleep(0.05)


def test_a_stream_closed_by_its_client_is_counted_as_cancelled(demo):
    url, _ = demo
    _wait_for(lambda: _running(url) == 0, "the server is idle")
    before, lengths = _finished(url, "cancelled"), _finished(url, "length")
    disconnect_mid_stream(url)        # closed after the first event of 60 tokens
    _wait_for(lambda: _finished(url, "cancelled") == before + 1, "a closed stream is counted as cancelled")
    _wait_for(lambda: _running(url) == 0, "the row of a closed stream is freed", timeout=5)
    assert _finished(url, "length") == lengths


def test_a_request_whose_connection_drops_is_cancelled_and_counted(demo):
    """Not streamed: the connection closed while 16 choices of 100 tokens each are generated. The
    request is cancelled (its rows freed at once, not when the choices end) and counted once."""
    url, _ = demo
    _wait_for(lambda: _running(url) == 0, "the server is idle")
    before, lengths = _finished(url, "cancelled"), _finished(url, "length")
    body = json.dumps({"model": "demo", "prompt": PROMPTS[0], "max_tokens": 100, "n": 16, "ignore_eos": True})
    host, port = url.split("//")[1].split(":")
    with socket.create_connection((host, int(port)), timeout=30) as s:
        s.sendall(f"POST /v1/completions HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
                  f"Content-Length: {len(body)}\r\n\r\n{body}".encode())
        _wait_for(lambda: _running(url) > 0, "the request is running")
    _wait_for(lambda: _finished(url, "cancelled") == before + 1, "a dropped connection is counted as cancelled")
    _wait_for(lambda: _running(url) == 0, "the rows of a dropped connection are freed", timeout=5)
    assert _finished(url, "length") == lengths


def test_a_body_that_is_not_json_is_a_400_without_a_param(demo):
    status, answer = post_json(demo[0] + "/v1/completions", b'{"model": "demo", "prompt": ')
    assert status == 400 and answer["error"]["param"] is None, answer
    assert answer["error"]["message"].startswith("the request body is not valid JSON"), answer


def test_a_seed_gives_the_same_text_from_the_server_and_pipeline_on_either_loop(demo, demo_exports):
    """One seed policy: sequence k of a call (choice j of prompt i is k = i·n + j) samples with seed + k, so the
    server's four choices are pipeline()'s four prompts, on the engine (packed) and on the static loop (io)."""
    from lite_runtime import pipeline
    url, _ = demo
    batch = client(url).completions.create(model="demo", prompt=PROMPTS[:2], n=2, max_tokens=12, temperature=2.0,
                                           top_p=0.95, seed=11, extra_body={"top_k": 40})
    served_texts = [c.text for c in batch.choices]
    assert len(set(served_texts)) > 2          # seeds 11 to 14: not copies
    prompts = [PROMPTS[0], PROMPTS[0], PROMPTS[1], PROMPTS[1]]
    for export in ("ms", "ms_io"):
        pipe = pipeline("text_generation", model=demo_exports[export], backend="ms")
        answers = pipe(prompts, max_new_tokens=12, do_sample=True, temperature=2.0, top_p=0.95, top_k=40, seed=11,
                       add_special_tokens=True)
        assert [a["text_generation_text"][0][len(p):] for a, p in zip(answers, prompts)] == served_texts, export
