"""Tool calls on the OpenAI chat route, through the official `openai` client: the answer read back into
`tool_calls` per template style (Hermes / Qwen2.5 tags, Llama 3.1 JSON) and as a whole-answer JSON call
in any style (bare or fenced, valid against the tool's parameters), `tool_choice` required and a named
function held to one valid call, streamed with the text that may be a call held back and the calls as
one delta at the end, a round trip (the call and the tool's answer rendered by the template), `/tokenize`
counting the tools as the chat completion does, and bad `tools` / `tool_choice` refused naming the
field. The server runs on the tiny Bloom model (a tokenizer.json, which the JSON constraint needs;
ALiBi: any context) exported with a Qwen2.5-style template that renders tools; the answers a model
cannot be made to write go through the same routes with a stand-in engine that answers a given text."""
import json
import os
import shutil

from types import SimpleNamespace

import jsonschema
import pytest

from support.chat_templates import QWEN25
from support.serving import client, served
from support.tiny_models import export_in_subprocess, write_yaml
from lite_runtime.decode.scheduler import EngineLimits
from lite_runtime.tokenizers import export_tokenizer

WEATHER = {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Rome", "Oslo"]},
                                            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
           "required": ["city", "unit"], "additionalProperties": False}
TIME = {"type": "object", "properties": {"zone": {"type": "string", "maxLength": 8},
                                         "hour": {"type": "integer", "minimum": 0, "maximum": 23}},
        "required": ["zone", "hour"], "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather of a city",
                                           "parameters": WEATHER}},
         {"type": "function", "function": {"name": "get_time", "description": "Time in a zone", "parameters": TIME}}]
PARAMETERS = {"get_weather": WEATHER, "get_time": TIME}
ASK = [{"role": "user", "content": "Weather in Paris?"}]


# -- (a) the parsers, on texts ---------------------------------------------------------------------
def _calls(parsed):
    return [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in parsed.calls]


@pytest.mark.fast
def test_hermes_calls_are_read_with_the_text_before_them_as_content():
    from lite_runtime.serve.tool_calls import parse
    one = parse('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>', "hermes")
    assert one.content is None and _calls(one) == [("get_weather", {"city": "Paris"})]
    call = one.calls[0]
    assert call["type"] == "function" and call["id"].startswith("call_") and len(call["id"]) > 10
    assert isinstance(call["function"]["arguments"], str)          # JSON text, as OpenAI sends it
    two = parse('Let me look.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"}}\n</tool_call>\n'
                '<tool_call>\n{"name": "get_time", "arguments": {"zone": "CET"}}\n</tool_call>', "hermes")
    assert two.content == "Let me look."
    assert _calls(two) == [("get_weather", {"city": "Rome"}), ("get_time", {"zone": "CET"})]
    assert two.calls[0]["id"] != two.calls[1]["id"]
    unclosed = parse('<tool_call>\n{"name": "get_time", "arguments": {}}', "hermes")      # cut before its end tag
    assert _calls(unclosed) == [("get_time", {})]


@pytest.mark.fast
def test_llama3_json_calls_are_read_with_or_without_the_python_tag():
    from lite_runtime.serve.tool_calls import parse
    plain = parse('{"name": "get_weather", "parameters": {"city": "Oslo"}}', "llama3")
    assert plain.content is None and _calls(plain) == [("get_weather", {"city": "Oslo"})]
    tagged = parse('<|python_tag|>{"name": "get_time", "parameters": {"zone": "UTC"}}; '
                   '{"name": "get_weather", "parameters": {"city": "Rome"}}', "llama3")
    assert _calls(tagged) == [("get_time", {"zone": "UTC"}), ("get_weather", {"city": "Rome"})]
    assert _calls(parse('{"name": "get_time", "arguments": {"zone": "UTC"}}', "llama3")) == [("get_time", {"zone": "UTC"})]


@pytest.mark.fast
def test_plain_json_calls_need_a_name_among_the_tools():
    from lite_runtime.serve.tool_calls import parse
    assert _calls(parse('{"name": "get_time", "arguments": {"zone": "UTC", "hour": 9}}', "json", TOOLS)) == \
        [("get_time", {"zone": "UTC", "hour": 9})]
    fenced = parse('```json\n[{"name": "get_weather", "arguments": "{\\"city\\": \\"Rome\\", \\"unit\\": '
                   '\\"celsius\\"}"}]\n```', "json", TOOLS)
    assert _calls(fenced) == [("get_weather", {"city": "Rome", "unit": "celsius"})]    # arguments as JSON text
    other = '{"name": "Bob", "arguments": {"age": 3}}'                 # JSON, but not a call of these tools
    assert parse(other, "json", TOOLS).calls == [] and parse(other, "json", TOOLS).content == other


