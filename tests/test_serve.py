"""The OpenAI-compatible server and its engine on the bundled demo model (it continues counting, so
text and stop strings can be checked), on `ms` and on real Lite, through the official `openai`
client: greedy text equal to pipeline()'s, streaming equal to the whole answer, stop strings,
OpenAI-style errors, Prometheus metrics; and the engine's continuous batching: requests joining at
different moments and reusing freed rows get exactly the tokens each gets alone."""
import json
import os
import re
import time
import urllib.error
import urllib.request

import numpy as np
import psutil
import pytest

from support.http_json import post_json
from support.serving import PROMPTS, client, disconnect_mid_stream, pipeline_texts, served  # noqa: F401 (a fixture)
from support.tiny_models import REPO
from lite_runtime.tokenizers import export_tokenizer


@pytest.fixture(scope="module", params=["ms", "mslite"])
def server(demo_exports, request):
    """(base url, backend, pid): the demo export served in a process of its own."""
    with served(demo_exports[request.param], request.param) as (url, pid):
        yield url, request.param, pid


def test_completions_give_pipelines_greedy_text_streamed_or_not(server, pipeline_texts):
    url, *_ = server
    c = client(url)
    for prompt, expected in zip(PROMPTS, pipeline_texts):
        whole = c.completions.create(model="demo", prompt=prompt, max_tokens=10, temperature=0)
        assert whole.choices[0].text == expected
        assert whole.choices[0].finish_reason == "length" and whole.usage.completion_tokens == 10
        chunks = list(c.completions.create(model="demo", prompt=prompt, max_tokens=10, temperature=0, stream=True))
        assert "".join(ch.choices[0].text for ch in chunks) == expected
        assert chunks[-1].choices[0].finish_reason == "length"


def test_stop_strings_end_the_text_before_them(server):
    url, *_ = server
    answer = client(url).completions.create(model="demo", prompt=PROMPTS[0], max_tokens=20, temperature=0,
                                            stop=[" four", "never"])
    assert answer.choices[0].text == " two, three," and answer.choices[0].finish_reason == "stop"
    streamed = client(url).completions.create(model="demo", prompt=PROMPTS[0], max_tokens=20, temperature=0,
                                              stop=" four", stream=True)
    assert "".join(ch.choices[0].text for ch in streamed) == " two, three,"


def test_chat_answers_with_usage_and_the_chosen_tokens_logprobs(server):
    url, *_ = server
    answer = client(url).chat.completions.create(model="demo", messages=[{"role": "user", "content": "Counting:"}],
                                                 max_tokens=6, temperature=0, logprobs=True)
    choice = answer.choices[0]
    assert choice.message.role == "assistant" and choice.finish_reason in ("length", "stop")
    assert answer.usage.completion_tokens == len(choice.logprobs.content) and answer.usage.prompt_tokens > 3
    assert all(t.logprob <= 0 for t in choice.logprobs.content)
    top = client(url).chat.completions.create(model="demo", messages=[{"role": "user", "content": "Counting:"}],
                                              max_tokens=6, temperature=0, logprobs=True, top_logprobs=3)
    for chosen in top.choices[0].logprobs.content:     # greedy: the chosen token is the most likely one
        assert len(chosen.top_logprobs) == 3 and chosen.top_logprobs[0].token == chosen.token
        assert [t.logprob for t in chosen.top_logprobs] == sorted((t.logprob for t in chosen.top_logprobs), reverse=True)


def test_top_logprobs_are_the_models_most_likely_tokens(server, demo_exports):
    """The first new token's top 3 against a log-softmax, in float64, of the prefill logits of the `ms`
    session itself (tolerance 1e-4: Lite's and MindSpore's logits differ by about 1e-5)."""
    import numpy as np
    from lite_runtime.backends import load_session
    from lite_runtime.contract.manifest import load_manifest
    url, *_ = server
    manifest = load_manifest(demo_exports["ms"])
    prompt = [1, 25, 30, 40, 41]
    with load_session("ms", manifest) as session:
        ids = np.zeros((manifest.batch_size, manifest.seq_length), np.int32)
        ids[:, :len(prompt)] = prompt
        logits = session.prefill(ids, np.full(manifest.batch_size, len(prompt), np.int32))[0].astype(np.float64)
    shifted = logits - logits.max()
    expected = shifted - np.log(np.exp(shifted).sum())
    best = np.argsort(-expected)[:3]
    answer = client(url).completions.create(model="demo", prompt=prompt, max_tokens=1, temperature=0, logprobs=3)
    got = answer.choices[0].logprobs
    from lite_runtime.serve.text import TokenText
    text = TokenText(export_tokenizer(manifest)).text       # a token as its text, " two" (not "▁two")
    assert list(got.top_logprobs[0]) == [text(int(i)) for i in best]
    np.testing.assert_allclose(list(got.top_logprobs[0].values()), expected[best], atol=1e-4)
    assert got.token_logprobs[0] == pytest.approx(expected[best[0]], abs=1e-4)


