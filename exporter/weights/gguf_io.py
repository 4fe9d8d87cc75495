"""GGUF files (llama.cpp's format) as a model source, read with the `gguf` package.

A GGUF holds what a Hugging Face folder spreads over several files: the architecture's
hyper-parameters and the tokenizer as metadata, the chat template, and the tensors (often in
quantized blocks). `GGUFSource` turns one into the pieces the rest of the exporter already reads:
a config.json dict, tokenizer files written into a folder, and the tensors under Hugging Face names,
dequantized to float32 (the export's dtype is applied later, as for safetensors).
"""
from __future__ import annotations

import functools
import json
import os
from typing import Dict, List, Optional

import numpy as np

from lite_runtime.contract.errors import ConfigError, WeightError
from exporter.weights.lazy_tensors import LazyTensors

# general.architecture -> Hugging Face model_type. Only these have their tensor names mapped here.
ARCHITECTURES = {"llama": "llama", "qwen2": "qwen2"}
# Tensor types read (dequantized with the gguf package's numpy code).
READ_TYPES = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K")
# llama.cpp's per-layer tensor names -> the Hugging Face names of Llama and Qwen2.
_LAYER_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight", "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.weight": "self_attn.k_proj.weight", "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.weight": "self_attn.v_proj.weight", "attn_v.bias": "self_attn.v_proj.bias",
    "attn_output.weight": "self_attn.o_proj.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
_MODEL_NAMES = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
                "output.weight": "lm_head.weight"}
# GGUF token types (llama.cpp's llama_token_type): control tokens are special, user-defined ones added.
_CONTROL, _USER_DEFINED = 3, 4


def _reader(path: str):
    try:
        import gguf
    except ImportError:
        raise ConfigError("model.gguf needs the gguf package (pip install gguf)") from None
    try:
        return _checked_reader_class()(path)
    except (OSError, ValueError, KeyError) as e:
        raise ConfigError(f"model.gguf {path}: not a readable GGUF file: {e}") from None
    except IndexError:      # the reader's read past the end of the file, within the header
        raise ConfigError(f"model.gguf {path}: the file ends at byte {os.path.getsize(path)}, inside its header "
                          "(metadata and tensor list): the file is truncated (an interrupted download or copy?); "
                          "fetch it again") from None


@functools.lru_cache(maxsize=None)
def _checked_reader_class():
    """The gguf package's reader, checking first that every tensor lies inside the file: the reader takes
    each tensor as a slice of its map of the file, and a file cut short (an interrupted download or copy)
    failed there with a bare `cannot reshape array of size ...`. `_build_tensors` and its fields' parts
    are the package's own (the same in gguf 0.18 and 0.19, the two environments' versions)."""
    import gguf

    class CheckedReader(gguf.GGUFReader):
        def __init__(self, path: str):
            self.path = path
            super().__init__(path)

        def _build_tensors(self, start_offs: int, fields) -> None:
            size = len(self.data)
            for field in fields:
                _, name, _, dims, raw_type, offset = field.parts
                kind = gguf.GGMLQuantizationType(int(raw_type[0]))
                block, block_bytes = gguf.GGML_QUANT_SIZES[kind]
                n_bytes = int(np.prod(dims)) * block_bytes // block
                start = int(start_offs + offset[0])
                end = start + n_bytes
                if end > size:
                    shape = tuple(int(d) for d in reversed(dims.tolist()))
                    raise WeightError(
                        f"model.gguf {self.path}: the file ends at byte {size}, but tensor "
                        f"{bytes(name).decode('utf-8', 'replace')} ({kind.name}, shape {shape}) needs {n_bytes} "
                        f"bytes from byte {start} (up to byte {end}, {end - size} past the end): the file is "
                        "truncated (an interrupted download or copy?); fetch it again")
            super()._build_tensors(start_offs, fields)

    return CheckedReader