CODER_CALL = '{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}'   # Qwen2.5-Coder's answer


@pytest.mark.fast
@pytest.mark.parametrize("style", ["hermes", "json", "llama3"])
@pytest.mark.parametrize("text", [
    CODER_CALL,
    f"\n {CODER_CALL}\n\n",
    f"```json\n{CODER_CALL}\n```",
    f"```\n{CODER_CALL}\n```\n",
    '{"function": "get_weather", "parameters": {"city": "Paris", "unit": "celsius"}}',
    '{"name": "get_weather", "arguments": "{\\"city\\": \\"Paris\\", \\"unit\\": \\"celsius\\"}"}',
])
def test_a_whole_answer_json_call_of_a_tool_is_read_in_every_style(text, style):
    """Qwen2.5-Coder-0.5B-Instruct answers a call without its template's <tool_call> tags (so does
    transformers' greedy answer): the whole answer, one JSON object naming a tool with valid arguments."""
    from lite_runtime.serve.tool_calls import parse
    parsed = parse(text, style, TOOLS)
    assert parsed.content is None and _calls(parsed) == [("get_weather", {"city": "Paris", "unit": "celsius"})]


@pytest.mark.fast
@pytest.mark.parametrize("style", ["hermes", "json"])
@pytest.mark.parametrize("text", [
    '{"name": "get_news", "arguments": {"city": "Paris"}}',                                  # not a tool
    '{"name": "get_weather", "arguments": {"city": "Paris"}}',                               # unit missing
    '{"name": "get_weather", "arguments": {"city": "Lyon", "unit": "celsius"}}',             # not in the enum
    '{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius", "day": 1}}',  # a property too many
    '{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}, "id": "x"}',  # a key too many
    '{"name": "get_weather", "function": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}',
    '{"type": "function", "function": {"name": "get_weather", "parameters": {"city": "Paris", "unit": "celsius"}}}',
    '{"name": ["get_weather"], "arguments": {"city": "Paris", "unit": "celsius"}}',
    f"Here it is: {CODER_CALL}",
    f"{CODER_CALL}\nThat is the call.",
    f"```python\n{CODER_CALL}\n```",
    f"```json\n{CODER_CALL}\n```\n```json\n{CODER_CALL}\n```",
    '{"city": "Paris", "unit": "celsius"}',
    "[]",
])
def test_json_that_is_not_a_valid_call_of_the_tools_stays_the_content(text, style):
    from lite_runtime.serve.tool_calls import parse
    parsed = parse(text, style, TOOLS)
    assert parsed.calls == [] and parsed.content == text


@pytest.mark.fast
def test_a_tool_without_parameters_is_called_with_no_arguments():
    from lite_runtime.serve.tool_calls import parse
    tools = [{"type": "function", "function": {"name": "now"}}]
    assert _calls(parse('{"name": "now"}', "json", tools)) == [("now", {})]
    assert _calls(parse('{"name": "now", "arguments": {}}', "json", tools)) == [("now", {})]
    assert parse('{"name": "now", "arguments": {"zone": "UTC"}}', "json", tools).calls == []


@pytest.mark.fast
@pytest.mark.parametrize("text, style", [
    ('<tool_call>\n{"name": "get_weather", "arguments": {"city": }\n</tool_call>', "hermes"),
    ('Sure: <tool_call>{"arguments": {}}</tool_call>', "hermes"),                      # no name
    ('<tool_call>{"name": "a", "arguments": {}}</tool_call><tool_call>[1]</tool_call>', "hermes"),   # one bad: none
    ('{"name": "get_weather", "parameters": {"city": "Oslo"}', "llama3"),
    ('{"name": "get_weather", "parameters": {"city": "Oslo"}} and more', "llama3"),
    ('The answer is {"name": "get_weather"}', "llama3"),
    ('{"name": "get_weather", "arguments": [1, 2]}', "json"),
    ("It is sunny in Paris.", "json"),
])
def test_text_that_does_not_parse_is_no_call_and_stays_the_content(text, style):
    from lite_runtime.serve.tool_calls import parse
    parsed = parse(text, style, TOOLS + [{"type": "function", "function": {"name": "a"}}])
    assert parsed.calls == [] and parsed.content == text


