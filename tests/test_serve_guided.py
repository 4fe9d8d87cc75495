"""vLLM's guided_json, guided_choice, stop_token_ids and truncate_prompt_tokens on the OpenAI routes,
through the official `openai` client (`extra_body`): answers that are one of the choices or valid
against the schema, answers that end where a stop id is produced; and the vLLM and OpenAI fields that
would change the answer but are not built, refused naming the field (never ignored). The server runs
the tiny Bloom model (a tokenizer.json, which the grammars need) on `ms`."""
import json
from types import SimpleNamespace

import jsonschema
import pytest

from support.http_json import post_json
from support.serving import client, served
from support.tiny_models import export_in_subprocess, write_yaml

CHOICES = ["Paris", "Rome", "New York", "C++ (3.14)", "a|b", "[x]-{y}^$~#&*?", "tab\tand\nline"]
CITY = {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Rome", "Oslo"]},
                                         "count": {"type": "integer", "minimum": 0, "maximum": 99},
                                         "sunny": {"type": "boolean"}},
        "required": ["city", "count", "sunny"], "additionalProperties": False}
ASK = [{"role": "user", "content": "Weather in Paris?"}]
SAMPLINGS = [dict(temperature=0)] + [dict(temperature=t, seed=s) for t in (0.7, 1.5) for s in (1, 2, 3)]


# -- the requests, without a server --------------------------------------------------------------
def _refusal(request_class, **fields):
    """The (field, message) of the first error of `request_class` built from `fields`."""
    from pydantic import ValidationError
    with pytest.raises(ValidationError) as e:
        request_class(**fields)
    first = e.value.errors()[0]
    return ".".join(str(p) for p in first["loc"]), first["msg"]


COMPLETION = dict(model="m", prompt="one,")
CHAT = dict(model="m", messages=ASK)
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]


@pytest.mark.fast
@pytest.mark.parametrize("route", ["completions", "chat"])
@pytest.mark.parametrize("field, value, says", [
    ("guided_choice", [], "one or more strings"),
    ("guided_choice", "Paris", "one or more strings"),
    ("guided_choice", ["Paris", 3], "entry 1 is 3, not a string"),
    ("guided_json", "{not json", "not JSON"),
    ("guided_json", "[1, 2]", "not list"),
    ("guided_json", 5, "not int"),
    ("stop_token_ids", [5, "x"], "token ids"),
    ("stop_token_ids", [True], "token ids"),
    ("stop_token_ids", 5, "token ids"),
    ("use_beam_search", True, "beam search is not supported"),
    ("length_penalty", 0.5, "beam search"),
    ("best_of", 3, "differs from n (1)"),
    ("logits_processors", ["my.module:processor"], "logits processors"),
    ("allowed_token_ids", [1, 2], "restricting the vocabulary"),
    ("bad_words", ["rain"], "banned words"),
    ("include_stop_str_in_output", True, "never part of the text"),
    ("skip_special_tokens", False, "special tokens are always left out"),
    ("prompt_logprobs", 0, "prompt's logprobs"),
    ("return_tokens_as_token_ids", True, "as their text"),
    ("return_token_ids", True, "token ids are not reported"),
    ("guided_grammar", 'root ::= "a"', "grammars are not supported"),
    ("guided_whitespace_pattern", " *", "no free whitespace"),
    ("structural_tag", '{"structures": []}', "structural tags"),
    ("structured_outputs", {"choice": ["a"]}, "send guided_json"),
    ("truncate_prompt_tokens", 0, "greater than or equal to 1"),
])
def test_fields_not_built_or_malformed_are_refused_naming_the_field(route, field, value, says):
    from lite_runtime.serve.chat_protocol import ChatRequest
    from lite_runtime.serve.protocol import CompletionRequest
    request_class, base = (CompletionRequest, COMPLETION) if route == "completions" else (ChatRequest, CHAT)
    where, message = _refusal(request_class, **base, **{field: value})
    assert where == field and says in message, (where, message)