def test_n_choices_are_each_their_own_generation(server, pipeline_texts):
    """Greedy: n copies of pipeline()'s text. Sampled with a seed: choice i is the n = 1 answer with
    seed + i, streamed or not; usage counts every choice's tokens."""
    url, *_ = server
    c = client(url)
    greedy = c.completions.create(model="demo", prompt=PROMPTS[0], max_tokens=10, temperature=0, n=3)
    assert [ch.index for ch in greedy.choices] == [0, 1, 2]
    assert [ch.text for ch in greedy.choices] == [pipeline_texts[0]] * 3 and greedy.usage.completion_tokens == 30
    sampled = dict(model="demo", prompt="Words:", max_tokens=8, temperature=2.0)
    alone = [c.completions.create(seed=11 + i, **sampled).choices[0].text for i in range(3)]
    assert len(set(alone)) > 1, alone           # the seeds give different texts: the check below can fail
    whole = c.completions.create(seed=11, n=3, **sampled)
    assert [ch.text for ch in sorted(whole.choices, key=lambda ch: ch.index)] == alone
    streamed = {}
    for chunk in c.completions.create(seed=11, n=3, stream=True, **sampled):
        for ch in chunk.choices:
            streamed[ch.index] = streamed.get(ch.index, "") + ch.text
    assert [streamed[i] for i in range(3)] == alone
    chat = c.chat.completions.create(model="demo", messages=[{"role": "user", "content": "Counting:"}],
                                     max_tokens=4, temperature=0, n=2)
    assert len(chat.choices) == 2 and chat.choices[0].message.content == chat.choices[1].message.content