def _streamed(text, style, size=1):
    """What each piece of `size` characters released, and (the content left, the calls) at the end."""
    from lite_runtime.serve.tool_calls import StreamedAnswer
    answer = StreamedAnswer(style, TOOLS)
    released = [answer.add(text[i:i + size]) for i in range(0, len(text), size)]
    return released, answer.finish()


HERMES_ANSWER = ('Let me look.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome", "unit": '
                 '"celsius"}}\n</tool_call>')


@pytest.mark.fast
@pytest.mark.parametrize("style", ["hermes", "json"])
@pytest.mark.parametrize("text", [CODER_CALL, f"\n{CODER_CALL}\n", f"```json\n{CODER_CALL}\n```"])
def test_a_streamed_whole_answer_call_is_never_released_as_content(text, style):
    for size in (1, 5):
        released, (left, calls) = _streamed(text, style, size)
        assert not any(released) and left is None, released
        assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] == \
            [("get_weather", {"city": "Paris", "unit": "celsius"})]


@pytest.mark.fast
def test_text_that_cannot_be_a_call_is_released_as_it_comes():
    text = "It is sunny in Paris, 21 degrees."
    released, (left, calls) = _streamed(text, "json")
    assert released == list(text) and left is None and calls == []
    released, (left, calls) = _streamed(text, "hermes")     # whitespace waits for what follows (a tag?)
    assert ["".join(released[:i]) for i in range(1, len(text) + 1)] == [text[:i].rstrip() for i in range(1, len(text) + 1)]
    assert left is None and calls == []


@pytest.mark.fast
@pytest.mark.parametrize("style", ["hermes", "json"])
@pytest.mark.parametrize("text, known", [
    ('{"city": "Paris", "unit": "celsius"}', '{"city":'),          # no call has this key
    (CODER_CALL + " is the call.", CODER_CALL + " i"),               # text after the JSON
    ("```python\nprint(1)\n```", "```p"),                            # a fence of another language
    ("```json\n[1, 2]\n```", "```json\n[1"),                          # a list of something else
    ("[Paris](https://en.wikipedia.org/wiki/Paris)", "[P"),
    ("{name: 1}", "{n"),                                               # not JSON
    ("Here: " + CODER_CALL, "H"),
])
def test_json_is_released_as_soon_as_it_cannot_be_a_call(text, known, style):
    released, (left, calls) = _streamed(text, style)
    assert "".join(released[:len(known) - 1]) == "" and "".join(released[:len(known)]) == known
    assert "".join(released) + (left or "") == text and calls == []


@pytest.mark.fast
def test_json_that_might_be_a_call_until_its_end_is_released_at_the_end():
    for text in ('{"name": "get_weather", "arguments": {"city": }}', '{"name": "get_news", "arguments": {}}',
                 '```json\n[{"name": "get_news"}]\n```'):
        released, (left, calls) = _streamed(text, "hermes")
        assert not any(released) and left == text and calls == []


@pytest.mark.fast
def test_hermes_text_before_a_tag_is_released_and_the_tag_held():
    for size in (1, 3, 8):
        released, (left, calls) = _streamed(HERMES_ANSWER, "hermes", size)
        assert "".join(released) == "Let me look." and left is None and len(calls) == 1
    released, (left, calls) = _streamed("It is < 3 degrees <tool", "hermes")     # a tag begun, and cut
    assert "".join(released) == "It is < 3 degrees" and left == " <tool" and calls == []
    broken = 'Sure. <tool_call>{"arguments": {}}</tool_call>'                      # no name: no call
    released, (left, calls) = _streamed(broken, "hermes")
    assert "".join(released) == "Sure." and "".join(released) + left == broken and calls == []