@pytest.mark.fast
@pytest.mark.parametrize("route, fields, field, says", [
    ("chat", {"echo": True}, "echo", "prepending the last message"),
    ("chat", {"add_generation_prompt": False}, "add_generation_prompt", "generation prompt"),
    ("chat", {"continue_final_message": True}, "continue_final_message", "continuing the last message"),
    ("chat", {"chat_template": "{{ messages }}"}, "chat_template", "own chat template"),
    ("chat", {"chat_template_kwargs": {"enable_thinking": False}}, "chat_template_kwargs", "usual variables"),
    ("chat", {"documents": [{"text": "x"}]}, "documents", "documents are not rendered"),
    ("chat", {"functions": [{"name": "f"}]}, "functions", "send tools"),
    ("chat", {"function_call": "auto"}, "function_call", "send tool_choice"),
    ("chat", {"modalities": ["text", "audio"]}, "modalities", "text only"),
    ("chat", {"audio": {"voice": "alloy"}}, "audio", "text only"),
    ("chat", {"reasoning_effort": "low"}, "reasoning_effort", "not supported"),
    ("chat", {"verbosity": "low"}, "verbosity", "not supported"),
    ("chat", {"web_search_options": {}}, "web_search_options", "web search"),
    ("chat", {"add_special_tokens": True}, "add_special_tokens", "second BOS"),
    ("chat", {"tools": TOOLS, "parallel_tool_calls": False}, "parallel_tool_calls", "tool_choice auto"),
    ("chat", {"best_of": 1, "n": 2}, "best_of", "differs from n (2)"),
    ("completions", {"add_special_tokens": False}, "add_special_tokens", "send token ids"),
    ("completions", {"prompt_embeds": "AAAA"}, "prompt_embeds", "text or token ids"),
])
def test_route_fields_not_built_are_refused_naming_the_field(route, fields, field, says):
    from lite_runtime.serve.chat_protocol import ChatRequest
    from lite_runtime.serve.protocol import CompletionRequest
    request_class, base = (CompletionRequest, COMPLETION) if route == "completions" else (ChatRequest, CHAT)
    where, message = _refusal(request_class, **dict(base, **fields))
    assert where == field and says in message, (where, message)


@pytest.mark.fast
def test_fields_that_change_nothing_are_accepted_and_guides_are_read():
    """Values that leave the answer as it is pass (best_of equal to n, vLLM's defaults, the grammar
    backend's name, a single call under a forced tool choice); guided_json as JSON text is the schema."""
    from lite_runtime.serve.chat_protocol import ChatRequest
    from lite_runtime.serve.protocol import CompletionRequest
    same = dict(best_of=2, n=2, use_beam_search=False, length_penalty=1.0, skip_special_tokens=True,
                include_stop_str_in_output=False, spaces_between_special_tokens=False,
                guided_decoding_backend="xgrammar", priority=3, user="u", stream_options={"include_usage": True},
                stop_token_ids=[5, 7])
    completion = CompletionRequest(**COMPLETION, add_special_tokens=True, guided_json=json.dumps(CITY), **same)
    assert [(g.field, g.schema, g.regex) for g in completion.guides()] == [("guided_json", CITY, None)]
    assert completion.stop_token_ids == [5, 7] and completion.best_of == 2
    chat = ChatRequest(**CHAT, add_special_tokens=False, add_generation_prompt=True, modalities=["text"], tools=TOOLS,
                       tool_choice="required", parallel_tool_calls=False, guided_choice=["a", "b"], **same)
    assert [g.field for g in chat.guides()] == ["guided_choice"]


