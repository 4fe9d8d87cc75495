"""The prompt ids the server builds for a chat equal transformers' `apply_chat_template` ids, for
folders transformers saved with each family's published template (Llama 2 chat with its BOS and
role checks, Llama 3 with BOS written by the template while its tokenizer also adds one, Qwen2.5's
ChatML with a default system prompt and tool calls), with a system message, without one, and
multi-turn; the template found wherever transformers keeps it."""
import json
import os

import pytest

from support.chat_templates import QWEN25
from support.hf_models import CORPUS
from support.tiny_models import train_byte_bpe_tokenizer

pytestmark = pytest.mark.fast      # no export, no graph, no Lite, no model process: `make test-fast`

LLAMA2 = (
    "{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}"
    "{% set system_message = messages[0]['content'] %}{% else %}{% set loop_messages = messages %}"
    "{% set system_message = false %}{% endif %}{% for message in loop_messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% if loop.index0 == 0 and system_message != false %}"
    "{% set content = '<<SYS>>\\n' + system_message + '\\n<</SYS>>\\n\\n' + message['content'] %}"
    "{% else %}{% set content = message['content'] %}{% endif %}"
    "{% if message['role'] == 'user' %}{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}"
    "{% elif message['role'] == 'assistant' %}{{ ' '  + content.strip() + ' ' + eos_token }}{% endif %}{% endfor %}")
LLAMA3 = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}"
    "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'"
    "+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}"
    "{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}")
CHATS = {
    "user only": [{"role": "user", "content": "Count to three, please."}],
    "with a system message": [{"role": "system", "content": "Answer in one line."},
                              {"role": "user", "content": "one, two,"}],
    "multi-turn": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"},
                   {"role": "assistant", "content": "Hello. How can I help?"},
                   {"role": "user", "content": "Say four five six ï 中文"}],
}
TOOL_CHAT = [{"role": "user", "content": "Weather in Paris?"},
             {"role": "assistant", "content": None, "tool_calls": [
                 {"id": "call_1", "type": "function",
                  "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
             {"role": "tool", "tool_call_id": "call_1", "content": "{\"celsius\": 21}"}]
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather of a city",
                                           "parameters": {"type": "object",
                                                          "properties": {"city": {"type": "string"}}}}}]


def _byte_level(specials, bos, eos):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS * 20, trainer)
    # Llama 3's tokenizer adds BOS to every text (its template writes BOS too: apply_chat_template has one)
    tok.post_processor = processors.TemplateProcessing(single=f"{bos} $A", special_tokens=[(bos, tok.token_to_id(bos))])
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=bos, eos_token=eos,
                                   additional_special_tokens=[s for s in specials if s not in (bos, eos)])


def _saved_folder(kind, folder):
    """A folder transformers saved for `kind` (its tokenizer and template)."""
    if kind == "llama2":
        from transformers import LlamaTokenizer
        os.makedirs(folder / "spm")
        train_byte_bpe_tokenizer(folder / "spm", CORPUS)
        tokenizer, template = LlamaTokenizer.from_pretrained(str(folder / "spm")), LLAMA2
    elif kind == "llama3":
        tokenizer = _byte_level(["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>",
                                 "<|eot_id|>"], "<|begin_of_text|>", "<|eot_id|>")
        template = LLAMA3
    else:
        tokenizer = _byte_level(["<|endoftext|>", "<|im_start|>", "<|im_end|>"], "<|endoftext|>", "<|im_end|>")
        template = QWEN25
    tokenizer.chat_template = template
    tokenizer.save_pretrained(str(folder / "saved"))
    assert os.path.isfile(folder / "saved" / "chat_template.jinja")     # where current transformers writes it
    return tokenizer, str(folder / "saved")


def _reference_ids(tokenizer, messages, tools=None):
    out = tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=True)
    return list(out["input_ids"] if hasattr(out, "keys") else out)


def _served_ids(family, folder, messages, tools=None):
    from lite_runtime.tokenizers.chat_format import ChatFormat
    from lite_runtime.tokenizers import load_tokenizer
    return ChatFormat(family, folder, load_tokenizer(folder)).encode(messages, tools)


KINDS = {"llama2": "llama", "llama3": "llama", "qwen25": "qwen"}


@pytest.mark.parametrize("chat", sorted(CHATS))
@pytest.mark.parametrize("kind", sorted(KINDS))
def test_the_servers_chat_ids_are_apply_chat_templates(tmp_path, kind, chat):
    tokenizer, folder = _saved_folder(kind, tmp_path)
    expected = _reference_ids(tokenizer, CHATS[chat])
    assert _served_ids(KINDS[kind], folder, CHATS[chat]) == expected
    bos = tokenizer.bos_token_id
    assert expected.count(bos) == (sum(m["role"] == "user" for m in CHATS[chat]) if kind == "llama2" else
                                   int(kind == "llama3"))     # a BOS per [INST]; Llama 3's once, not doubled


def test_older_folders_keep_the_template_in_tokenizer_config_or_chat_template_json(tmp_path):
    tokenizer, folder = _saved_folder("qwen25", tmp_path)
    expected = _reference_ids(tokenizer, CHATS["multi-turn"])
    template = open(os.path.join(folder, "chat_template.jinja"), encoding="utf-8").read()
    os.remove(os.path.join(folder, "chat_template.jinja"))
    config_path = os.path.join(folder, "tokenizer_config.json")
    config = json.load(open(config_path, encoding="utf-8"))
    json.dump(dict(config, chat_template=template), open(config_path, "w", encoding="utf-8"))
    assert _served_ids("qwen", folder, CHATS["multi-turn"]) == expected
    json.dump(config, open(config_path, "w", encoding="utf-8"))
    json.dump({"chat_template": template}, open(os.path.join(folder, "chat_template.json"), "w", encoding="utf-8"))
    assert _served_ids("qwen", folder, CHATS["multi-turn"]) == expected


def test_tool_call_history_and_tools_render_as_in_transformers(tmp_path):
    tokenizer, folder = _saved_folder("qwen25", tmp_path)
    for tools in (None, TOOLS):
        expected = _reference_ids(tokenizer, TOOL_CHAT, tools)
        assert _served_ids("qwen", folder, TOOL_CHAT, tools) == expected
    assert "<tool_call>" in tokenizer.decode(expected) and "get_weather" in tokenizer.decode(expected)


def test_a_template_that_refuses_the_roles_says_so(tmp_path):
    _, folder = _saved_folder("llama2", tmp_path)
    with pytest.raises(ValueError, match="roles must alternate"):
        _served_ids("llama", folder, [{"role": "assistant", "content": "first"}])


def test_without_a_template_the_familys_format_is_used_and_said(tmp_path):
    from lite_runtime.tokenizers.chat_format import ChatFormat
    from lite_runtime.tokenizers import load_tokenizer
    _, folder = _saved_folder("qwen25", tmp_path)
    os.remove(os.path.join(folder, "chat_template.jinja"))
    chat = ChatFormat("qwen", folder, load_tokenizer(folder))
    assert chat.published is None and "qwen family's format" in chat.describe()
    prefix = chat.tokenizer.prefix_ids           # the family's format: the tokenizer's prefix, then ChatML
    assert chat.encode(CHATS["user only"])[:len(prefix) + 1] == prefix + chat.tokenizer.encode("<|im_start|>")