@pytest.mark.fast
@pytest.mark.parametrize("style", ["hermes", "json", "llama3"])
def test_a_streamed_answer_is_the_whole_answer_read_by_parse(style):
    """Sent pieces and what is left make the message `parse` reads from the whole text, however split."""
    from lite_runtime.serve.tool_calls import parse
    texts = [CODER_CALL, f"```json\n{CODER_CALL}\n```", HERMES_ANSWER, "It is sunny.", "  {} and more",
             '<|python_tag|>{"name": "get_time", "parameters": {"zone": "UTC"}}', "```", "`x`", "<tool_call>",
             '[{"name": "get_time", "arguments": {"zone": "UTC", "hour": 1}}]']
    for text in texts:
        whole = parse(text, style, TOOLS)
        for size in (1, 2, 3, 7):
            released, (left, calls) = _streamed(text, style, size)
            assert "".join(released) + (left or "") == (whole.content or ""), (text, size)
            assert [c["function"] for c in calls] == [c["function"] for c in whole.calls], (text, size)


@pytest.mark.fast
def test_the_style_is_chosen_from_the_template():
    from lite_runtime.serve.tool_calls import style_of
    assert style_of(QWEN25) == "hermes"
    llama31 = ('<|start_header_id|>system<|end_header_id|>Respond in the format {"name": function name, '
               '"parameters": dictionary of argument name and its value}.{% if builtin_tools %}<|python_tag|>{% endif %}')
    assert style_of(llama31) == "llama3"
    assert style_of("{% for m in messages %}{{ m.content }}{% endfor %}") == "json" and style_of(None) == "json"


# -- (b)-(d) on a served export --------------------------------------------------------------------
@pytest.fixture(scope="module")
def tool_export(hf_family, tmp_path_factory):
    """The tiny Bloom model exported (kv_cache packed, `ms`, a context of 1024: the template writes the
    tools' JSON) with its tokenizer in a folder of its own holding a Qwen2.5-style chat_template.jinja,
    which the export copies beside its tokenizer."""
    hf = hf_family("bloom") / "hf"
    folder = tmp_path_factory.mktemp("tool_export")
    tokenizer = folder / "tokenizer"
    tokenizer.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(hf / name, tokenizer / name)
    (tokenizer / "chat_template.jinja").write_text(QWEN25, encoding="utf-8")
    cfg = {"model": {"hf_dir": str(hf), "tokenizer": str(tokenizer / "tokenizer.json")}, "seq_length": 1024,
           "batch_size": 2, "kv_cache": "packed", "output_dir": str(folder / "export")}
    return export_in_subprocess(write_yaml(str(folder / "tools.yaml"), cfg))


@pytest.fixture(scope="module")
def tool_server(tool_export):
    with served(tool_export, "ms", "tiny") as (url, _pid):
        yield url


def _ask(url, **kwargs):
    return client(url).chat.completions.create(**dict(dict(model="tiny", temperature=0, max_tokens=100), **kwargs))


def _valid_call(call, name=None):
    assert call.type == "function" and call.id.startswith("call_")
    assert call.function.name in PARAMETERS and (name is None or call.function.name == name)
    jsonschema.validate(json.loads(call.function.arguments), PARAMETERS[call.function.name])


def test_required_and_named_tool_choices_answer_one_valid_call(tool_server):
    for choice, name in (("required", None), ({"type": "function", "function": {"name": "get_time"}}, "get_time"),
                         ({"type": "function", "function": {"name": "get_weather"}}, "get_weather")):
        answer = _ask(tool_server, messages=ASK, tools=TOOLS, tool_choice=choice).choices[0]
        assert answer.finish_reason == "tool_calls", answer
        assert answer.message.content is None and len(answer.message.tool_calls) == 1, answer
        _valid_call(answer.message.tool_calls[0], name)
    sampled = _ask(tool_server, messages=ASK, tools=TOOLS, tool_choice="required", n=2, temperature=1.0, seed=5)
    for answer in sampled.choices:
        assert answer.finish_reason == "tool_calls" and len(answer.message.tool_calls) == 1
        _valid_call(answer.message.tool_calls[0])


