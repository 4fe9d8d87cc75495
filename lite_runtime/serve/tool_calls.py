"""Tool calls in a chat's answer: the model's finished text read back into OpenAI's `tool_calls`, in the
style its chat template taught it (as vLLM's tool parsers read them), the streamed text held back while
it may still be a call (`StreamedAnswer`), and the JSON schema that makes an answer exactly one call
(`tool_choice` required or a named function, held by the JSON constraint).

Styles:
- `hermes` (Hermes, Qwen2.5): `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, one or
  several; the text before the first is the answer's content.
- `llama3` (Llama 3.1's JSON tool calling): the whole answer is `{"name": ..., "parameters": {...}}`,
  optionally after `<|python_tag|>`, several separated by `;`.
- `json`: none of the above.
In every style, an answer that is not a call of its own style is also read as a whole-answer JSON call
(as llama.cpp's generic parser does; Qwen2.5-Coder answers so without its template's tags): the whole
answer is a call object or a list of them, bare or in one ```json (or ```) fence. Since any JSON answer
could look like one, an object counts only when it has nothing but the name (`name` or `function`) and
the arguments (`arguments` or `parameters`: an object, or JSON text of one; none: {}), the name is one
of the request's tools and the arguments are valid against that tool's `parameters`.
An answer that does not parse wholly is no call: it stays the message's content.
"""
from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

from jsonschema.validators import validator_for
from referencing.exceptions import Unresolvable

HERMES_TAG, HERMES_END = "<tool_call>", "</tool_call>"
PYTHON_TAG = "<|python_tag|>"
FENCE = "```"
NAME_KEYS, ARGUMENT_KEYS = ("name", "function"), ("arguments", "parameters")
_HERMES_CALL = re.compile(r"<tool_call>(.*?)</tool_call>|<tool_call>(.*)", re.DOTALL)   # the last may be unclosed
_FENCED = re.compile(r"^```(?:json)?\s*(.*?)\s*```$", re.DOTALL)
_FIRST_KEY = re.compile(r'\[?\s*\{\s*"([^"\\]*)"\s*:')       # of an object, or of a list's first object


@dataclass
class ParsedAnswer:
    content: Optional[str]                      # None when the answer is only calls
    calls: List[dict] = field(default_factory=list)   # OpenAI's tool_calls


def style_of(template: Optional[str]) -> str:
    """The tool-call style a chat template's text teaches (no template: `json`)."""
    text = template or ""
    if HERMES_TAG in text:
        return "hermes"
    if PYTHON_TAG in text or ("<|start_header_id|>" in text and '"parameters"' in text):
        return "llama3"
    return "json"


def parse(text: str, style: str, tools: Optional[Sequence[dict]] = ()) -> ParsedAnswer:
    """The calls in a finished answer; `tools`: the request's tools (OpenAI's entries), which a
    whole-answer JSON call must name, with arguments valid against the tool's parameters."""
    own = {"hermes": _hermes, "llama3": _llama3}.get(style)
    calls = own(text) if own is not None else None
    if calls is None:
        calls = _whole_json(text, _validators(tools))
        if calls is None:
            return ParsedAnswer(text)
        return ParsedAnswer(None, calls)
    content = text[:text.find(HERMES_TAG)].strip() if style == "hermes" else ""
    return ParsedAnswer(content or None, calls)


def _hermes(text: str) -> Optional[List[dict]]:
    if HERMES_TAG not in text:
        return None
    calls = [_call(_json(closed or open_)) for closed, open_ in _HERMES_CALL.findall(text)]
    return calls if calls and all(calls) else None


def _llama3(text: str) -> Optional[List[dict]]:
    text = text.strip()
    if text.startswith(PYTHON_TAG):
        text = text[len(PYTHON_TAG):].lstrip()
    if not text.startswith("{"):
        return None
    objects, decoder, at = [], json.JSONDecoder(), 0
    while at < len(text):          # objects separated by ";" (as Llama 3.1 writes several)
        try:
            obj, at = decoder.raw_decode(text, at)
        except json.JSONDecodeError:
            return None
        objects.append(obj)
        rest = text[at:].lstrip()
        if rest.startswith(";"):
            rest = rest[1:].lstrip()
        elif rest:
            return None
        at = len(text) - len(rest)
    calls = [_call(obj) for obj in objects]
    return calls if calls and all(calls) else None


def _validators(tools: Optional[Sequence[dict]]) -> Dict[str, object]:
    """Each tool's name -> a validator of its parameters (no parameters: the function takes none)."""
    found = {}
    for tool in tools or ():
        schema = tool["function"].get("parameters") or NO_PARAMETERS
        found[tool["function"]["name"]] = validator_for(schema)(schema)
    return found


def _whole_json(text: str, validators: Dict[str, object]) -> Optional[List[dict]]:
    text = text.strip()
    fenced = _FENCED.match(text)
    value = _json(fenced.group(1) if fenced else text)
    objects = value if isinstance(value, list) else [value]
    calls = [_tool_call(obj, validators) for obj in objects]
    return calls if calls and all(calls) else None