class GGUFSource:
    def __init__(self, path: str):
        if not os.path.isfile(path):
            raise ConfigError(f"model.gguf {path} does not exist" if not os.path.exists(path)
                              else f"model.gguf {path} is not a file; give a .gguf file")
        self.path = path
        self._reader = _reader(path)
        self.meta = {name: field.contents() for name, field in self._reader.fields.items()
                     if not name.startswith("tokenizer.ggml.")}
        self.arch = self.meta.get("general.architecture")
        if self.arch not in ARCHITECTURES:
            raise ConfigError(f"model.gguf {path}: architecture {self.arch!r} is not supported; allowed: "
                              f"{', '.join(ARCHITECTURES)}")

    def _field(self, key: str, default=None):
        field = self._reader.fields.get(key)
        return default if field is None else field.contents()

    def _arch(self, key: str, default=None):
        return self.meta.get(f"{self.arch}.{key}", default)

    def hf_config(self) -> dict:
        """The config.json transformers would write for this file's model."""
        tensors = {t.name for t in self._reader.tensors}
        heads = int(self._arch("attention.head_count"))
        hidden = int(self._arch("embedding_length"))
        scaling = self._arch("rope.scaling.type")
        if scaling not in (None, "none"):
            raise ConfigError(f"model.gguf {self.path}: {self.arch}.rope.scaling.type {scaling!r} is not supported; "
                              "allowed: none")
        config = {
            "model_type": ARCHITECTURES[self.arch],
            "hidden_size": hidden,
            "intermediate_size": int(self._arch("feed_forward_length")),
            "num_hidden_layers": int(self._arch("block_count")),
            "num_attention_heads": heads,
            "num_key_value_heads": int(self._arch("attention.head_count_kv", heads)),
            "rms_norm_eps": float(self._arch("attention.layer_norm_rms_epsilon")),
            "rope_theta": float(self._arch("rope.freq_base", 10000.0)),
            "max_position_embeddings": int(self._arch("context_length")),
            "vocab_size": int(self._arch("vocab_size", len(self._field("tokenizer.ggml.tokens", [])))),
            "tie_word_embeddings": "output.weight" not in tensors,
        }
        head_dim = self._arch("attention.key_length")
        if head_dim is not None and int(head_dim) != hidden // heads:
            config["head_dim"] = int(head_dim)
        for key in ("bos", "eos", "pad"):
            token = self._field(f"tokenizer.ggml.{'padding' if key == 'pad' else key}_token_id")
            if token is not None:
                config[f"{key}_token_id"] = int(token)
        return config

    def tensors(self) -> LazyTensors:
        """Every tensor under its Hugging Face name, dequantized to float32 when taken (Llama's q and k rows
        put back in the order transformers' rotary halves use: llama.cpp's converter interleaves them)."""
        from gguf import GGMLQuantizationType
        out = LazyTensors()
        for t in self._reader.tensors:
            kind = GGMLQuantizationType(t.tensor_type).name
            if kind not in READ_TYPES:
                raise WeightError(f"model.gguf {self.path}: tensor {t.name} has type {kind}, which the exporter "
                                  f"cannot read; allowed: {', '.join(READ_TYPES)}")
            out.add(_hf_name(t.name, self.path), functools.partial(self._tensor, t))
        return out

    def _tensor(self, t) -> np.ndarray:
        from gguf.quants import dequantize
        shape = tuple(int(d) for d in reversed(list(t.shape)))
        # read, not through the reader's map of the file: mapped pages once touched stay in the resident
        # set while the reader lives (a 7B float16 file's 13.5 GB, at the end of an export)
        with open(self.path, "rb") as f:
            f.seek(t.data_offset)
            raw = np.fromfile(f, np.uint8, t.n_bytes).view(t.data.dtype).reshape(t.data.shape)
        array = np.asarray(dequantize(raw, t.tensor_type), dtype=np.float32).reshape(shape)
        if self.arch == "llama" and t.name.endswith(("attn_q.weight", "attn_k.weight")):
            heads = int(self._arch("attention.head_count"))
            kv_heads = int(self._arch("attention.head_count_kv", heads))
            array = _unpermute(array, heads if "attn_q" in t.name else kv_heads)
        return array

    def write_tokenizer(self, folder: str) -> List[str]:
        """tokenizer.json, tokenizer_config.json (special tokens, add_bos_token, the chat template) and
        chat_template.jinja into `folder`; returns the paths written."""
        kind = self._field("tokenizer.ggml.model")
        if kind != "gpt2":
            raise ConfigError(f"model.gguf {self.path}: tokenizer.ggml.model {kind!r} is not supported; allowed: "
                              "gpt2 (byte-level BPE); give model.tokenizer (a tokenizer.json) instead")
        tokens: List[str] = self._field("tokenizer.ggml.tokens")
        types = self._field("tokenizer.ggml.token_type") or [1] * len(tokens)
        tokenizer = _byte_level_bpe(tokens, self._field("tokenizer.ggml.merges") or [], types,
                                    self._field("tokenizer.ggml.pre"))
        written = [os.path.join(folder, "tokenizer.json")]
        tokenizer.save(written[0])
        config = {"add_bos_token": bool(self._field("tokenizer.ggml.add_bos_token", False)),
                  "add_eos_token": bool(self._field("tokenizer.ggml.add_eos_token", False))}
        for key, field in (("bos", "bos"), ("eos", "eos"), ("unk", "unknown"), ("pad", "padding")):
            token = self._field(f"tokenizer.ggml.{field}_token_id")
            if token is not None:
                config[f"{key}_token"] = tokens[int(token)]
        template = self.meta.get("tokenizer.chat_template")
        if template:
            written.append(os.path.join(folder, "chat_template.jinja"))
            with open(written[-1], "w", encoding="utf-8") as f:
                f.write(template)
        written.append(os.path.join(folder, "tokenizer_config.json"))
        with open(written[-1], "w", encoding="utf-8") as f:
            json.dump(config, f, indent=2, ensure_ascii=False)
        return written