def test_a_streamed_tool_call_comes_as_one_delta_at_the_end(tool_server):
    named = {"type": "function", "function": {"name": "get_weather"}}
    whole = _ask(tool_server, messages=ASK, tools=TOOLS, tool_choice=named).choices[0]
    chunks = list(_ask(tool_server, messages=ASK, tools=TOOLS, tool_choice=named, stream=True))
    deltas = [ch.choices[0].delta for ch in chunks if ch.choices]
    with_calls = [d for d in deltas if d.tool_calls]
    assert len(with_calls) == 1 and not any(d.content for d in deltas), deltas
    (call,) = with_calls[0].tool_calls
    assert call.index == 0
    _valid_call(call, "get_weather")
    assert call.function.arguments == whole.message.tool_calls[0].function.arguments      # greedy: the same call
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_tools_are_rendered_with_every_choice_and_none_reads_no_calls(tool_server):
    without = _ask(tool_server, messages=ASK, max_tokens=2)
    for choice in ("none", "auto", None):
        kwargs = {} if choice is None else {"tool_choice": choice}
        answer = _ask(tool_server, messages=ASK, tools=TOOLS, max_tokens=2, **kwargs)
        assert answer.usage.prompt_tokens > without.usage.prompt_tokens + 50, choice      # the tools' JSON
        assert answer.choices[0].finish_reason == "length" and answer.choices[0].message.tool_calls is None


def test_a_tool_call_round_trip_renders_the_call_and_the_tools_answer(tool_server, tool_export):
    from lite_runtime.contract.manifest import load_manifest
    from lite_runtime.tokenizers.chat_format import ChatFormat
    first = _ask(tool_server, messages=ASK, tools=TOOLS,
                 tool_choice={"type": "function", "function": {"name": "get_weather"}}).choices[0].message
    call = first.tool_calls[0]
    result = '{"celsius": 21, "sky": "clear"}'
    messages = ASK + [first.model_dump(exclude_none=True),
                      {"role": "tool", "tool_call_id": call.id, "content": result}]
    answer = _ask(tool_server, messages=messages, tools=TOOLS, max_tokens=8)
    assert answer.choices[0].message.role == "assistant" and answer.choices[0].finish_reason in ("stop", "length")
    # the prompt the server ran is the template's rendering of the call and of the tool's answer
    manifest = load_manifest(tool_export)
    chat = ChatFormat(manifest.family, tool_export, export_tokenizer(manifest))
    sent = [ASK[0], {"role": "assistant", "content": None,
                     "tool_calls": [{"id": call.id, "type": "function",
                                     "function": {"name": "get_weather", "arguments": call.function.arguments}}]},
            {"role": "tool", "tool_call_id": call.id, "content": result}]
    rendered = chat.render(sent, TOOLS)
    assert f"<tool_response>\n{result}\n</tool_response>" in rendered
    assert '<tool_call>\n{"name": "get_weather", "arguments": ' in rendered and "<tools>" in rendered
    assert answer.usage.prompt_tokens == len(chat.encode(sent, TOOLS))


def test_tokenize_counts_a_chats_tools_as_its_completion_and_transformers(tool_server, tool_export):
    """vLLM's /tokenize with `messages` and `tools`: the prompt the chat completion runs, and the ids
    of transformers' apply_chat_template on the tokenizer folder the export was made from."""
    import urllib.request
    from transformers import AutoTokenizer
    request = urllib.request.Request(tool_server + "/tokenize", json.dumps({"model": "tiny", "messages": ASK,
                                                                            "tools": TOOLS}).encode(),
                                     {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as r:
        counted = json.loads(r.read())
    completion = _ask(tool_server, messages=ASK, tools=TOOLS, max_tokens=1)
    assert counted["count"] == len(counted["tokens"]) == completion.usage.prompt_tokens
    reference = AutoTokenizer.from_pretrained(os.path.join(os.path.dirname(tool_export), "tokenizer"))
    expected = reference.apply_chat_template(ASK, tools=TOOLS, add_generation_prompt=True, tokenize=True)
    assert counted["tokens"] == list(expected["input_ids"] if hasattr(expected, "keys") else expected)


@pytest.mark.parametrize("fields, param, says", [
    ({"tools": [{"type": "function", "function": {"description": "no name"}}]}, "tools.0.function.name",
     "Field required"),
    ({"tools": [TOOLS[0], {"type": "retrieval", "function": {"name": "x"}}]}, "tools.1.type", "'function'"),
    ({"tools": [{"type": "function", "function": {"name": "get weather"}}]}, "tools.0.function.name",
     "got 'get weather'"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": "none"}}]},
     "tools.0.function.parameters", "valid dictionary"),
    ({"tools": [TOOLS[0], TOOLS[0]]}, "tools", "'get_weather' is given to more than one tool"),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "get_news"}}}, "tool_choice",
     "function 'get_news' is not among the request's tools; tools: get_weather, get_time"),
    ({"tools": TOOLS, "tool_choice": "always"}, "tool_choice", "allowed: none, auto, required"),
    ({"tool_choice": "required"}, "tool_choice", "needs tools"),
    ({"tools": TOOLS, "tool_choice": "required", "response_format": {"type": "json_object"}}, "tool_choice",
     "send one of them"),
    ({"tools": TOOLS, "tool_choice": "required", "extra_body": {"ignore_eos": True}}, "ignore_eos", "without ignore_eos"),
])
def test_bad_tools_and_tool_choices_are_refused_naming_the_field(tool_server, fields, param, says):
    import openai
    with pytest.raises(openai.BadRequestError) as e:
        client(tool_server).chat.completions.create(model="tiny", messages=ASK, **fields)
    assert e.value.param == param and says in e.value.body["message"], e.value.body


