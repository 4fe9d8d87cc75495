"""Sentencepiece ``tokenizer.model`` (Llama, Baichuan, ChatGLM2/3...).

BOS/EOS/PAD default to the model's own ids and BOS is what ``add_special_tokens``
prepends. ``special_tokens`` are extra strings that encode as single ids wherever they
appear in a text: a control piece of the model (``<s>``) keeps its id, any other string
gets a new id after the model's pieces, in the order given (ChatGLM2/3's convention:
``["[MASK]", "[gMASK]", "[sMASK]", "sop", "eop", "<|system|>", "<|user|>", ...]``).
"""

from __future__ import annotations

import re
from typing import Dict, List, Optional

from lite_runtime.contract.errors import ArtifactError
from lite_runtime.tokenizers.base import Tokenizer, TokenizerOptions, checked_special_tokens


class SentencePieceTokenizer(Tokenizer):
    kind = "sentencepiece"

    def __init__(self, model_path: str, options: TokenizerOptions = TokenizerOptions()) -> None:
        import sentencepiece

        super().__init__(model_path)
        processor = sentencepiece.SentencePieceProcessor()
        try:
            processor.Load(self.path)
        except (OSError, RuntimeError) as exc:
            raise ArtifactError(
                f"tokenizer: cannot read sentencepiece model {self.path!r}: {exc}"
            ) from exc
        self._sp = processor
        self._sp_size = processor.get_piece_size()
        self.model_path = self.path

        # Strings the text is split on before sentencepiece sees it, and the ids past the
        # model's own pieces (those sentencepiece cannot decode).
        self._added: Dict[str, int] = {}
        self._extra_pieces: Dict[int, str] = {}
        for token in checked_special_tokens(options.special_tokens):
            piece_id = processor.piece_to_id(token)
            if processor.id_to_piece(piece_id) == token and processor.is_control(piece_id):
                self._added[token] = piece_id
            else:
                new_id = self._sp_size + len(self._extra_pieces)
                self._added[token] = new_id
                self._extra_pieces[new_id] = token
        self._vocab_size = self._sp_size + len(self._extra_pieces)
        self._split = (
            re.compile("|".join(re.escape(t) for t in sorted(self._added, key=len, reverse=True)))
            if self._added else None
        )

        def own(value: int) -> Optional[int]:
            return value if value >= 0 else None

        control = {i for i in range(self._sp_size) if processor.is_control(i)}
        self._init_specials(
            found={"bos_token_id": own(processor.bos_id()), "eos_token_id": own(processor.eos_id()),
                   "pad_token_id": own(processor.pad_id())},
            options=options,
            special_ids=control | set(self._added.values()),
            files_prefix=[processor.bos_id()] if processor.bos_id() >= 0 else [],
        )

    def _encode_text(self, text: str) -> List[int]:
        if self._split is None:
            return self._sp.encode(text, out_type=int)
        ids: List[int] = []
        start = 0
        for match in self._split.finditer(text):
            if match.start() > start:
                ids.extend(self._sp.encode(text[start:match.start()], out_type=int))
            ids.append(self._added[match.group()])
            start = match.end()
        if start < len(text):
            ids.extend(self._sp.encode(text[start:], out_type=int))
        return ids

    def _decode_ids(self, ids: List[int]) -> str:
        # Sentencepiece drops control pieces and cannot decode added ids: decode the runs
        # between special ids and put the specials' text between them.
        parts: List[str] = []
        start = 0
        for position, token in enumerate(ids):
            if token in self._special_ids or token >= self._sp_size:
                parts.append(self._sp.decode(ids[start:position]))
                parts.append(self._piece(token))
                start = position + 1
        parts.append(self._sp.decode(ids[start:]))
        return "".join(parts)

    def _piece(self, token_id: int) -> str:
        if token_id >= self._sp_size:
            return self._extra_pieces[token_id]
        return self._sp.id_to_piece(token_id)

    def _token_to_id(self, token: str) -> Optional[int]:
        if token in self._added:
            return self._added[token]
        piece_id = self._sp.piece_to_id(token)
        return piece_id if self._sp.id_to_piece(piece_id) == token else None