@pytest.mark.parametrize("body, status, param", [
    ({"temperature": 3}, 400, "temperature"),
    ({"top_p": 0}, 400, "top_p"),
    ({"n": 17}, 400, "n"),
    ({"logprobs": 6}, 400, "logprobs"),
    ({"presence_penalty": -2.5}, 400, "presence_penalty"),
    ({"model": "other"}, 404, "model"),
    ({"prompt": "one, " * 200}, 400, "prompt"),
    ({"prompt": [1, 5, 10 ** 6]}, 400, "prompt"),
    ({"min_tokens": 3}, 400, "min_tokens"),
    ({"logit_bias": {"5": 101}}, 400, "logit_bias.5"),
    ({"logit_bias": {"w5": 1}}, 400, "logit_bias.w5.[key]"),
    ({"logit_bias": {str(10 ** 6): 1}}, 400, "logit_bias"),
    ({"suffix": " and so on"}, 400, "suffix"),
    ({"best_of": 3}, 400, "best_of"),
    # what is not built is refused, never ignored: the answer would not be what was asked for
    ({"messages": [{"role": "user", "content": "one,"}], "tools": [{"type": "function", "function": {}}]},
     400, "tools.0.function.name"),
    ({"messages": [{"role": "user", "content": "one,"}], "tool_choice": "required"}, 400, "tool_choice"),
    ({"messages": [{"role": "user", "content": "one,"}], "response_format": {"type": "json_object"}},
     400, "response_format"),       # JSON output needs a tokenizer.json; the demo model's is sentencepiece
    ({"messages": [{"role": "user", "content": "one,"}], "response_format": {"type": "xml"}}, 400, "response_format"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
     400, "messages.0.content"),
    ({"messages": [{"role": "user", "content": "one,"}], "max_completion_tokens": 3}, 400, "max_completion_tokens"),
])
def test_a_bad_request_gets_an_openai_error_naming_the_field(server, body, status, param):
    url, *_ = server
    route, first = ("chat/completions", {}) if "messages" in body else ("completions", {"prompt": "one,"})
    data = dict({"model": "demo", "max_tokens": 2, **first}, **body)
    req = urllib.request.Request(f"{url}/v1/{route}", json.dumps(data).encode(), {"Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req, timeout=30)
    assert e.value.code == status
    error = json.loads(e.value.read())["error"]
    assert error["param"] == param and error["message"], error


def test_logit_bias_max_completion_tokens_and_text_parts(server, demo_exports):
    url, *_ = server
    c = client(url)
    from lite_runtime.contract.manifest import load_manifest
    tokenizer = export_tokenizer(load_manifest(demo_exports["ms"]))
    ask = dict(model="demo", prompt=PROMPTS[0], max_tokens=3, temperature=0, logprobs=0)
    greedy = c.completions.create(**ask).choices[0].logprobs.tokens     # each token's text
    from lite_runtime.serve.text import TokenText
    first = next(i for i in range(tokenizer.vocab_size) if TokenText(tokenizer).text(i) == greedy[0])
    banned = c.completions.create(logit_bias={str(first): -100}, **ask).choices[0].logprobs.tokens
    assert banned[0] != greedy[0]
    forced = c.completions.create(logit_bias={str(first): 100}, **ask).choices[0].logprobs.tokens
    assert forced == [greedy[0]] * 3 != greedy
    chat = dict(model="demo", temperature=0)
    plain = c.chat.completions.create(messages=[{"role": "user", "content": "Counting:\none,"}], max_tokens=3, **chat)
    parts = c.chat.completions.create(messages=[{"role": "user", "content": [
        {"type": "text", "text": "Counting:"}, {"type": "text", "text": "one,"}]}], max_completion_tokens=3, **chat)
    assert parts.choices[0].message.content == plain.choices[0].message.content
    assert parts.usage.completion_tokens == 3


def test_the_schedulers_step_budget_and_prompt_chunks_are_options(demo_exports, pipeline_texts):
    """A budget of one token per cache row with prompts fed two tokens a step still gives pipeline()'s
    greedy text (the requests sent at once: a request alone is fed whole); a budget below the rows is
    refused at start, naming the option."""
    from concurrent.futures import ThreadPoolExecutor
    from lite_runtime.contract.errors import ToolchainError
    from lite_runtime.contract.manifest import load_manifest
    from served_process import served as serve_process
    rows = load_manifest(demo_exports["ms"]).batch_size
    tight = ["--max_step_tokens", str(rows), "--prefill_chunk", "2"]
    with serve_process(demo_exports["ms"], "ms", "demo", tight, cwd=REPO) as server:
        c = client(server.url)
        with ThreadPoolExecutor(len(PROMPTS)) as pool:
            texts = list(pool.map(lambda p: c.completions.create(model="demo", prompt=p, max_tokens=10,
                                                                 temperature=0).choices[0].text, PROMPTS))
        assert texts == list(pipeline_texts)
    with pytest.raises(ToolchainError, match=f"max_step_tokens {rows - 1} is below the export's {rows} cache rows"):
        with serve_process(demo_exports["ms"], "ms", "demo", ["--max_step_tokens", str(rows - 1)], cwd=REPO):
            pass


def test_tgi_routes_answer_as_text_generation_inference(server, pipeline_texts):
    """MindIE Service's TGI-style routes through huggingface_hub's InferenceClient (a TGI client this
    project did not write): pipeline()'s greedy text whole and streamed, with details; TGI's errors."""
    from huggingface_hub import InferenceClient
    url, *_ = server
    tgi = InferenceClient(model=url)
    whole = tgi.text_generation(PROMPTS[0], max_new_tokens=10, details=True)
    assert whole.generated_text == pipeline_texts[0]
    assert (whole.details.finish_reason, whole.details.generated_tokens, len(whole.details.tokens)) == ("length", 10, 10)
    assert all(t.logprob <= 0 for t in whole.details.tokens)
    streamed = list(tgi.text_generation(PROMPTS[0], max_new_tokens=10, stream=True, details=True))
    assert [s.token.id for s in streamed] == [t.id for t in whole.details.tokens]
    assert streamed[-1].generated_text == pipeline_texts[0] and streamed[-1].details.finish_reason == "length"
    assert all(s.generated_text is None for s in streamed[:-1])
    cut = pipeline_texts[0].index(",", 1)
    stopped = tgi.text_generation(PROMPTS[0], max_new_tokens=10, stop=[","], details=True)
    assert stopped.generated_text == pipeline_texts[0][:cut] and stopped.details.finish_reason == "stop_sequence"
    c = client(url)       # greedy unless sampling is asked for; sampling as the OpenAI routes' with the same seed
    openai_greedy = c.completions.create(model="demo", prompt="Words:", max_tokens=8, temperature=0).choices[0].text
    assert [tgi.text_generation("Words:", max_new_tokens=8, temperature=1.0) for _ in range(3)] == [openai_greedy] * 3
    sampled = [tgi.text_generation("Words:", max_new_tokens=8, do_sample=True, temperature=2.0, seed=s) for s in (11, 12)]
    assert sampled == [c.completions.create(model="demo", prompt="Words:", max_tokens=8, temperature=2.0,
                                            seed=s).choices[0].text for s in (11, 12)] and sampled[0] != sampled[1]
    full = tgi.text_generation(PROMPTS[0], max_new_tokens=2, return_full_text=True)
    assert full.startswith(PROMPTS[0]) and pipeline_texts[0].startswith(full[len(PROMPTS[0]):])
    for parameters, field in (({"temperature": 0}, "parameters.temperature"),
                              ({"best_of": 2}, "parameters.best_of"), ({"max_tokens": 5}, "parameters.max_tokens")):
        req = urllib.request.Request(url + "/generate", json.dumps({"inputs": "one,", "parameters": parameters}).encode(),
                                     {"Content-Type": "application/json"})
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(req, timeout=30)
        error = json.loads(e.value.read())
        assert e.value.code == 422 and error["error_type"] == "validation" and error["error"].startswith(field), error


def test_metrics_parse_and_count_the_requests(server):
    from prometheus_client.parser import text_string_to_metric_families
    url, *_ = server

    def finished():
        text = urllib.request.urlopen(url + "/metrics", timeout=10).read().decode()
        families = {f.name: f for f in text_string_to_metric_families(text)}
        counts = {s.labels["finish_reason"]: s.value for s in families["lite_requests"].samples
                  if s.name == "lite_requests_total"}
        return counts, families

    def observed(families, histogram):
        return next(s.value for s in families[histogram].samples if s.name == histogram + "_count")
    latencies = ("lite_time_to_first_token_seconds", "lite_e2e_request_latency_seconds")
    before, families = finished()
    observed_before = [observed(families, h) for h in latencies]
    c = client(url)
    for _ in range(3):
        c.completions.create(model="demo", prompt=PROMPTS[1], max_tokens=3, temperature=0)
    c.completions.create(model="demo", prompt=PROMPTS[1], max_tokens=3, temperature=0, n=2)     # one request
    c.completions.create(model="demo", prompt=PROMPTS[0], max_tokens=9, temperature=0, stop=" four")
    after, families = finished()
    added = {reason: after[reason] - before.get(reason, 0) for reason in after}
    assert {reason: n for reason, n in added.items() if n} == {"length": 4, "stop": 1}, added
    # the latencies are each choice's: n=2 counts twice in both, five requests make 6 first tokens and ends
    assert [observed(families, h) - b for h, b in zip(latencies, observed_before)] == [6, 6]
    assert {"lite_inter_token_latency_seconds", "lite_e2e_request_latency_seconds", "lite_requests_running",
            "lite_requests_waiting", "lite_prompt_tokens", "lite_generation_tokens"} <= set(families)


def test_a_steps_callbacks_reach_the_requests_together(demo_exports):
    """The engine hands each step's on_token / on_finish calls to `deliver` in one list (the server
    wakes its event loop once a step with them), in order: a row's last token before its finish."""
    from lite_runtime.backends import load_session
    from lite_runtime.contract.manifest import load_manifest
    from lite_runtime.decode.engine import Engine, EngineRequest, call_each
    m = load_manifest(demo_exports["ms"])
    prompt = export_tokenizer(m).encode(PROMPTS[0], add_special_tokens=True)
    engine = Engine(load_session("ms", m), threaded=False)
    calls, sizes = [], []
    engine.deliver = lambda told: sizes.append(len(told)) or call_each(told)
    for i, budget in enumerate([3, 5]):
        engine.submit(EngineRequest(prompt, budget, on_token=lambda t, lp, i=i: calls.append((i, "token")),
                                    on_finish=lambda reason, i=i: calls.append((i, reason))))
    engine.run_until_idle()
    delivered = [calls[sum(sizes[:k]):sum(sizes[:k + 1])] for k in range(len(sizes))]
    assert engine.steps == 5
    assert delivered == [[(0, "token"), (1, "token")], [(0, "token"), (1, "token")],
                         [(0, "token"), (0, "length"), (1, "token")], [(1, "token")], [(1, "token"), (1, "length")]]


def test_requests_joining_at_different_moments_get_their_alone_tokens(demo_exports):
    """Seven requests on the 4 cache rows with budgets of 2 to 12, three of them submitted while the
    first runs (at its 3rd and 6th token): each gets the tokens it gets alone; rows freed by short
    requests are taken while the first continues; fewer steps than tokens (requests share steps).
    The packed step computes each token once: its calls' tokens add up to the prompts and the fed-back
    tokens."""
    from lite_runtime.backends import load_session
    from lite_runtime.contract.manifest import load_manifest
    from lite_runtime.decode.generation import generate_batches
    from lite_runtime.decode.inputs import InputOfInfer
    from lite_runtime.decode.sampling import Sampler, SamplingParams
    from lite_runtime.decode.engine import Engine, EngineRequest
    m = load_manifest(demo_exports["ms"])
    tokenizer = export_tokenizer(m)
    texts = PROMPTS + ["Counting down: ten, nine,", "The capital of France is", "one,", "a, b, c, d, e, f,"]
    prompts = [tokenizer.encode(t, add_special_tokens=True) for t in texts]
    budgets = [12, 2, 9, 3, 12, 5, 7]
    session = load_session("ms", m)
    inputs = InputOfInfer.get_inputs(m.family, m)
    alone = [generate_batches(session, inputs, [p], [n], [], m.pad_token_id, Sampler(SamplingParams()))[0]
             for p, n in zip(prompts, budgets)]
    computed = []
    run = session._run      # the real graph call, counted: tokens computed per call
    session._run = lambda kind, feeds: computed.append(np.size(feeds[0])) or run(kind, feeds)
    engine = Engine(session, prefill_chunk=8)
    got = [[] for _ in prompts]
    ended = {}
    requests = [EngineRequest(p, n, on_finish=lambda reason, i=i: ended.__setitem__(i, (reason, time.perf_counter())))
                for i, (p, n) in enumerate(zip(prompts, budgets))]
    joining = {3: [4, 5], 6: [6]}    # request 0's token count -> the requests submitted then

    def on_token(i, token):
        got[i].append(token)
        if i == 0:
            for j in joining.get(len(got[0]), []):
                engine.submit(requests[j])
    for i, request in enumerate(requests):
        request.on_token = lambda t, lp, i=i: on_token(i, t)
    for request in requests[:4]:
        engine.submit(request)
    deadline = time.time() + 120
    while len(ended) < len(prompts) and time.time() < deadline:
        time.sleep(0.01)
    engine.stop()
    assert got == alone
    assert all(reason == "length" for reason, _ in ended.values())
    # the requests that waited were admitted while the longest first request still ran
    assert all(r.admitted < ended[0][1] for r in requests[4:])
    assert engine.steps < sum(budgets)
    fed = sum(len(p) + n - 1 for p, n in zip(prompts, budgets))     # the last token is not fed back
    assert sum(computed) == fed, (sum(computed), fed)


def test_a_packed_prefill_in_windows_gives_the_logits_of_one_call(demo_exports):
    """A packed prefill with more tokens than the cache's max_tokens goes in windows of positions,
    each reading the previous windows' keys from the cache: the logits of its prompts (30, 7, 19 and
    1 tokens) and of three decode steps after it are those of the prefill in one call."""
    from lite_runtime.backends import load_session
    from lite_runtime.contract.manifest import load_manifest
    m = load_manifest(demo_exports["ms"])
    lengths = np.array([30, 7, 19, 1], np.int32)
    ids = np.random.default_rng(0).integers(3, m.dims.vocab_size, (4, 30)).astype(np.int32)

    def run(max_tokens):
        session = load_session("ms", m)
        session.cache.max_tokens = max_tokens
        calls = []
        run = session._run      # the real graph call, counted
        session._run = lambda kind, feeds: calls.append(len(feeds[0])) or run(kind, feeds)
        logits = [session.prefill(ids, lengths).copy()]
        for step in range(1, 4):
            logits.append(session.decode(logits[-1].argmax(-1).astype(np.int32)[:, None], lengths + step).copy())
        return np.stack(logits), calls
    whole, whole_calls = run(512)
    windows, window_calls = run(8)            # 2 positions of each of the 4 rows per call
    assert whole_calls[0] == lengths.sum() and window_calls[:15] == [7, 6, 6, 5, 4, 4, 4, 4, 4, 3, 2, 2, 2, 2, 2]
    assert np.abs(windows - whole).max() <= 1e-5


def test_ignore_eos_and_min_tokens_keep_generating_past_the_models_eos(server):
    """The demo model ends "The alphabet: x, y," with " z, y, z." and its EOS."""
    url, *_ = server
    c = client(url)
    asked = dict(model="demo", prompt="The alphabet: x, y,", max_tokens=12, temperature=0)
    ended = c.completions.create(**asked)
    assert ended.choices[0].text == " z, y, z." and ended.choices[0].finish_reason == "stop"
    short = ended.usage.completion_tokens          # the EOS included
    past = c.completions.create(extra_body={"ignore_eos": True}, **asked)      # vLLM's fields: extra_body
    assert past.choices[0].text.startswith(" z, y, z.") and past.choices[0].finish_reason == "length"
    assert past.usage.completion_tokens == 12
    held = c.completions.create(extra_body={"min_tokens": short + 2}, **asked)
    assert held.usage.completion_tokens >= short + 2


def test_min_tokens_holds_a_stop_id_back(demo_exports):
    """A request whose greedy token at position i (its first of that id) is made a stop id ends
    there; with min_tokens i + 3 that id cannot come before then (vLLM's min_tokens)."""
    from lite_runtime.backends import load_session
    from lite_runtime.contract.manifest import load_manifest
    from lite_runtime.decode.engine import Engine, EngineRequest
    from lite_runtime.decode.sampling import SamplingParams
    m = load_manifest(demo_exports["ms"])
    prompt = export_tokenizer(m).encode(PROMPTS[0], add_special_tokens=True)
    engine = Engine(load_session("ms", m))

    def run(**options):
        tokens, ended = [], []
        engine.submit(EngineRequest(prompt, 8, on_token=lambda t, lp: tokens.append(t), on_finish=ended.append,
                                    **options))
        deadline = time.time() + 60
        while not ended and time.time() < deadline:
            time.sleep(0.01)
        return tokens, ended[0]
    free, _ = run()
    i = next(k for k in range(2, 6) if free[k] not in free[:k])      # a token new at position i
    stop = frozenset({free[i]})
    assert run(stop_ids=stop) == (free[:i + 1], "stop")
    held, reason = run(stop_ids=stop, sampling=SamplingParams(min_tokens=i + 3))
    engine.stop()
    assert held[:i] == free[:i] and free[i] not in held[:i + 3] and (len(held) == 8 or reason == "stop"), (free, held)


def test_a_client_that_goes_away_frees_its_row(server):
    url, *_ = server
    stream = client(url).completions.create(model="demo", prompt=PROMPTS[0], max_tokens=100, temperature=0,
                                            stream=True)
    next(iter(stream))
    stream.close()
    deadline = time.time() + 30
    while json.loads(urllib.request.urlopen(url + "/health", timeout=5).read())["running"]:
        assert time.time() < deadline, "the row of a closed stream was not freed"
        time.sleep(0.1)


def _rss(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) * 1024


def test_a_bounded_load_with_bad_and_vanishing_clients(server):
    """200 requests from 32 concurrent clients: valid ones (greedy and seeded sampling), malformed
    bodies, over-long prompts and clients that leave mid-stream. Every valid request gets its whole
    answer, every bad one a 4xx, the server stays up, and its RSS after the run is within 5 % of
    its RSS after a warm-up of the same mix."""
    from concurrent.futures import ThreadPoolExecutor
    url, *_ = server
    valid = {"model": "demo", "prompt": PROMPTS[2], "max_tokens": 8, "temperature": 0}
    kinds = [("valid", valid), ("sampled", dict(valid, temperature=0.8, seed=3)), ("malformed", b"{not json"),
             ("bad_field", dict(valid, max_tokens=0)), ("too_long", dict(valid, prompt="one, " * 200)),
             ("gone", None)]

    def one(i):
        kind, body = kinds[i % len(kinds)]
        if kind == "gone":
            return kind, disconnect_mid_stream(url)
        return kind, post_json(url + "/v1/completions", body, timeout=120)

    def run(n):
        with ThreadPoolExecutor(32) as pool:
            return list(pool.map(one, range(n)))

    run(48)
    pid = server[2]
    warm = _rss(pid)
    results = run(200)
    expected_text = post_json(url + "/v1/completions", valid, timeout=120)[1]["choices"][0]["text"]
    for kind, (status, body) in results:
        if kind == "valid":
            assert status == 200 and body["choices"][0]["text"] == expected_text, body
        elif kind == "sampled":
            assert status == 200 and body["usage"]["completion_tokens"] == 8, body
        elif kind != "gone":
            assert 400 <= status < 500 and body["error"]["message"], (kind, body)
    assert json.loads(urllib.request.urlopen(url + "/health", timeout=10).read())["status"] == "ok"
    assert _rss(pid) <= 1.05 * warm, (warm, _rss(pid))


CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "Count to 3"}]


