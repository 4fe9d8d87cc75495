"""Chat messages to prompt ids: the model's published chat template when the export carries one
(rendered and tokenized as transformers' `apply_chat_template` does: the template writes every
special token itself, BOS included, and nothing is added around it), else the family's own format
(the tokenizer's prefix, BOS or ChatGLM's [gMASK] sop, before it)."""
from __future__ import annotations

import re
from typing import Dict, List, Optional

from lite_runtime.tokenizers.chat_template import ChatTemplate, find_chat_template, special_token_strings

# The families' chat formats (BOS and ChatGLM's [gMASK] sop come from the tokenizer's own prefix).
FAMILY_TEMPLATES: Dict[str, str] = {
    # Llama 2 chat: the system prompt inside the first [INST], each answer closed by </s><s>.
    "llama": (
        "{% for m in messages if m.role != 'system' %}"
        "{% if m.role == 'user' %}{% if not loop.first %}<s>{% endif %}[INST] "
        "{% if loop.first and system %}<<SYS>>\n{{ system }}\n<</SYS>>\n\n{% endif %}"
        "{{ m.content | trim }} [/INST]{% else %} {{ m.content | trim }} </s>{% endif %}{% endfor %}"),
    # Qwen: ChatML.
    "qwen": (
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
        "<|im_start|>assistant\n"),
    # ChatGLM3 roles.
    "glm2": "{% for m in messages %}<|{{ m.role }}|>\n {{ m.content }}{% endfor %}<|assistant|>",
    # Baichuan2: user and assistant tokens.
    "baichuan2": (
        "{{ system or '' }}{% for m in messages if m.role != 'system' %}"
        "{% if m.role == 'user' %}<reserved_106>{{ m.content }}{% else %}<reserved_107>{{ m.content }}{% endif %}"
        "{% endfor %}<reserved_107>"),
    # InternLM (v1 chat).
    "internlm": (
        "{% for m in messages if m.role != 'system' %}"
        "{% if m.role == 'user' %}<|User|>:{{ m.content }}<eoh>\n{% else %}<|Bot|>:{{ m.content }}<eoa>\n{% endif %}"
        "{% endfor %}<|Bot|>:"),
}
# Families without a chat format of their own (base models: GPT-2, Bloom, PanguAlpha).
PLAIN_TEMPLATE = ("{% for m in messages %}{{ m.role | capitalize }}: {{ m.content }}\n{% endfor %}Assistant:")


class ChatFormat:
    """How an export's chats become prompt ids. `published` is the export's own template (None: the
    family's format); `describe()` says which, for the server's start line."""

    def __init__(self, family: str, export_dir: Optional[str], tokenizer=None):
        import jinja2
        self.family, self.tokenizer = family, tokenizer
        found = find_chat_template(export_dir) if export_dir else None
        self.published: Optional[ChatTemplate] = None
        if found is not None:
            specials = special_token_strings(export_dir)
            if tokenizer is not None:     # tokens the files do not name by string: from the tokenizer's ids
                for key, token_id in (("bos_token", tokenizer.bos_token_id), ("eos_token", tokenizer.eos_token_id)):
                    if key not in specials and token_id is not None:
                        specials[key] = tokenizer.id_to_piece(token_id)
            self.published = ChatTemplate(found[1], found[0], specials)
        env = jinja2.Environment(keep_trailing_newline=True)
        self.template = env.from_string(FAMILY_TEMPLATES.get(family, PLAIN_TEMPLATE))

    def describe(self) -> str:
        if self.published is not None:
            return f"the export's chat template ({self.published.source})"
        own = "its own" if self.family in FAMILY_TEMPLATES else "a plain 'Role: text' format"
        return f"no chat template in the export: the {self.family} family's format ({own})"

    def render(self, messages: List[dict], tools: Optional[list] = None) -> str:
        if self.published is not None:
            return self.published.render(messages, tools=tools)
        messages = [dict(m, role="system" if m.get("role") == "developer" else m.get("role"),
                         content=m.get("content") or "") for m in messages]
        system = "\n".join(m.get("content") or "" for m in messages if m["role"] == "system")
        return self.template.render(messages=messages, system=system, add_generation_prompt=True,
                                    bos_token="", eos_token="")

    def encode(self, messages: List[dict], tools: Optional[list] = None) -> List[int]:
        """The prompt ids of a chat (needs the tokenizer given at construction)."""
        return encode_chat(self.tokenizer, self.render(messages, tools), affixes=self.published is None)


def encode_chat(tokenizer, text: str, affixes: bool = True) -> List[int]:
    """Token ids of a rendered chat prompt: the special tokens written in the text (`</s><s>`,
    `<|im_start|>`...) as their own ids (found here when the tokenizer does not find them itself), the
    rest encoded as text; with `affixes`, the tokenizer's prefix (BOS, ChatGLM's [gMASK] sop) before
    and its suffix after."""
    ids = list(tokenizer.prefix_ids) if affixes else []
    specials = {}
    if not tokenizer.matches_special_tokens:
        specials = {tokenizer.id_to_piece(i): i for i in tokenizer.all_special_ids}
        specials = {piece: i for piece, i in specials.items() if piece}
    if specials:
        pattern = re.compile("|".join(re.escape(p) for p in sorted(specials, key=len, reverse=True)))
        parts = pattern.split(text)
        marks = pattern.findall(text)
    else:
        parts, marks = [text], []
    for i, part in enumerate(parts):
        if part:
            ids += tokenizer.encode(part, add_special_tokens=False)
        if i < len(marks):
            ids.append(specials[marks[i]])
    return ids + (list(tokenizer.suffix_ids) if affixes else [])