def _tool_call(obj, validators: Dict[str, object]) -> Optional[dict]:
    """OpenAI's tool call of a whole-answer JSON object, or None (the module's rule)."""
    if not isinstance(obj, dict):
        return None
    names = [k for k in NAME_KEYS if k in obj]
    arguments = [k for k in ARGUMENT_KEYS if k in obj]
    if len(names) != 1 or len(arguments) > 1 or len(obj) != 1 + len(arguments):
        return None
    name, args = obj[names[0]], obj[arguments[0]] if arguments else {}
    if not isinstance(name, str) or name not in validators:
        return None
    if isinstance(args, str):
        args = _json(args)
    if not isinstance(args, dict):
        return None
    try:
        if not validators[name].is_valid(args):
            return None
    except Unresolvable:        # a $ref that leads nowhere: the arguments cannot be checked
        return None
    return _openai_call(name, args)


def _json(text: str):
    try:
        return json.loads(text.strip())
    except json.JSONDecodeError:
        return None


def _call(obj) -> Optional[dict]:
    """OpenAI's tool call of `{"name", "arguments" | "parameters"}` (arguments an object, or JSON text
    of one), or None."""
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
        return None
    arguments = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(arguments, str):
        arguments = _json(arguments)
    if not isinstance(arguments, dict):
        return None
    return _openai_call(obj["name"], arguments)


def _openai_call(name: str, arguments: dict) -> dict:
    """The arguments as JSON text, as OpenAI sends them."""
    return {"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
            "function": {"name": name, "arguments": json.dumps(arguments, ensure_ascii=False)}}


class StreamedAnswer:
    """A streamed answer, its text released as content only where it cannot be (part of) a tool call.

    `add(piece)` -> the text that may be sent now; `finish()` -> (the content not sent yet, or None;
    the calls), the whole answer read as `parse` reads it. Held back: the whole answer while its start
    may open a whole-answer call (`{`, `[`, a ``` fence; in the `llama3` style also `<|python_tag|>`),
    until it cannot (a first key no call has, text after the JSON, another fence language); in the
    `hermes` style also everything from a `<tool_call>` tag (or what may become one) on, and whitespace
    that may come before one. What was sent is always the start of the message's content."""

    def __init__(self, style: str, tools: Optional[Sequence[dict]] = ()):
        self.style, self.tools = style, tools
        self.text = ""
        self.sent = 0               # characters of `text` released
        self._opens = True          # the start may still open a whole-answer call

    def add(self, piece: str) -> str:
        self.text += piece
        end = max(self.sent, self._releasable())
        out, self.sent = self.text[self.sent:end], end
        return out

    def finish(self) -> Tuple[Optional[str], List[dict]]:
        parsed = parse(self.text, self.style, self.tools)
        if not parsed.calls:
            rest, self.sent = self.text[self.sent:], len(self.text)
            return rest or None, []
        # hermes: the content is the text before the first tag, stripped; what was sent is its start
        sent = self.text[:self.sent].strip()
        return (parsed.content or "")[len(sent):] or None, parsed.calls

    def _releasable(self) -> int:
        if self._opens:
            self._opens = _may_open_a_call(self.text, self.style)
            if self._opens:
                return 0
        if self.style != "hermes":
            return len(self.text)
        at = self.text.find(HERMES_TAG)
        return len(self.text[:at if at >= 0 else _partial_end(self.text, HERMES_TAG)].rstrip())


def _partial_end(text: str, tag: str) -> int:
    """Where an unfinished `tag` may begin at the end of `text` (len(text): nowhere)."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if tag.startswith(text[-n:]):
            return len(text) - n
    return len(text)


def _may_open_a_call(text: str, style: str) -> bool:
    """Whether an answer that starts with `text` may still be a whole-answer call."""
    start = text.lstrip()
    if style == "llama3" and (start.startswith(("{", PYTHON_TAG)) or PYTHON_TAG.startswith(start)):
        return True                   # Llama 3.1's calls, several separated by ";": held to the end
    if FENCE.startswith(start):       # nothing yet, or a fence begun
        return True
    if not start.startswith(FENCE):
        return _may_be_json_call(start)
    inside = start[len(FENCE):]
    if "json".startswith(inside):
        return True
    inside = inside[4:] if inside.startswith("json") else inside
    body, closed, after = inside.partition(FENCE)
    if closed:
        return not after.strip() and _may_be_json_call(body)
    return _may_be_json_call(body.rstrip("`"))      # the closing fence may be under way


def _may_be_json_call(text: str) -> bool:
    """Whether JSON that starts with `text` may still be a call object or a list of them."""
    text = text.strip()
    if not text:
        return True
    try:
        _, end = json.JSONDecoder().raw_decode(text)
        return text[0] in "{[" and not text[end:].strip()
    except json.JSONDecodeError:       # unfinished, or bad (known at the end)
        pass
    first = text[1:].lstrip() if text[0] == "[" else text
    if first and (first[0] != "{" or first[1:].lstrip()[:1] not in ('"', "")):
        return False                   # not JSON, a list of something else, or an object without a key
    key = _FIRST_KEY.match(text)
    return key is None or key.group(1) in NAME_KEYS + ARGUMENT_KEYS


NO_PARAMETERS = {"type": "object", "properties": {}, "additionalProperties": False}


def call_schema(tools: List[dict]) -> dict:
    """The JSON schema of one call of one of `tools` (OpenAI's tool entries): `{"name": its name,
    "arguments": its parameters}`, the name first so that the arguments follow the chosen tool's."""
    one = [{"type": "object",
            "properties": {"name": {"const": t["function"]["name"]},
                           "arguments": t["function"].get("parameters") or NO_PARAMETERS},
            "required": ["name", "arguments"], "additionalProperties": False} for t in tools]
    return one[0] if len(one) == 1 else {"anyOf": one}