@pytest.mark.fast
@pytest.mark.parametrize("family, expected", [
    # Llama 2 chat (Meta's reference: [INST] <<SYS>> ... <</SYS>> ..., each answer then </s><s>)
    ("llama", "[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\nHi [/INST] Hello. </s><s>[INST] Count to 3 [/INST]"),
    # Qwen: ChatML
    ("qwen", "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
             "Hello.<|im_end|>\n<|im_start|>user\nCount to 3<|im_end|>\n<|im_start|>assistant\n"),
    # ChatGLM3: a role token, a newline, the content
    ("glm2", "<|system|>\n Be brief.<|user|>\n Hi<|assistant|>\n Hello.<|user|>\n Count to 3<|assistant|>"),
    # Baichuan2: <reserved_106> before the user, <reserved_107> before the assistant
    ("baichuan2", "Be brief.<reserved_106>Hi<reserved_107>Hello.<reserved_106>Count to 3<reserved_107>"),
    ("internlm", "<|User|>:Hi<eoh>\n<|Bot|>:Hello.<eoa>\n<|User|>:Count to 3<eoh>\n<|Bot|>:"),
])
def test_chat_prompts_follow_each_familys_published_format(family, expected):
    from lite_runtime.tokenizers.chat_format import ChatFormat
    assert ChatFormat(family, None).render(CHAT) == expected


