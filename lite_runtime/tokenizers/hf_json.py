"""Hugging Face ``tokenizer.json`` (GPT-2, Bloom, Qwen2, Llama 3, ...) through ``tokenizers``.

What comes from where:
- vocabulary, normalizer, pre-tokenizer, decoder: ``tokenizer.json``;
- special ids: its ``added_tokens`` marked ``"special": true``;
- what ``add_special_tokens=True`` prepends: the leading ids of its post-processor
  (GPT-2's ByteLevel and a missing post-processor add nothing, Llama's template adds
  ``<s>``), unless ``tokenizer_config.json`` says ``add_bos_token`` yes or no;
- bos/eos/pad: ``bos_token``/``eos_token``/``pad_token`` of ``tokenizer_config.json``,
  else of ``special_tokens_map.json`` (a string or ``{"content": ...}``), else none;
- further ids ending generation: ``eos_token_id`` of ``generation_config.json``.
Explicit ``*_token_id`` arguments win over all of these.
"""

from __future__ import annotations

import json
import os
from typing import Dict, List, Optional

from lite_runtime.contract.errors import ArtifactError
from lite_runtime.tokenizers.base import Tokenizer, TokenizerOptions, checked_special_tokens

CONFIG_FILES = ("tokenizer_config.json", "special_tokens_map.json")
GENERATION_CONFIG = "generation_config.json"
_PROBE = "a"


def read_json(path: str) -> dict:
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise ArtifactError(f"tokenizer: cannot read {path!r}: {exc}") from exc
    if not isinstance(data, dict):
        raise ArtifactError(f"tokenizer: {path!r} must hold a JSON object, got {type(data).__name__}")
    return data


class HFJsonTokenizer(Tokenizer):
    kind = "tokenizer.json"
    matches_special_tokens = True

    def __init__(self, json_path: str, options: TokenizerOptions = TokenizerOptions()) -> None:
        import tokenizers

        super().__init__(json_path)
        data = read_json(self.path)
        try:
            tk = tokenizers.Tokenizer.from_file(self.path)
        except Exception as exc:  # the library raises plain Exception for bad files
            raise ArtifactError(f"tokenizer: cannot read {self.path!r} as a tokenizers file: {exc}") from exc
        tk.no_padding()
        tk.no_truncation()
        extra = checked_special_tokens(options.special_tokens)
        if extra:
            tk.add_special_tokens([tokenizers.AddedToken(t, special=True) for t in extra])
        self._tk = tk

        added = data.get("added_tokens") or []
        special = {int(t["id"]) for t in added if isinstance(t, dict) and t.get("special")}
        special |= {tk.token_to_id(t) for t in extra}
        added_ids = [int(t["id"]) for t in added if isinstance(t, dict)]
        self._vocab_size = max([tk.get_vocab_size(with_added_tokens=True)] + [i + 1 for i in added_ids])

        folder = os.path.dirname(os.path.abspath(self.path))
        found: Dict[str, Optional[int]] = {}
        files_add_bos = None
        for name in CONFIG_FILES:
            config_path = os.path.join(folder, name)
            if not os.path.isfile(config_path):
                continue
            config = read_json(config_path)
            for key in ("bos", "eos", "pad"):
                value = config.get(f"{key}_token")
                if f"{key}_token_id" not in found and f"{key}_token" in config:  # null counts
                    found[f"{key}_token_id"] = (None if value is None else
                                                self._config_token(config_path, f"{key}_token", value))
            if files_add_bos is None and isinstance(config.get("add_bos_token"), bool):
                files_add_bos = config["add_bos_token"]
        self._init_specials(
            found=found,
            options=options,
            extra_eos=self._generation_eos(os.path.join(folder, GENERATION_CONFIG)),
            special_ids=special,
            files_prefix=self._post_processor_prefix(),
            files_add_bos=files_add_bos,
        )

    def _config_token(self, config_path: str, key: str, value: object) -> int:
        content = value.get("content") if isinstance(value, dict) else value
        token_id = self._tk.token_to_id(content) if isinstance(content, str) else None
        if token_id is None:
            raise ArtifactError(
                f"tokenizer: {key} {value!r} of {config_path!r} is not a token of {self.path!r}"
            )
        return token_id

    def _generation_eos(self, config_path: str) -> List[int]:
        if not os.path.isfile(config_path):
            return []
        value = read_json(config_path).get("eos_token_id")
        values = value if isinstance(value, list) else [] if value is None else [value]
        for v in values:
            if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < self._vocab_size:
                raise ArtifactError(
                    f"tokenizer: eos_token_id {value!r} of {config_path!r} must be token ids "
                    f"in [0, {self._vocab_size})"
                )
        return values

    def _post_processor_prefix(self) -> List[int]:
        """The ids the post-processor puts before a text (found by encoding a probe)."""
        plain = self._tk.encode(_PROBE, add_special_tokens=False).ids
        full = self._tk.encode(_PROBE, add_special_tokens=True).ids
        for start in range(len(full) - len(plain) + 1):
            if full[start:start + len(plain)] == plain:
                return full[:start]
        return []

    def _encode_text(self, text: str) -> List[int]:
        return self._tk.encode(text, add_special_tokens=False).ids

    def _decode_ids(self, ids: List[int]) -> str:
        # Byte-level decoders join the bytes of all tokens first, so a character split
        # over tokens decodes whole, and an incomplete one at the end as U+FFFD.
        return self._tk.decode(ids, skip_special_tokens=False)

    def _piece(self, token_id: int) -> str:
        piece = self._tk.id_to_token(token_id)
        return "" if piece is None else piece

    def _token_to_id(self, token: str) -> Optional[int]:
        return self._tk.token_to_id(token)
