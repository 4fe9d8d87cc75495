"""Tokenizers of the families the runtime serves, behind one interface.

``load_tokenizer(path)`` takes a tokenizer file or a folder holding one (e.g. an export):

- ``tokenizer.json``  Hugging Face tokenizers (GPT-2, Bloom, Qwen2, Llama 3, ...);
- ``*.tiktoken``      tiktoken BPE ranks with Qwen's pattern and special tokens (Qwen v1);
- ``vocab.model``     jieba word segmentation, then sentencepiece (PanguAlpha; MindFormers
                      gives its vocabulary this name, and exports keep it);
- ``ice_text.model``  sentencepiece behind ChatGLM-6B's whitespace markers, id offset and
                      ``[gMASK] <sop>`` suffix (GLM v1, ``glm_6b``; the name upstream gives it);
- ``*.model``         sentencepiece (Llama, Baichuan, ChatGLM2/3, ...).

In a folder the first of ``tokenizer.json``, a ``*.tiktoken``, ``tokenizer.model`` (or
the folder's only ``*.model``) is used. ``load_tokenizer(..., jieba=True/False)`` turns the
jieba segmentation on or off for a ``*.model`` whatever its name.
"""

from __future__ import annotations

import os
from typing import List, Optional, Sequence

from lite_runtime.contract.errors import ArtifactError, ConfigError
from lite_runtime.tokenizers.base import Tokenizer, TokenIds, TokenizerOptions
from lite_runtime.tokenizers.chatglm6b import VOCAB_FILE as CHATGLM6B_FILE, ChatGLM6BTokenizer
from lite_runtime.tokenizers.hf_json import CONFIG_FILES, GENERATION_CONFIG, HFJsonTokenizer
from lite_runtime.tokenizers.jieba_sentencepiece import VOCAB_FILE as JIEBA_FILE, JiebaSentencePieceTokenizer
from lite_runtime.tokenizers.sentencepiece_model import SentencePieceTokenizer
from lite_runtime.tokenizers.tiktoken_file import TiktokenTokenizer

__all__ = ["Tokenizer", "TokenIds", "ChatGLM6BTokenizer", "HFJsonTokenizer", "JiebaSentencePieceTokenizer",
           "SentencePieceTokenizer", "TiktokenTokenizer", "load_tokenizer", "tokenizer_class_for"]

HF_FILE = "tokenizer.json"
SP_FILE = "tokenizer.model"
ALLOWED = (f"{HF_FILE} (Hugging Face tokenizers), *.tiktoken (tiktoken BPE ranks), "
           f"*.model (sentencepiece, e.g. {SP_FILE}; {JIEBA_FILE}: jieba + sentencepiece; "
           f"{CHATGLM6B_FILE}: ChatGLM-6B)")
_NOT_TOKENIZERS = CONFIG_FILES + (GENERATION_CONFIG, "config.json")


def tokenizer_class_for(path: str, jieba: Optional[bool] = None) -> type:
    """The implementation that reads the file ``path``, judged by its name; ``jieba``
    (True/False) chooses for a ``*.model`` instead of its name."""
    if jieba is not None and not isinstance(jieba, bool):
        raise ConfigError(f"jieba: expected True, False or None, got {jieba!r}")
    name = os.path.basename(path)
    if name in _NOT_TOKENIZERS:
        raise ArtifactError(
            f"tokenizer: {path!r} is a configuration file, not a tokenizer; give the {HF_FILE} "
            "beside it or their folder"
        )
    if name.endswith(".model"):
        use_jieba = name == JIEBA_FILE if jieba is None else jieba
        if use_jieba:
            return JiebaSentencePieceTokenizer
        return ChatGLM6BTokenizer if name == CHATGLM6B_FILE else SentencePieceTokenizer
    if jieba:
        raise ConfigError(f"jieba: applies to sentencepiece *.model files, not {path!r}")
    if name.endswith(".json"):
        return HFJsonTokenizer
    if name.endswith(".tiktoken"):
        return TiktokenTokenizer
    raise ArtifactError(f"tokenizer: {path!r} is not a known tokenizer file; allowed: {ALLOWED}")


def _only_one(folder: str, names: List[str], kind: str) -> Optional[str]:
    if len(names) > 1:
        raise ArtifactError(
            f"tokenizer: folder {folder!r} holds several {kind} files ({', '.join(names)}); "
            "give the one to use"
        )
    return os.path.join(folder, names[0]) if names else None


def find_tokenizer_file(folder: str) -> str:
    """The tokenizer file of ``folder``, by the preference order of this module."""
    try:
        names = sorted(n for n in os.listdir(folder) if os.path.isfile(os.path.join(folder, n)))
    except OSError as exc:
        raise ArtifactError(f"tokenizer: cannot list folder {folder!r}: {exc}") from exc
    if HF_FILE in names:
        return os.path.join(folder, HF_FILE)
    found = _only_one(folder, [n for n in names if n.endswith(".tiktoken")], "*.tiktoken")
    if found:
        return found
    if SP_FILE in names:
        return os.path.join(folder, SP_FILE)
    found = _only_one(folder, [n for n in names if n.endswith(".model")], "*.model")
    if found:
        return found
    shown = ", ".join(names[:12]) + (", ..." if len(names) > 12 else "") if names else "nothing"
    raise ArtifactError(f"tokenizer: no tokenizer in folder {folder!r} (found {shown}); allowed: {ALLOWED}")


def load_tokenizer(
    path: str,
    *,
    bos_token_id: Optional[int] = None,
    eos_token_id: Optional[int] = None,
    pad_token_id: Optional[int] = None,
    add_bos: Optional[bool] = None,
    prefix_tokens: Optional[Sequence[str]] = None,
    special_tokens: Optional[Sequence[str]] = None,
    jieba: Optional[bool] = None,
) -> Tokenizer:
    """A tokenizer from a file or a folder holding one.

    ``*_token_id`` override what the files say; ``add_bos`` forces BOS on or off in
    ``encode(..., add_special_tokens=True)``; ``prefix_tokens`` (token strings) replace
    the default prefix; ``special_tokens`` are strings that must encode as single ids;
    ``jieba`` forces PanguAlpha's jieba segmentation on or off (default: by the file name).
    """
    path = os.fspath(path)
    if os.path.isdir(path):
        path = find_tokenizer_file(path)
    elif not os.path.exists(path):
        raise ArtifactError(f"tokenizer: file {path!r} does not exist")
    cls = tokenizer_class_for(path, jieba)
    if not os.access(path, os.R_OK):
        raise ArtifactError(f"tokenizer: file {path!r} is not readable")
    return cls(path, TokenizerOptions(bos_token_id, eos_token_id, pad_token_id, add_bos, prefix_tokens, special_tokens))


def export_tokenizer(manifest) -> Optional[Tokenizer]:
    """An export's tokenizer as its family uses it (special tokens, prompt prefix, from the manifest), or None."""
    if not manifest.tokenizer:
        return None
    return load_tokenizer(manifest.tokenizer_path(), **manifest.tokenizer_options)