@pytest.mark.fast
def test_the_exports_chat_template_comes_first_and_special_tokens_become_their_ids(tmp_path):
    from lite_runtime.tokenizers.chat_format import ChatFormat, encode_chat
    from lite_runtime.tokenizers import load_tokenizer
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(
        {"chat_template": "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}"}))
    assert ChatFormat("llama", str(tmp_path)).render(CHAT[1:3]) == "<user>Hi<assistant>Hello."
    tokenizer = load_tokenizer(os.path.join(REPO, "tools", "demo_model", "tokenizer.model"))
    ids = encode_chat(tokenizer, "[INST] Hi [/INST] Hello. </s><s>[INST] Count [/INST]")
    bos, eos = tokenizer.bos_token_id, tokenizer.eos_token_id
    assert ids[0] == bos and ids.count(bos) == 2 and ids.count(eos) == 1 and ids.index(eos) + 1 == ids.index(bos, 1)
    assert ids[1:ids.index(eos)] == tokenizer.encode("[INST] Hi [/INST] Hello. ", add_special_tokens=False)


def test_a_full_queue_is_refused_at_once_and_stop_ends_every_request(demo_exports):
    """4 rows busy and `max_waiting` requests waiting: the next request is refused (the server answers
    429); `stop` cancels what is still running and waiting, each told so."""
    from lite_runtime.backends import load_session
    from lite_runtime.contract.manifest import load_manifest
    from lite_runtime.decode.engine import Engine, EngineRequest, QueueFull
    m = load_manifest(demo_exports["ms"])
    engine = Engine(load_session("ms", m), max_waiting=2)
    ended = []
    requests = [EngineRequest([1, 50, 60, 70], 100, on_finish=ended.append) for _ in range(6)]
    for request in requests[:4]:
        engine.submit(request)
    deadline = time.time() + 60
    while engine.busy_rows() < 4:
        assert time.time() < deadline
        time.sleep(0.01)
    engine.submit(requests[4])
    engine.submit(requests[5])
    with pytest.raises(QueueFull, match="2 requests are waiting"):
        engine.submit(EngineRequest([1, 50], 5))
    engine.stop(timeout=0.5)
    assert ended == ["abort"] * 6 and engine.busy_rows() == 0