def _hf_name(name: str, path: str) -> str:
    if name in _MODEL_NAMES:
        return _MODEL_NAMES[name]
    parts = name.split(".", 2)
    if len(parts) == 3 and parts[0] == "blk" and parts[1].isdigit() and parts[2] in _LAYER_NAMES:
        return f"model.layers.{parts[1]}.{_LAYER_NAMES[parts[2]]}"
    raise WeightError(f"model.gguf {path}: tensor {name} has no counterpart in the model; known: "
                      f"{', '.join(_MODEL_NAMES)}, blk.N.{{{', '.join(_LAYER_NAMES)}}}")


def _unpermute(weight: np.ndarray, heads: int) -> np.ndarray:
    """Rows of each head from llama.cpp's interleaved (pairs) order back to halves."""
    rows = weight.shape[0]
    return np.ascontiguousarray(
        weight.reshape(heads, rows // heads // 2, 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape))


def _byte_alphabet() -> Dict[int, str]:
    """GPT-2's printable spelling of each byte (the alphabet byte-level BPE vocabularies are written in)."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    spelled, extra = {}, 0
    for b in range(256):
        if b in keep:
            spelled[b] = chr(b)
        else:
            spelled[b] = chr(256 + extra)
            extra += 1
    return spelled


# Split patterns of llama.cpp's pre-tokenizer names that differ from GPT-2's (as transformers reads them).
_SPLITS = {
    "llama-bpe": r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                 r"|\s*[\r\n]+|\s+(?!\S)|\s+",
    "qwen2": r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
             r"|\s*[\r\n]+|\s+(?!\S)|\s+",
}
_SPLITS["llama3"] = _SPLITS["llama-v3"] = _SPLITS["llama-bpe"]


def _byte_level_bpe(tokens: List[str], merges: List[str], types: List[int], pre: Optional[str]):
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors
    alphabet = _byte_alphabet()
    letters = set(alphabet.values())
    vocab = {}
    for i, token in enumerate(tokens):
        spelled = token if set(token) <= letters else "".join(alphabet[b] for b in token.encode("utf-8"))
        vocab.setdefault(spelled, i)
    pairs = [tuple(m.split(" ", 1)) for m in merges]
    tokenizer = Tokenizer(models.BPE(vocab, pairs))
    if pre in _SPLITS:
        tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(_SPLITS[pre]), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    else:
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    # A control token spelled outside the byte alphabet is a mislabel (it would grow the vocabulary).
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False)
                                  for t, kind in zip(tokens, types) if kind == _CONTROL and set(t) <= letters])
    tokenizer.add_tokens([AddedToken(t, special=False, normalized=False)
                          for t, kind in zip(tokens, types) if kind == _USER_DEFINED and t in vocab])
    return tokenizer