@pytest.mark.fast
def test_choices_are_matched_whole_with_their_special_characters(tmp_path):
    """guided_choice's expression, run by llguidance over a byte-level tokenizer.json: each choice's
    tokens are allowed and the answer may end after the last (EOS allowed), not before; text that an
    unescaped `|`, `.`, `+`, `*` or `[x]` would let through is no answer."""
    import numpy as np
    from tokenizers import Tokenizer
    from support.tokenizer_files import train_byte_level_json
    from lite_runtime.decode.constraints import choice_regex, json_matcher
    path = train_byte_level_json(tmp_path / "tokenizer.json")
    tokenizer = Tokenizer.from_file(path)
    vocab, eos = tokenizer.get_vocab_size(), tokenizer.token_to_id("<|endoftext|>")
    regex = choice_regex(CHOICES + [""])

    def allowed(matcher):
        return np.isfinite(matcher.mask(np.zeros((1, vocab), np.float32))[0])

    def endings(text):
        """Whether the answer may end after each of `text`'s tokens; None once one is not allowed."""
        matcher, ends = json_matcher(path, vocab, [eos], None, "guided_choice", regex), []
        for token in tokenizer.encode(text, add_special_tokens=False).ids:
            if not allowed(matcher)[token]:
                return None
            matcher.advance(token)
            ends.append(bool(allowed(matcher)[eos]))
        return ends
    assert allowed(json_matcher(path, vocab, [eos], None, "guided_choice", regex))[eos]      # the choice ""
    for choice in CHOICES:
        ends = endings(choice)
        assert ends is not None and ends[-1] and not any(ends[:-1]), (choice, ends)
    for text in ("b", "x", "Parisian", "C+ (3x14)", "CC++ (3.14)", "[x]-{y}^$~#&*??", "a|", "tab\tand\nline."):
        ends = endings(text)
        assert ends is None or not ends[-1], (text, ends)


@pytest.mark.fast
def test_two_guides_at_once_are_refused_naming_both():
    """The grammar is built in ServedModel.constraint (a stand-in model: only what it reads)."""
    from lite_runtime.serve.chat_protocol import ChatRequest
    from lite_runtime.serve.protocol import CompletionRequest
    from lite_runtime.serve.runs import BadRequest, ServedModel
    served = SimpleNamespace(tokenizer=SimpleNamespace(path="/export/tokenizer.json"), vocab_size=100,
                             stop_ids=frozenset({2}))
    schema_format = {"type": "json_schema", "json_schema": {"schema": CITY}}
    for fields, first, second in (
            ({"response_format": schema_format, "guided_json": CITY}, "response_format 'json_schema'", "guided_json"),
            ({"response_format": {"type": "json_object"}, "guided_choice": ["a"]}, "response_format 'json_object'",
             "guided_choice"),
            ({"guided_json": CITY, "guided_regex": "[0-9]+"}, "guided_json", "guided_regex"),
            ({"guided_regex": "[0-9]+", "guided_choice": ["1"]}, "guided_regex", "guided_choice")):
        with pytest.raises(BadRequest) as e:
            ServedModel.constraint(served, CompletionRequest(**COMPLETION, **fields))
        assert e.value.param == second and f"{first} and {second} both hold the answer" in str(e.value), str(e.value)
    forced = ChatRequest(**CHAT, tools=TOOLS, tool_choice="required", guided_json=CITY)
    with pytest.raises(BadRequest) as e:
        ServedModel.constraint(served, forced)
    assert e.value.param == "guided_json" and "tool_choice 'required' and guided_json" in str(e.value)
    # a sentencepiece export cannot hold an answer to choices, as it cannot to a schema
    served.tokenizer.path = "/export/tokenizer.model"
    with pytest.raises(BadRequest) as e:
        ServedModel.constraint(served, CompletionRequest(**COMPLETION, guided_choice=["a"]))
    assert e.value.param == "guided_choice" and "needs an export whose tokenizer is a tokenizer.json" in str(e.value)
    with pytest.raises(BadRequest) as e:
        ServedModel.constraint(served, CompletionRequest(**COMPLETION, guided_choice=["a"], ignore_eos=True))
    assert e.value.param == "ignore_eos" and "guided_choice ends the answer" in str(e.value)