@pytest.fixture(scope="module")
def demo_tp2(demo_exports, tmp_path_factory):
    """The demo model as a two-rank segment export (Lite tensor parallel) and a two-device rank table."""
    import yaml
    from lite_runtime.ascend.rank_table import RankEntry, ServerEntry, table_json
    from support.tiny_models import VENV_MS20_PYTHON, run_cli, write_yaml
    folder = tmp_path_factory.mktemp("demo_tp2")
    demo_dir = os.path.join(REPO, "tools", "demo_model")
    with open(os.path.join(demo_dir, "demo.yaml")) as f:
        config = yaml.safe_load(f)
    config["model"]["tokenizer"] = os.path.join(demo_dir, config["model"]["tokenizer"])
    config.update(load_checkpoint=os.path.join(demo_dir, config["load_checkpoint"]), output_dir=str(folder / "tp2"),
                  parallel={"model_parallel": 2, "collectives": "host"})
    result = run_cli(["-m", "exporter", "--config", write_yaml(str(folder / "tp2.yaml"), config)], python=VENV_MS20_PYTHON)
    assert result.returncode == 0, result.stderr[-2000:]
    tables = {}
    for size in (2, 4):
        tables[size] = folder / f"table{size}.json"
        ranks = tuple(RankEntry(r, "127.0.0.1", r, f"192.98.92.{100 + r}") for r in range(size))
        tables[size].write_text(json.dumps(table_json([ServerEntry("127.0.0.1", ranks)])))
    return str(folder / "tp2"), {n: str(t) for n, t in tables.items()}, folder