def test_completions_refuse_tools_and_check_their_response_format(tool_server):
    import openai
    c = client(tool_server)
    with pytest.raises(openai.BadRequestError) as e:
        c.completions.create(model="tiny", prompt="one,", extra_body={"tools": TOOLS})
    assert e.value.param == "tools" and "/v1/chat/completions" in e.value.body["message"]
    with pytest.raises(openai.BadRequestError) as e:
        c.completions.create(model="tiny", prompt="one,", extra_body={"response_format": {"type": "xml"}})
    assert e.value.param == "response_format"


def test_auto_reads_a_plain_json_call_where_the_template_teaches_no_tags(tool_export, tmp_path):
    """The same export with a template that shows the tools but no <tool_call> tags: the answer is read
    as plain JSON (here held to the call's shape by response_format, as a model's own answer would be)."""
    plain = str(tmp_path / "plain")
    shutil.copytree(tool_export, plain)
    with open(os.path.join(plain, "chat_template.jinja"), "w", encoding="utf-8") as f:
        f.write("{% if tools %}Tools: {{ tools | tojson }}\n{% endif %}{% for m in messages %}"
                "{{ m.role }}: {{ m.content }}\n{% endfor %}assistant: ")
    schema = {"type": "object", "properties": {"name": {"const": "get_weather"}, "arguments": WEATHER},
              "required": ["name", "arguments"], "additionalProperties": False}
    shape = {"type": "json_schema", "json_schema": {"name": "call", "schema": schema}}
    with served(plain, "ms", "tiny") as (url, _pid):
        answer = _ask(url, messages=ASK, tools=TOOLS, response_format=shape).choices[0]
        assert answer.finish_reason == "tool_calls" and answer.message.content is None, answer
        (call,) = answer.message.tool_calls
        _valid_call(call, "get_weather")
        text = _ask(url, messages=ASK, tools=TOOLS, tool_choice="none", response_format=shape).choices[0]
        assert text.finish_reason == "stop" and text.message.tool_calls is None      # none: not read
        assert json.loads(text.message.content)["arguments"] == json.loads(call.function.arguments)


@pytest.mark.fast
def test_a_forced_call_needs_a_tokenizer_the_constraint_reads():
    """A sentencepiece tokenizer: required / named are refused as response_format is; auto (nothing to
    hold the answer to) is not."""
    from types import SimpleNamespace
    from lite_runtime.serve.chat_protocol import ChatRequest
    from lite_runtime.serve.runs import BadRequest, ServedModel
    served = SimpleNamespace(tokenizer=SimpleNamespace(path="/export/tokenizer.model"), vocab_size=100,
                             stop_ids=frozenset({2}))     # a stand-in: what constraint() reads
    for choice in ("required", {"type": "function", "function": {"name": "get_time"}}):
        body = ChatRequest(model="m", messages=ASK, tools=TOOLS, tool_choice=choice)
        with pytest.raises(BadRequest) as e:
            ServedModel.constraint(served, body)
        assert e.value.param == "tool_choice" and "needs an export whose tokenizer is a tokenizer.json" in str(e.value)
    assert ServedModel.constraint(served, ChatRequest(model="m", messages=ASK, tools=TOOLS, tool_choice="auto")) is None


