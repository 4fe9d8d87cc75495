"""A model's published chat template: where it is kept beside the tokenizer, and its rendering as
transformers' `apply_chat_template` renders it.

transformers has kept the template in three places over time, and reads them in this order:
`chat_template.jinja` (its own file, written by current versions), `chat_template.json`
(`{"chat_template": ...}`, written for processors) and the `chat_template` entry of
`tokenizer_config.json` (a string, or a list of `{"name", "template"}` of which `default` and
`tool_use` are chosen by whether tools are given). The template sees the messages, `tools`,
`add_generation_prompt`, the special tokens by name (`bos_token`, `eos_token`, ...) and the helpers
`raise_exception` and `strftime_now`; it is rendered in jinja2's immutable sandbox with
`trim_blocks` and `lstrip_blocks`, and its `tojson` keeps non-ASCII text as it is.
"""
from __future__ import annotations

import json
import os
from datetime import datetime
from typing import Dict, List, Optional, Sequence, Union

from lite_runtime.contract.errors import ArtifactError
from lite_runtime.tokenizers.hf_json import read_json

TEMPLATE_FILE = "chat_template.jinja"
TEMPLATE_JSON = "chat_template.json"
TOKENIZER_CONFIG = "tokenizer_config.json"
SPECIAL_TOKENS_MAP = "special_tokens_map.json"
SPECIAL_TOKEN_NAMES = ("bos_token", "eos_token", "unk_token", "pad_token", "sep_token", "cls_token", "mask_token")

Template = Union[str, Dict[str, str]]
# Special tokens that only a chat-tuned vocabulary has (ChatML, Llama 3, ChatGLM3, Gemma, Phi-3).
CHAT_MARKERS = ("<|im_start|>", "<|start_header_id|>", "<|eot_id|>", "<|user|>", "<|assistant|>",
                "<start_of_turn>", "<|end|>")


def _named(value, path: str) -> Optional[Template]:
    """A template entry as a string, or {name: template} for a list of named ones."""
    if value is None or isinstance(value, str):
        return value or None
    if isinstance(value, list) and all(isinstance(t, dict) and "name" in t and "template" in t for t in value):
        return {t["name"]: t["template"] for t in value}
    raise ArtifactError(f"chat template: chat_template of {path} must be a string or a list of "
                        f"{{name, template}}, got {type(value).__name__}")


def find_chat_template(folder: str, names: Optional[Sequence[str]] = None) -> Optional[tuple]:
    """(file, template) of the chat template in `folder` (only the files in `names`, when given), in
    transformers' order; None when there is none."""
    def present(name):
        return (names is None or name in names) and os.path.isfile(os.path.join(folder, name))
    if present(TEMPLATE_FILE):
        path = os.path.join(folder, TEMPLATE_FILE)
        try:
            with open(path, encoding="utf-8") as f:
                return TEMPLATE_FILE, f.read()
        except (OSError, UnicodeDecodeError) as e:
            raise ArtifactError(f"chat template: cannot read {path}: {e}") from None
    for name in (TEMPLATE_JSON, TOKENIZER_CONFIG):
        if present(name):
            template = _named(read_json(os.path.join(folder, name)).get("chat_template"), os.path.join(folder, name))
            if template:
                return name, template
    return None


def chat_tuned_sign(tokenizer_file: str, folder_name: str = "") -> Optional[str]:
    """Why a tokenizer looks chat-tuned (a chat marker among its added tokens, or a folder named as an
    instruct model), or None."""
    if tokenizer_file.endswith(".json") and os.path.isfile(tokenizer_file):
        try:
            added = read_json(tokenizer_file).get("added_tokens") or []
        except ArtifactError:       # a damaged tokenizer is named by its own check
            added = []
        added = {t.get("content") for t in added if isinstance(t, dict)}
        found = [m for m in CHAT_MARKERS if m in added]
        if found:
            return f"its vocabulary has {found[0]}"
    name = folder_name.lower()
    if any(word in name for word in ("chat", "instruct")):
        return f"its folder is named {folder_name!r}"
    return None


def special_token_strings(folder: str) -> Dict[str, str]:
    """The special tokens by name (bos_token, ...) from tokenizer_config.json, else special_tokens_map.json."""
    found: Dict[str, str] = {}
    for name in (TOKENIZER_CONFIG, SPECIAL_TOKENS_MAP):
        path = os.path.join(folder, name)
        if not os.path.isfile(path):
            continue
        for key, value in read_json(path).items():
            content = value.get("content") if isinstance(value, dict) else value
            if key in SPECIAL_TOKEN_NAMES and isinstance(content, str):
                found.setdefault(key, content)
    return found


class ChatTemplate:
    """One published template, compiled once."""

    def __init__(self, template: Template, source: str, special_tokens: Dict[str, str]):
        self.templates = template if isinstance(template, dict) else {"default": template}
        self.source, self.special_tokens = source, dict(special_tokens)
        self._compiled = {}

    def _compiled_for(self, tools) -> object:
        name = "tool_use" if tools and "tool_use" in self.templates else "default"
        if name not in self.templates:
            raise ArtifactError(f"chat template: {self.source} names its templates {', '.join(self.templates)} "
                                "but none is 'default'")
        if name not in self._compiled:
            self._compiled[name] = _environment().from_string(self.templates[name])
        return self._compiled[name]

    def render(self, messages: List[dict], tools: Optional[list] = None, add_generation_prompt: bool = True) -> str:
        """The prompt text; keys whose value is None are left out of each message, as transformers does
        (so a template's `message.content is defined` sees an assistant turn of only tool calls)."""
        import jinja2
        messages = [{k: v for k, v in m.items() if v is not None} for m in messages]
        try:
            return self._compiled_for(tools).render(messages=messages, tools=tools or None,
                                                    add_generation_prompt=add_generation_prompt,
                                                    **self.special_tokens)
        except jinja2.TemplateError as e:
            raise ValueError(f"the chat template ({self.source}) refused the messages: {e}") from None


def _environment():
    import jinja2
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = tojson
    env.globals.update(raise_exception=raise_exception, strftime_now=lambda fmt: datetime.now().strftime(fmt))
    return env
