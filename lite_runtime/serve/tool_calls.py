"""Tool calls in a chat's answer: the model's finished text read back into OpenAI's `tool_calls`, in the
style its chat template taught it (as vLLM's tool parsers read them), and the JSON schema that makes
an answer exactly one call (`tool_choice` required or a named function, held by the JSON constraint).

Styles:
- `hermes` (Hermes, Qwen2.5): `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, one or
  several; the text before the first is the answer's content.
- `llama3` (Llama 3.1's JSON tool calling): the whole answer is `{"name": ..., "parameters": {...}}`,
  optionally after `<|python_tag|>`, several separated by `;`.
- `json`: the whole answer is a call object or a list of them (a ```json fence allowed); since any JSON
  answer could look like one, an object counts only when its name is one of the request's tools.
An answer that does not parse as its style wholly is no call: it stays the message's content.
"""
from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field
from typing import Iterable, List, Optional

HERMES_TAG, HERMES_END = "<tool_call>", "</tool_call>"
PYTHON_TAG = "<|python_tag|>"
_HERMES_CALL = re.compile(r"<tool_call>(.*?)</tool_call>|<tool_call>(.*)", re.DOTALL)   # the last may be unclosed
_FENCE = re.compile(r"^```(?:json)?\s*(.*?)\s*```$", re.DOTALL)


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


def parse(text: str, style: str, names: Iterable[str] = ()) -> ParsedAnswer:
    """The calls in a finished answer; `names`: the request's tool names (the `json` style's filter)."""
    calls = {"hermes": _hermes, "llama3": _llama3, "json": _plain_json}[style](text, set(names))
    if calls is None:
        return ParsedAnswer(text)
    content = text[:text.find(HERMES_TAG)].strip() if style == "hermes" else ""
    return ParsedAnswer(content or None, calls)


def _hermes(text: str, names) -> Optional[List[dict]]:
    if HERMES_TAG not in text:
        return None
    calls = [_call(_json(closed or open_)) for closed, open_ in _HERMES_CALL.findall(text)]
    return calls if calls and all(calls) else None


def _llama3(text: str, names) -> Optional[List[dict]]:
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


def _plain_json(text: str, names) -> Optional[List[dict]]:
    text = text.strip()
    fenced = _FENCE.match(text)
    value = _json(fenced.group(1) if fenced else text)
    objects = value if isinstance(value, list) else [value]
    calls = [_call(obj) for obj in objects]
    if not calls or not all(calls) or any(c["function"]["name"] not in names for c in calls):
        return None
    return calls


def _json(text: str):
    try:
        return json.loads(text.strip())
    except json.JSONDecodeError:
        return None


def _call(obj) -> Optional[dict]:
    """OpenAI's tool call of `{"name", "arguments" | "parameters"}` (arguments an object, or JSON text
    of one), or None; the arguments become JSON text, as OpenAI sends them."""
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
        return None
    arguments = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(arguments, str):
        arguments = _json(arguments)
    if not isinstance(arguments, dict):
        return None
    return {"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
            "function": {"name": obj["name"], "arguments": json.dumps(arguments, ensure_ascii=False)}}


NO_PARAMETERS = {"type": "object", "properties": {}, "additionalProperties": False}


def call_schema(tools: List[dict]) -> dict:
    """The JSON schema of one call of one of `tools` (OpenAI's tool entries): `{"name": its name,
    "arguments": its parameters}`, the name first so that the arguments follow the chosen tool's."""
    one = [{"type": "object",
            "properties": {"name": {"const": t["function"]["name"]},
                           "arguments": t["function"].get("parameters") or NO_PARAMETERS},
            "required": ["name", "arguments"], "additionalProperties": False} for t in tools]
    return one[0] if len(one) == 1 else {"anyOf": one}