# -- on a served export ------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def guided_export(hf_family, tmp_path_factory):
    """The tiny Bloom model (a byte-level tokenizer.json; ALiBi: any context) exported with kv_cache packed."""
    folder = tmp_path_factory.mktemp("guided_export")
    cfg = {"model": {"hf_dir": str(hf_family("bloom") / "hf")}, "seq_length": 256, "batch_size": 2,
           "kv_cache": "packed", "output_dir": str(folder / "export")}
    return export_in_subprocess(write_yaml(str(folder / "guided.yaml"), cfg))


@pytest.fixture(scope="module")
def url(guided_export):
    with served(guided_export, "ms", "tiny") as (base, _pid):
        yield base


def _complete(url, **kwargs):
    body = dict(dict(model="tiny", prompt="The weather:", max_tokens=60), **kwargs)
    return client(url).completions.create(**body)


def test_guided_choice_answers_are_one_of_the_choices(url):
    texts = set()
    for sampling in SAMPLINGS:
        answer = _complete(url, n=2, extra_body={"guided_choice": CHOICES}, **sampling)
        for choice in answer.choices:
            assert choice.text in CHOICES and choice.finish_reason == "stop", (sampling, choice)
            texts.add(choice.text)
    assert len(texts) > 1, texts          # sampling reached several choices: the grammar, not one fixed answer
    chat = client(url).chat.completions.create(model="tiny", messages=ASK, temperature=1.0, seed=4, max_tokens=60,
                                               extra_body={"guided_choice": CHOICES,
                                                           "guided_decoding_backend": "xgrammar"})
    assert chat.choices[0].message.content in CHOICES and chat.choices[0].finish_reason == "stop"
    streamed = list(_complete(url, stream=True, temperature=1.5, seed=9, extra_body={"guided_choice": CHOICES}))
    assert "".join(c.choices[0].text for c in streamed) in CHOICES and streamed[-1].choices[0].finish_reason == "stop"


def test_guided_json_answers_follow_the_schema(url):
    """As a schema object and as JSON text of one, on both routes; as response_format json_schema does."""
    for i, sampling in enumerate(SAMPLINGS):
        schema = CITY if i % 2 else json.dumps(CITY)
        answer = _complete(url, extra_body={"guided_json": schema}, **sampling).choices[0]
        assert answer.finish_reason == "stop", answer
        jsonschema.validate(json.loads(answer.text), CITY)
    chat = client(url).chat.completions.create(model="tiny", messages=ASK, temperature=1.0, seed=4, max_tokens=60,
                                               extra_body={"guided_json": CITY}).choices[0]
    jsonschema.validate(json.loads(chat.message.content), CITY)
    as_format = client(url).chat.completions.create(
        model="tiny", messages=ASK, temperature=1.0, seed=4, max_tokens=60,
        response_format={"type": "json_schema", "json_schema": {"name": "city", "schema": CITY}}).choices[0]
    assert as_format.message.content == chat.message.content          # the same path, the same answer


