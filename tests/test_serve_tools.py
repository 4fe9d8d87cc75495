"""Tool calls on the OpenAI chat route, through the official `openai` client: the answer read back into
`tool_calls` per template style (Hermes / Qwen2.5 tags, Llama 3.1 JSON, plain JSON), `tool_choice`
required and a named function held to one valid call, streamed as one delta at the end, a round trip
(the call and the tool's answer rendered by the template), and bad `tools` / `tool_choice` refused
naming the field. The server runs on the tiny Bloom model (a tokenizer.json, which the JSON
constraint needs; ALiBi: any context) exported with a Qwen2.5-style template that renders tools."""
import json
import os
import shutil

import jsonschema
import pytest

from support.chat_templates import QWEN25
from support.serving import client, served
from support.tiny_models import export_in_subprocess, write_yaml
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
    names = ["get_weather", "get_time"]
    assert _calls(parse('{"name": "get_time", "arguments": {"zone": "UTC"}}', "json", names)) == \
        [("get_time", {"zone": "UTC"})]
    fenced = parse('```json\n[{"name": "get_weather", "arguments": "{\\"city\\": \\"Rome\\"}"}]\n```', "json", names)
    assert _calls(fenced) == [("get_weather", {"city": "Rome"})]       # arguments given as JSON text
    other = '{"name": "Bob", "arguments": {"age": 3}}'                 # JSON, but not a call of these tools
    assert parse(other, "json", names).calls == [] and parse(other, "json", names).content == other


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
    parsed = parse(text, style, ["get_weather", "a"])
    assert parsed.calls == [] and parsed.content == text


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
    from lite_runtime.serve.chat import ChatFormat
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
    from lite_runtime.serve.protocol import ChatRequest
    from lite_runtime.serve.runs import BadRequest, ServedModel
    served = SimpleNamespace(tokenizer=SimpleNamespace(path="/export/tokenizer.model"), vocab_size=100,
                             stop_ids=frozenset({2}))     # a stand-in: what constraint() reads
    for choice in ("required", {"type": "function", "function": {"name": "get_time"}}):
        body = ChatRequest(model="m", messages=ASK, tools=TOOLS, tool_choice=choice)
        with pytest.raises(BadRequest) as e:
            ServedModel.constraint(served, body)
        assert e.value.param == "tool_choice" and "needs an export whose tokenizer is a tokenizer.json" in str(e.value)
    assert ServedModel.constraint(served, ChatRequest(model="m", messages=ASK, tools=TOOLS, tool_choice="auto")) is None