@pytest.mark.fast
@pytest.mark.parametrize("choice", [None, "auto", "none", "required"])
def test_every_tools_parameters_must_be_a_json_schema_whatever_the_tool_choice(choice):
    from pydantic import ValidationError
    from lite_runtime.serve.chat_protocol import ChatRequest
    bad = {"type": "function", "function": {"name": "get_news", "parameters": {
        "type": "object", "properties": {"topic": {"type": "strng"}}}}}
    with pytest.raises(ValidationError) as e:
        ChatRequest(model="m", messages=ASK, tools=[TOOLS[0], bad], tool_choice=choice)
    (error,) = e.value.errors()
    assert error["loc"] == ("tools", 1, "function", "parameters")
    assert "the parameters of function 'get_news' are not a valid JSON schema: 'strng' is not valid under any of " \
           "the given schemas (at properties.topic.type)" in error["msg"]


# -- (e) the routes, with a stand-in engine that answers a given text --------------------------------
class AnsweringEngine:
    """A stand-in for the engine (no model, no graph): every request is answered `answer`, its tokens
    handed to the server's callbacks as the engine hands a step's, then finished with `stop`."""

    def __init__(self, manifest, tokenizer):
        self.session = SimpleNamespace(manifest=manifest)
        self.limits = EngineLimits(1, manifest.seq_length, False, None, 0, False)
        self.tokenizer, self.answer = tokenizer, ""
        self.waiting = []
        self.replicas = [self]
        self.deliver = None             # set by ServedModel

    def submit(self, request):
        ids = self.tokenizer.encode(self.answer, add_special_tokens=False)
        self.deliver([(request.on_token, (t, None)) for t in ids] + [(request.on_finish, ("stop",))])

    def cancel(self, request):
        pass

    def busy_rows(self):
        return 0


@pytest.fixture(scope="module")
def coder(tmp_path_factory):
    """The app on the stand-in engine, as a Qwen2.5 model is served: a byte-level tokenizer.json with
    ChatML's tokens and the Qwen2.5-style template (tool calls taught as <tool_call> tags)."""
    from support.tokenizer_files import HF_SPECIALS, train_byte_level_json
    from lite_runtime.serve.app import create_app
    from lite_runtime.serve.metrics import Metrics
    from lite_runtime.serve.runs import ServedModel
    from lite_runtime.tokenizers import load_tokenizer
    folder = tmp_path_factory.mktemp("coder")
    path = train_byte_level_json(folder / "tokenizer.json", None)
    (folder / "chat_template.jinja").write_text(QWEN25, encoding="utf-8")
    eos = HF_SPECIALS.index("<|im_end|>")
    tokenizer = load_tokenizer(path, eos_token_id=eos)
    manifest = SimpleNamespace(family="qwen", root=str(folder), adapters=[], eos_token_id=[eos], seq_length=4096,
                               vocab_size=tokenizer.vocab_size)
    engine = AnsweringEngine(manifest, tokenizer)
    served = ServedModel(engine, tokenizer, "coder", Metrics())
    assert served.tool_style == "hermes"
    return SimpleNamespace(app=create_app(served), engine=engine, path=path)


def _through(app, call):
    """`call(client)` with the official async client on `app` in this process (no socket)."""
    import asyncio
    import httpx2
    from openai import AsyncOpenAI

    async def run():
        async with httpx2.AsyncClient(transport=httpx2.ASGITransport(app=app), base_url="http://coder") as http:
            return await call(AsyncOpenAI(base_url="http://coder/v1", api_key="unused", max_retries=0,
                                          http_client=http))
    return asyncio.run(run())


def _answered(coder, answer, stream=False, **kwargs):
    """The stand-in's `answer` as the chat route returns it: the whole choice, or the stream's chunks."""
    coder.engine.answer = answer
    kwargs = dict(dict(model="coder", messages=ASK, tools=TOOLS, temperature=0), **kwargs)

    async def call(c):
        if not stream:
            return (await c.chat.completions.create(**kwargs)).choices[0]
        return [chunk async for chunk in await c.chat.completions.create(stream=True, **kwargs)]
    return _through(coder.app, call)


def _stream_parts(chunks):
    """(the content deltas, the tool-call deltas, the finish reason) of a streamed choice."""
    deltas = [ch.choices[0].delta for ch in chunks if ch.choices]
    contents = [d.content for d in deltas if d.content]
    calls = [call for d in deltas for call in d.tool_calls or ()]
    return contents, calls, chunks[-1].choices[0].finish_reason