def test_stop_token_ids_end_the_answer_at_that_id(url):
    """An id the model greedily produces at step k (and not before): asked again with stop_token_ids
    [that id], the answer is the first k tokens' text, finish_reason stop; the id is counted (as EOS is)
    but is no part of the text, streamed or not."""
    status, generated = post_json(url + "/generate", {"inputs": "The weather:", "parameters": {
        "max_new_tokens": 16, "details": True}})
    assert status == 200, generated
    tokens = generated["details"]["tokens"]
    ids = [t["id"] for t in tokens]
    k = next((i for i in range(2, len(ids)) if ids[i] not in ids[:i] and not tokens[i]["special"]), None)
    assert k is not None, f"the greedy answer repeats its first tokens: {ids}"
    first_k = _complete(url, temperature=0, max_tokens=k).choices[0].text
    stopped = _complete(url, temperature=0, max_tokens=16, extra_body={"stop_token_ids": [ids[k]]})
    assert stopped.choices[0].text == first_k and stopped.choices[0].finish_reason == "stop", (k, stopped)
    assert stopped.usage.completion_tokens == k + 1
    chunks = list(_complete(url, temperature=0, max_tokens=16, stream=True, extra_body={"stop_token_ids": [ids[k]]}))
    assert "".join(c.choices[0].text for c in chunks) == first_k and chunks[-1].choices[0].finish_reason == "stop"
    # with ignore_eos too (it ignores the model's EOS only); an id never produced changes nothing
    also = _complete(url, temperature=0, max_tokens=16, extra_body={"stop_token_ids": [ids[k]], "ignore_eos": True})
    assert also.choices[0].text == first_k
    unused = next(i for i in range(3, 300) if i not in ids)
    whole = _complete(url, temperature=0, max_tokens=16, extra_body={"stop_token_ids": [unused]}).choices[0]
    plain = _complete(url, temperature=0, max_tokens=16).choices[0]
    assert (whole.text, whole.finish_reason) == (plain.text, plain.finish_reason)


def test_truncate_prompt_tokens_reads_the_prompts_last_tokens(url):
    status, tokenized = post_json(url + "/tokenize", {"prompt": "The weather in Paris is fine today:"})
    assert status == 200 and tokenized["count"] > 4
    last = tokenized["tokens"][-4:]
    truncated = _complete(url, prompt="The weather in Paris is fine today:", temperature=0, max_tokens=6,
                          extra_body={"truncate_prompt_tokens": 4})
    assert truncated.usage.prompt_tokens == 4
    assert truncated.choices[0].text == _complete(url, prompt=last, temperature=0, max_tokens=6).choices[0].text


@pytest.mark.parametrize("route, fields, param, says", [
    ("completions", {"guided_choice": []}, "guided_choice", "one or more strings"),
    ("chat", {"guided_choice": ["Paris", None]}, "guided_choice", "entry 1 is None"),
    ("completions", {"guided_json": "[1]"}, "guided_json", "a JSON schema is an object"),
    ("completions", {"guided_json": {"type": "strng"}}, "guided_json", "guided_json"),
    ("completions", {"guided_json": CITY, "response_format": {"type": "json_object"}}, "guided_json",
     "response_format 'json_object' and guided_json both hold the answer"),
    ("chat", {"guided_choice": ["a"], "guided_regex": "[ab]"}, "guided_choice",
     "guided_regex and guided_choice both hold the answer"),
    ("completions", {"stop_token_ids": [10 ** 6]}, "stop_token_ids", "token id 1000000 is outside the vocabulary"),
    ("chat", {"stop_token_ids": [-1]}, "stop_token_ids", "token id -1 is outside the vocabulary"),
    ("completions", {"use_beam_search": True}, "use_beam_search", "use_beam_search"),
    ("chat", {"best_of": 2}, "best_of", "best_of"),
    ("chat", {"logits_processors": ["m:f"]}, "logits_processors", "logits_processors"),
    ("completions", {"guided_grammar": 'root ::= "a"'}, "guided_grammar", "guided_grammar"),
])
def test_refusals_are_400s_naming_the_field(url, guided_export, route, fields, param, says):
    from lite_runtime.contract.manifest import load_manifest
    import openai
    c = client(url)
    with pytest.raises(openai.BadRequestError) as e:
        if route == "chat":
            c.chat.completions.create(model="tiny", messages=ASK, max_tokens=4, extra_body=fields)
        else:
            c.completions.create(model="tiny", prompt="The weather:", max_tokens=4, extra_body=fields)
    message = e.value.body["message"]
    assert e.value.status_code == 400 and e.value.param == param and says in message, e.value.body
    if param == "stop_token_ids":
        vocab = load_manifest(guided_export).vocab_size
        assert f"vocabulary of {vocab} tokens" in message, message
