"""Chat messages to prompt text: the `chat_template` of the export's `tokenizer_config.json` when it
has one (rendered with jinja2, as transformers does), else the family's own published format."""
from __future__ import annotations

import json
import os
import re
from typing import Dict, List, Optional

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
    def __init__(self, family: str, export_dir: Optional[str]):
        import jinja2
        source = _tokenizer_config_template(export_dir) or FAMILY_TEMPLATES.get(family, PLAIN_TEMPLATE)
        self.from_tokenizer_config = source is not None and source not in FAMILY_TEMPLATES.values() \
            and source != PLAIN_TEMPLATE
        env = jinja2.Environment(keep_trailing_newline=True)
        self.template = env.from_string(source)

    def render(self, messages: List[dict]) -> str:
        system = "\n".join(m["content"] for m in messages if m["role"] == "system")
        return self.template.render(messages=messages, system=system, add_generation_prompt=True,
                                    bos_token="", eos_token="")


def _tokenizer_config_template(export_dir: Optional[str]) -> Optional[str]:
    path = os.path.join(export_dir or "", "tokenizer_config.json")
    if not export_dir or not os.path.isfile(path):
        return None
    with open(path, encoding="utf-8") as f:
        template = json.load(f).get("chat_template")
    return template if isinstance(template, str) else None


def encode_chat(tokenizer, text: str) -> List[int]:
    """Token ids of a rendered chat prompt: the tokenizer's prefix (BOS, ChatGLM's [gMASK] sop), the
    special tokens written in the text (`</s><s>`, `<|im_start|>`...) as their own ids, the rest
    encoded as text, then the tokenizer's suffix."""
    specials = {tokenizer.id_to_piece(i): i for i in tokenizer.all_special_ids}
    specials = {piece: i for piece, i in specials.items() if piece}
    ids = list(tokenizer.prefix_ids)
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
    return ids + list(tokenizer.suffix_ids)
