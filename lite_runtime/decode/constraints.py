"""Structured output: a request's answer held to a JSON schema (or to any JSON object), or to a
regular expression (one of a list of strings: their alternation), by making, at each of its steps,
the tokens the grammar does not allow impossible; with llguidance, the grammar engine vLLM and
llama.cpp use. The grammar ends by allowing only the end-of-sequence ids, so the request stops there.

`JsonConstraint.tables(path, ...)` builds the token tables once per tokenizer; each request gets its own
matcher (`json_matcher`: `start` or `start_regex`), which `Sampler` asks for a mask before choosing and tells
the chosen token after.
"""
from __future__ import annotations

import json
import os
import threading
from typing import Dict, Optional, Sequence

import numpy as np

from lite_runtime.contract.errors import ConfigError, ValidationError

_TABLES: Dict[tuple, object] = {}
_LOCK = threading.Lock()
# the characters Rust's regex syntax (llguidance's) gives a meaning, escaped by `\`; every other
# character, whitespace included, stands for itself there
_REGEX_META = frozenset("\\.+*?()|[]{}^$#&-~")


def choice_regex(choices: Sequence[str]) -> str:
    """A regular expression that matches exactly the strings `choices`, each whole (vLLM's guided_choice)."""
    return "|".join("".join("\\" + c if c in _REGEX_META else c for c in choice) for choice in choices)


def json_matcher(tokenizer_path: str, vocab_size: int, eos_ids: Sequence[int], schema: Optional[dict],
                 what: str, regex: Optional[str] = None) -> "JsonConstraint":
    """A new matcher of `schema` (None: any JSON object), or of the regular expression `regex` when given,
    over the vocabulary of `tokenizer_path`, which must be a tokenizer.json (ConfigError naming `what`,
    the option that asked for it)."""
    if not tokenizer_path.endswith(".json"):
        raise ConfigError(f"{what} needs an export whose tokenizer is a tokenizer.json (its answer is held to a "
                          f"grammar over it); this one's is {os.path.basename(tokenizer_path)}")
    tables = JsonConstraint.tables(tokenizer_path, vocab_size, sorted(eos_ids))
    if regex is not None:
        return JsonConstraint.start_regex(tables, regex, vocab_size)
    return JsonConstraint.start(tables, schema, vocab_size)


class JsonConstraint:
    """One request's matcher: `mask(logits)` (1, V) and `advance(token)`."""

    def __init__(self, tables, grammar: str, vocab_size: int):
        import llguidance
        import llguidance.numpy as llg_numpy
        self._numpy = llg_numpy
        self._matcher = llguidance.LLMatcher(tables, grammar)
        error = self._matcher.get_error()
        if error:
            raise ValidationError(f"the grammar cannot be followed: {error}")
        self._bits = llg_numpy.allocate_token_bitmask(1, tables.vocab_size)
        self._tokens, self._vocab = tables.vocab_size, vocab_size

    @staticmethod
    def tables(tokenizer_json: str, vocab_size: int, eos_ids: Sequence[int]):
        """llguidance's token tables of a tokenizer.json, built once per (file, vocabulary, EOS ids)."""
        key = (tokenizer_json, vocab_size, tuple(eos_ids))
        with _LOCK:
            if key not in _TABLES:
                try:
                    import llguidance
                except ImportError:
                    raise ConfigError("structured output needs the llguidance package (pip install llguidance, "
                                      "the serve extra)") from None
                import tokenizers
                text = tokenizers.Tokenizer.from_file(tokenizer_json).to_str()
                _TABLES[key] = llguidance.LLTokenizer(text, n_vocab=vocab_size, eos_token=list(eos_ids))
            return _TABLES[key]

    @classmethod
    def start(cls, tables, schema: Optional[dict], vocab_size: int) -> "JsonConstraint":
        """A matcher of `schema` (None: any JSON object)."""
        import llguidance
        try:
            # JSON as json.dumps writes it (", " and ": ", no free whitespace), unless the schema's own
            # x-guidance says otherwise: free whitespace lets a small model pad an answer to its budget
            grammar = llguidance.LLMatcher.grammar_from_json_schema(json.dumps(schema or {"type": "object"}),
                                                                    defaults={"whitespace_flexible": False})
        except (ValueError, TypeError) as e:
            raise ValidationError(f"the JSON schema is not valid: {e}") from None
        return cls(tables, grammar, vocab_size)

    @classmethod
    def start_regex(cls, tables, pattern: str, vocab_size: int) -> "JsonConstraint":
        """A matcher of the text the regular expression `pattern` matches whole."""
        import llguidance
        try:
            grammar = llguidance.LLMatcher.grammar_from_regex(pattern)
        except (ValueError, TypeError) as e:
            raise ValidationError(f"the regular expression is not valid: {e}") from None
        return cls(tables, grammar, vocab_size)

    def mask(self, logits: np.ndarray) -> np.ndarray:
        self._numpy.fill_next_token_bitmask(self._matcher, self._bits, 0)
        allowed = np.unpackbits(self._bits.view(np.uint8), bitorder="little")[:self._tokens].astype(bool)
        out = np.full_like(logits, -np.inf, dtype=np.float32)
        width = min(self._tokens, logits.shape[1])
        out[:, :width] = np.where(allowed[:width], logits[:, :width], -np.inf)
        return out

    def advance(self, token: int) -> None:
        if not self._matcher.consume_token(int(token)):
            raise ValidationError(f"token {token} does not follow the JSON grammar: {self._matcher.get_error()}")