@pytest.mark.parametrize("layout", ["tp2", "dp2", "dp2xmp2"])
def test_a_launched_run_serves_from_rank_0(demo_exports, demo_tp2, pipeline_texts, layout):
    """Lite ranks under the launcher, rank 0 serving: a two-rank segment export (tensor parallel), two
    replicas of the single-rank export (data parallel), or two replicas of the two-rank export on four
    ranks. Several requests at once, streamed or not, get the single-rank pipeline's greedy text; the
    other ranks ran steps; SIGTERM to the launcher stops every rank and exits 0."""
    from concurrent.futures import ThreadPoolExecutor
    from support.lite_process import ensure_lite_installed
    from served_process import served as serve_process
    ensure_lite_installed()
    tp2, tables, folder = demo_tp2
    export, extra, table = {"tp2": (tp2, [], tables[2]),
                            "dp2": (demo_exports["mslite"], ["--data_parallel", "2"], tables[2]),
                            "dp2xmp2": (tp2, ["--data_parallel", "2"], tables[4])}[layout]
    logs = folder / f"logs_{layout}"
    with serve_process(export, "mslite", "demo", cwd=REPO, extra=extra,
                       launcher=["--rank_table", table, "--log_dir", str(logs)]) as server:
        api = client(server.url)

        def complete(i):
            kwargs = dict(model="demo", prompt=PROMPTS[i % 3], max_tokens=10, temperature=0)
            if i % 2:
                return "".join(c.choices[0].text for c in api.completions.create(stream=True, **kwargs) if c.choices)
            return api.completions.create(**kwargs).choices[0].text
        with ThreadPoolExecutor(6) as pool:
            texts = list(pool.map(complete, range(12)))
        family = psutil.Process(server.pid).children(recursive=True)
    assert texts == [pipeline_texts[i % 3] for i in range(12)]
    for rank in range(1, 4 if layout == "dp2xmp2" else 2):
        steps = re.search(rf"rank {rank} ran (\d+) steps", (logs / f"rank_{rank}.log").read_text())
        assert steps and int(steps.group(1)) > 0, rank
    time.sleep(0.5)
    assert [p.pid for p in family if p.is_running() and p.status() != psutil.STATUS_ZOMBIE] == []