@pytest.mark.fast
@pytest.mark.parametrize("answer", [CODER_CALL, f"```json\n{CODER_CALL}\n```"])
def test_qwen25_coders_untagged_json_call_is_answered_as_a_call(coder, answer):
    whole = _answered(coder, answer)
    assert whole.finish_reason == "tool_calls" and whole.message.content is None, whole
    (call,) = whole.message.tool_calls
    _valid_call(call, "get_weather")
    assert json.loads(call.function.arguments) == {"city": "Paris", "unit": "celsius"}
    contents, calls, reason = _stream_parts(_answered(coder, answer, stream=True))
    assert contents == [] and reason == "tool_calls"          # no JSON went out as content first
    (streamed,) = calls
    assert streamed.index == 0 and streamed.function.arguments == call.function.arguments
    _valid_call(streamed, "get_weather")


@pytest.mark.fast
def test_answers_that_are_not_calls_stay_content_and_text_streams_as_it_comes(coder):
    not_a_call = '{"name": "get_weather", "arguments": {"city": "Lyon", "unit": "celsius"}}'   # Lyon: not allowed
    for answer in (not_a_call, f"```json\n{not_a_call}\n```", "It is sunny in Paris, 21 degrees."):
        whole = _answered(coder, answer)
        assert whole.finish_reason == "stop" and whole.message.content == answer and whole.message.tool_calls is None
        contents, calls, reason = _stream_parts(_answered(coder, answer, stream=True))
        assert "".join(contents) == answer and calls == [] and reason == "stop"
        if not answer.startswith(("{", "`")):
            assert len(contents) > 5, contents          # streamed token by token, not held to the end
    none = _answered(coder, CODER_CALL, tool_choice="none")        # none: the answer is not read for calls
    assert none.message.content == CODER_CALL and none.finish_reason == "stop"


@pytest.mark.fast
def test_a_tagged_call_after_text_streams_the_text_and_then_the_call(coder):
    whole = _answered(coder, HERMES_ANSWER)
    assert whole.finish_reason == "tool_calls" and whole.message.content == "Let me look."
    contents, calls, reason = _stream_parts(_answered(coder, HERMES_ANSWER, stream=True))
    assert "".join(contents) == "Let me look." and len(contents) > 1 and reason == "tool_calls"
    assert [c.function.name for c in calls] == ["get_weather"]


@pytest.mark.fast
def test_a_bad_parameters_schema_is_refused_under_auto(coder):
    import openai
    bad = {"type": "function", "function": {"name": "get_news", "parameters": {"type": "object", "required": "topic"}}}
    with pytest.raises(openai.BadRequestError) as e:
        _answered(coder, "x", tools=[TOOLS[0], bad])
    assert e.value.param == "tools.1.function.parameters"
    assert "the parameters of function 'get_news' are not a valid JSON schema: 'topic' is not of type 'array' " \
           "(at required)" in e.value.body["message"]


def _post(app, path, body):
    """(status, JSON answer) of a POST to `app` in this process."""
    import asyncio
    import httpx2

    async def run():
        async with httpx2.AsyncClient(transport=httpx2.ASGITransport(app=app), base_url="http://coder") as http:
            response = await http.post(path, json=body)
            return response.status_code, response.json()
    return asyncio.run(run())


@pytest.mark.fast
def test_tokenize_counts_the_tools_as_the_chat_completion_and_transformers(coder):
    from transformers import PreTrainedTokenizerFast
    coder.engine.answer = "It is sunny."
    status, completion = _post(coder.app, "/v1/chat/completions", {"model": "coder", "messages": ASK, "tools": TOOLS})
    assert status == 200, completion
    status, counted = _post(coder.app, "/tokenize", {"model": "coder", "messages": ASK, "tools": TOOLS})
    assert status == 200 and counted["count"] == len(counted["tokens"]) == completion["usage"]["prompt_tokens"]
    reference = PreTrainedTokenizerFast(tokenizer_file=coder.path, eos_token="<|im_end|>")
    reference.chat_template = QWEN25
    expected = reference.apply_chat_template(ASK, tools=TOOLS, add_generation_prompt=True, tokenize=True)
    assert counted["tokens"] == list(expected["input_ids"] if hasattr(expected, "keys") else expected)
    status, without = _post(coder.app, "/tokenize", {"model": "coder", "messages": ASK})
    assert without["count"] < counted["count"] - 50              # the tools' JSON
    status, refused = _post(coder.app, "/tokenize", {"prompt": "Weather?", "tools": TOOLS})
    assert status == 400 and "send them with messages" in refused["error"]["message"], refused
