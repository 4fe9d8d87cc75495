"""The per-family graph input spec: the one place exporter and runtime agree on graph inputs.

`PREFILL_MODEL_INPUT_MAP`, `INCREMENT_MODEL_INPUT_MAP` (exporter side, upstream names) and
`InputOfInfer.MAPPING` (runtime side) are all derived from `FAMILIES`, so they cannot drift.

Graph inputs of a decoder family, `io` kv mode (see docs/architecture.md):
  prefill:   input_ids (B, S) int32, batch_valid_length (B,) int32
  increment: input_ids (B, 1) int32, batch_valid_length (B,) int32,
             key_cache_{l}, value_cache_{l} (B, kv_heads_per_rank, S, head_dim) for each layer l
`batch_valid_length` counts the row's tokens including the ones in this call, so the
increment token sits at position `batch_valid_length - 1`.
Outputs: logits (B, vocab) float32, then (io mode) key_new_{l}, value_new_{l} per layer:
(B, kv_heads_per_rank, S, head_dim) from prefill, (B, kv_heads_per_rank, 1, head_dim) from increment.
In `in_graph` mode the cache is graph state and neither graph has cache inputs or outputs.

The `packed` kv mode has one graph, `step`, for prefill and decode alike; it takes N tokens of any
rows in one list (N chosen per call, -1 below), so a call computes each token once, whichever rows it
belongs to (continuous batching: a prompt joining rows that decode costs its own tokens, an idle row
nothing):
  step: input_ids (N,) int32, token_rows (N,) int32 (each token's row), token_positions (N,) int32,
        past_length (B,) int32, last_token (L,) int32 (indices in the list of the L tokens whose
        logits are returned: each row's last, and several of a row's to verify speculated tokens;
        exports before this contract take exactly B),
        key_cache_{l} (B, kv_heads_per_rank, head_dim, P), value_cache_{l} (B, kv_heads_per_rank, P, head_dim)
  outputs: logits (L, vocab), key_new_{l} and value_new_{l} (N, kv_heads_per_rank, head_dim)
Keys are stored transposed: scores are then a plain matrix product, which Lite 2.0 runs several times
faster than one that transposes the cache on every call. P may be larger than any row's past (a
bucket) and is at least 1 (Lite refuses zero-size dimensions).
A token sees its row's first `past_length` cached positions and the call's tokens of its row at
positions up to its own; the host writes each token's new K/V at its row and position.

A family whose graphs need more than token ids and lengths declares per-row inputs
(`FamilySpec.row_inputs`, each (B,) int32), placed right after the lengths (after past_length in
`step`) in every graph kind; its feed builder (lite_runtime/decode/inputs.py) makes them on the
host. GLM (ChatGLM-6B): `context_length` (index of <sop> in the row: keys before it are seen by every
query, and tokens from it on take the 2-D positions of generated text) and `mask_position` (index of
[gMASK], else [MASK]: the position id of <sop> and every generated token).

SLoRA exports (graph_dims.adapter_slots > 0) take `adapter_ids (B,) int32` after those (right after
the lengths for other families), before the caches: each row's adapter slot, 0 = the base model.
The one order: input_ids, batch_valid_length, row inputs, [adapter_ids], caches
(packed: input_ids, token_rows, token_positions, past_length, last_token, row inputs, [adapter_ids], caches).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Mapping, Optional, Tuple

from lite_runtime.contract.errors import UnsupportedError

KV_MODES = ("io", "in_graph", "packed")
GRAPH_KINDS = ("prefill", "increment")
STEP = "step"                 # the one graph of the packed kv mode
DYNAMIC = -1                  # a dimension chosen per call
PACKED_INPUTS = ("token_rows", "token_positions", "past_length", "last_token")   # after input_ids


def graph_kinds(kv_mode: str) -> Tuple[str, ...]:
    """The graphs an export of this kv mode has."""
    return (STEP,) if kv_mode == "packed" else GRAPH_KINDS


@dataclass(frozen=True)
class TensorSpec:
    """Name, dtype (numpy name) and shape of one graph input or output."""
    name: str
    dtype: str
    shape: Tuple[int, ...]

    def to_json(self) -> dict:
        return {"name": self.name, "dtype": self.dtype, "shape": list(self.shape)}

    @classmethod
    def from_json(cls, data: dict) -> "TensorSpec":
        return cls(str(data["name"]), str(data["dtype"]), tuple(int(d) for d in data["shape"]))


KV_BLOCK = 16     # positions a block of the paged store holds (`attention: paged`)
# What the paged store may hold (the runtime's kv_cache_dtype); the first is the default: llama.cpp's, half the
# bytes, top-1 99.9 % of float32's; int8: a scale per 32 values of a position and head (llama.cpp's q8_0).
KV_CACHE_DTYPES = ("float16", "float32", "int8")


@dataclass(frozen=True)
class GraphDims:
    """The sizes that fix every graph tensor's shape on one rank (stored in the manifest)."""
    batch_size: int
    seq_length: int
    num_layers: int
    kv_heads_per_rank: int
    head_dim: int
    vocab_size: int
    adapter_slots: int = 0    # SLoRA exports: adapters + 1 (slot 0, the base model); 0 without
    hidden_size: int = 0      # the segment form's hidden-state tensors (segments.py)
    rotary: int = 0           # 1: positions rotate q/k (the segment form passes cos/sin between segments)
    kv_block: int = 0         # the packed step's K/V in the kernels' paged store, blocks of this many positions
                              # (`attention: paged`); 0: host arrays fed and returned by the step

    @property
    def kv_blocks_per_row(self) -> int:
        """The columns of the paged step's block tables: blocks for seq_length positions."""
        return -(-self.seq_length // self.kv_block)

    def to_json(self) -> dict:
        return dict(self.__dict__)

    @classmethod
    def from_json(cls, data: dict) -> "GraphDims":
        return cls(**{f: int(data[f]) for f in cls.__dataclass_fields__ if f in data})


@dataclass(frozen=True)
class FamilySpec:
    """What a family's graphs take and return; the decode loop is the same for all decoder families."""
    name: str
    aliases: Tuple[str, ...] = ()          # other names users write (upstream model_name prefixes)
    token_input: str = "input_ids"
    length_input: str = "batch_valid_length"
    row_inputs: Tuple[str, ...] = ()       # the family's own (B,) int32 inputs, after the lengths (its feed builder's)
    # The special tokens whose places in a prompt give the row inputs: (name, upstream's id). The
    # export's own ids are in its manifest's model_config under these names (`token_ids`).
    row_input_tokens: Tuple[Tuple[str, int], ...] = ()

    def token_ids(self, config: Optional[Mapping[str, object]]) -> Dict[str, int]:
        """The ids of `row_input_tokens` in `config` (a manifest's model_config, or the exporter's
        model keys), upstream's where it has none."""
        config = config or {}
        return {name: int(config[name]) if config.get(name) is not None else default
                for name, default in self.row_input_tokens}

    @property
    def whole_prompts(self) -> bool:
        """A prompt goes to the graph in one call, never in chunks: the family's prompt attends both
        ways (GLM's prefix; its row inputs are where the prefix ends)."""
        return bool(self.row_inputs)

    def inputs(self, kind: str, kv_mode: str, dims: GraphDims) -> List[TensorSpec]:
        _check_kind(kind, kv_mode)
        adapters = [TensorSpec("adapter_ids", "int32", (dims.batch_size,))] if dims.adapter_slots else []
        rows = [TensorSpec(name, "int32", (dims.batch_size,)) for name in self.row_inputs]
        if kind == STEP:
            per_call = ("token_rows", "token_positions", "last_token")
            return [TensorSpec(self.token_input, "int32", (DYNAMIC,))] + \
                [TensorSpec(n, "int32", (DYNAMIC,) if n in per_call else (dims.batch_size,)) for n in PACKED_INPUTS] \
                + rows + adapters + self._step_cache_specs(dims)
        steps = dims.seq_length if kind == "prefill" else 1
        specs = [TensorSpec(self.token_input, "int32", (dims.batch_size, steps)),
                 TensorSpec(self.length_input, "int32", (dims.batch_size,))] + rows + adapters
        if kind == "increment" and kv_mode == "io":
            specs += self._cache_specs("cache", dims, dims.seq_length)
        return specs

    def outputs(self, kind: str, kv_mode: str, dims: GraphDims) -> List[TensorSpec]:
        _check_kind(kind, kv_mode)
        specs = [TensorSpec("logits", "float32", (dims.batch_size, dims.vocab_size))]
        if kind == STEP:
            token = (DYNAMIC, dims.kv_heads_per_rank, dims.head_dim)
            specs = [TensorSpec("logits", "float32", (DYNAMIC, dims.vocab_size))]
            if not dims.kv_block:       # the paged store is written by the attention node itself
                specs += [TensorSpec(f"{part}_new_{layer}", "float32", token)
                          for layer in range(dims.num_layers) for part in ("key", "value")]
        elif kv_mode == "io":
            rows = dims.seq_length if kind == "prefill" else 1
            specs += self._cache_specs("new", dims, rows)
        return specs

    def input_names(self, kind: str) -> Tuple[str, ...]:
        """The non-cache input names of the two-graph forms, in graph order (the upstream-style input maps)."""
        return (self.token_input, self.length_input) + self.row_inputs

    @classmethod
    def _step_cache_specs(cls, dims: GraphDims) -> List[TensorSpec]:
        """The step's caches per layer, or with the paged store each row's block ids and the store's id."""
        if dims.kv_block:
            return [TensorSpec("block_tables", "float32", (dims.batch_size, dims.kv_blocks_per_row)),
                    TensorSpec("kv_store", "float32", (1,))]
        return cls._cache_specs("cache", dims, DYNAMIC, keys_transposed=True)

    @staticmethod
    def _cache_specs(suffix: str, dims: GraphDims, rows: int, keys_transposed: bool = False) -> List[TensorSpec]:
        shape = (dims.batch_size, dims.kv_heads_per_rank, rows, dims.head_dim)
        key_shape = shape[:2] + (dims.head_dim, rows) if keys_transposed else shape
        specs = []
        for layer in range(dims.num_layers):
            specs.append(TensorSpec(f"key_{suffix}_{layer}", "float32", key_shape))
            specs.append(TensorSpec(f"value_{suffix}_{layer}", "float32", shape))
        return specs


def _check_kind(kind: str, kv_mode: str) -> None:
    if kv_mode not in KV_MODES:
        raise UnsupportedError(f"kv_cache {kv_mode!r} is not supported; allowed: {', '.join(KV_MODES)}")
    if kind not in graph_kinds(kv_mode):
        raise ValueError(f"graph kind {kind!r} is not one of {graph_kinds(kv_mode)} (kv_cache {kv_mode})")


# GLM v1 (ChatGLM-6B; glm_6b, chatglm_6b): 2-D rotary positions and prefix attention from two per-row inputs,
# found at [MASK] / [gMASK] (GLMConfig's ids by default) and <sop> (the export's bos_token_id).
GLM = FamilySpec("glm", aliases=("chatglm",), row_inputs=("context_length", "mask_position"),
                 row_input_tokens=(("mask_token_id", 130000), ("gmask_token_id", 130001)))

# The families the runtime serves, with the names users write for them (upstream: the part of
# model_name before the first '_'). Names of one architecture are one family with aliases.
FAMILIES: Dict[str, FamilySpec] = {spec.name: spec for spec in (
    FamilySpec("llama", aliases=("llama2", "llama3", "codellama")),
    FamilySpec("bloom"),
    FamilySpec("gpt2"),
    FamilySpec("internlm"),
    FamilySpec("baichuan2"),
    FamilySpec("glm2", aliases=("glm3", "chatglm2", "chatglm3")),
    FamilySpec("qwen", aliases=("qwen1.5", "qwen1", "qwen2")),    # qwen1: upstream's qwen1_5_7b, ...
    GLM,
    FamilySpec("pangualpha"),   # pangualpha_2_6b, pangualpha_13b; its top query layer's cache is the last pair
)}
_BY_NAME: Dict[str, FamilySpec] = {n: spec for spec in FAMILIES.values() for n in (spec.name,) + spec.aliases}

PREFILL_MODEL_INPUT_MAP: Dict[str, Tuple[str, ...]] = {
    name: spec.input_names("prefill") for name, spec in _BY_NAME.items()}
INCREMENT_MODEL_INPUT_MAP: Dict[str, Tuple[str, ...]] = {
    name: spec.input_names("increment") for name, spec in _BY_NAME.items()}


def known_families() -> str:
    """'bloom, gpt2, llama (llama2, llama3, codellama)' for messages."""
    return ", ".join(s.name + (f" ({', '.join(s.aliases)})" if s.aliases else "")
                     for s in sorted(FAMILIES.values(), key=lambda s: s.name))


def family_from_model_name(model_name: str) -> str:
    """Upstream convention: `llama2_7b` -> `llama2`. Exact lookup only, no prefix matching."""
    return model_name.split("_")[0]


def get_family(name: str, source: str = "model name") -> FamilySpec:
    """The family a name or alias stands for."""
    try:
        return _BY_NAME[name]
    except KeyError:
        raise UnsupportedError(f"unknown model family {name!r} (from {source}); known families: "
                               f"{known_families()}") from None