def test_glm_prompts_are_served_whole_with_their_row_inputs(family_export, hf_family):
    """GLM v1 (its per-row context_length and mask_position; its prompt attends both ways, so it is never
    fed in chunks, even with prefill_chunk 2): three requests, the last submitted while the first runs,
    give the independent numpy reference's greedy tokens."""
    from support.family_cases import STEPS, reference
    from lite_runtime.backends import load_session
    from lite_runtime.contract.manifest import load_manifest
    from lite_runtime.decode.engine import Engine, EngineRequest
    prompts, _, expected = reference(hf_family("glm"))
    session = load_session("ms", load_manifest(family_export("glm", "packed")))
    engine = Engine(session, prefill_chunk=2)
    got, ended = [[] for _ in prompts], []
    requests = [EngineRequest(list(p), STEPS + 1, on_finish=lambda reason: ended.append(reason)) for p in prompts]

    def on_token(i, token):
        got[i].append(token)
        if i == 0 and len(got[0]) == 3:
            engine.submit(requests[2])
    for i, request in enumerate(requests):
        request.on_token = lambda t, lp, i=i: on_token(i, t)
    engine.submit(requests[0])
    engine.submit(requests[1])
    deadline = time.time() + 120
    while len(ended) < len(prompts) and time.time() < deadline:
        time.sleep(0.01)
    engine.stop()
    assert got == [list(map(int, row)) for row in expected]
