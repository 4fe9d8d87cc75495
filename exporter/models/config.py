"""`DecoderConfig`: one decoder-only transformer described by its sizes and its features.

Families translate their own config files into this; the building blocks are chosen from the
feature fields (norm, positions, score bias, MLP, biases, head), never from a family name.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Optional

from lite_runtime.contract.errors import ConfigError

NORMS = ("rms", "layer")
MLPS = ("swiglu", "gelu_tanh", "gelu", "fast_gelu")
POSITIONS = ("rotary", "learned", "none", "rotary_2d")


@dataclass(frozen=True)
class DecoderConfig:
    vocab_size: int
    hidden_size: int
    num_layers: int
    n_heads: int
    intermediate_size: int
    n_kv_heads: Optional[int] = None          # None: as many as n_heads (MHA); fewer: GQA/MQA
    norm: str = "rms"                          # rms | layer (LayerNorm with bias)
    norm_eps: float = 1e-5
    positions: str = "rotary"                  # rotary | learned (absolute table) | none | rotary_2d (GLM v1:
                                               # each half of a head rotate-half rotated by its own id, the
                                               # position and the block position, from per-row graph inputs)
    rope_theta: float = 10000.0
    rotary_fraction: float = 1.0               # share of each head's dims that rotate
    rotary_interleaved: bool = False           # pairs (0,1),(2,3)... instead of rotate-half
    rotary_fp16_tables: bool = False           # angles and cos/sin rounded to float16 as ChatGLM-6B makes them
    max_position_embeddings: Optional[int] = None   # size of the learned table; a limit for rotary
    seq_length_limit: Optional[int] = None     # longest sequence the built math is exact for (dynamic NTK
                                               # rotary scaling, e.g. InternLM's, changes positions past it)
    seq_length_limit_by: Optional[str] = None  # the refusal's reason: "past which <this>; export with ..."
    alibi: bool = False                        # ALiBi score bias (Bloom, Baichuan2 13B)
    mlp: str = "swiglu"                        # swiglu | gelu_tanh | gelu (exact, erf) | fast_gelu (x·σ(1.702x))
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    embed_norm: bool = False                   # LayerNorm right after the word embedding (Bloom)
    tie_word_embeddings: bool = False
    top_query: bool = False                    # PanGu-α: the last of num_layers is a top query layer (its query a
                                               # learned embedding of the position, models/top_query.py) after
                                               # the final norm; it has a KV cache like a block
    prefix_attention: bool = False             # GLM v1: keys before each row's context_length (a graph input)
                                               # are seen by every query (the prompt is bidirectional)
    deepnorm: bool = False                     # GLM v1: x = n·alpha + attn(n), n = attn_norm(x); then
                                               # m = mlp_norm(x), out = m·alpha + mlp(m); alpha = sqrt(2·num_layers)

    def __post_init__(self):
        if self.n_kv_heads is None:
            object.__setattr__(self, "n_kv_heads", self.n_heads)
        for name, allowed in (("norm", NORMS), ("mlp", MLPS), ("positions", POSITIONS)):
            if getattr(self, name) not in allowed:
                raise ConfigError(f"model.{name} {getattr(self, name)!r} is not allowed; allowed: {', '.join(allowed)}")
        for name in ("vocab_size", "hidden_size", "num_layers", "n_heads", "n_kv_heads", "intermediate_size"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise ConfigError(f"model.{name} must be a positive integer, got {getattr(self, name)!r}")
        if self.hidden_size % self.n_heads:
            raise ConfigError(f"model.hidden_size {self.hidden_size} is not divisible by model.n_heads {self.n_heads}")
        if self.n_heads % self.n_kv_heads:
            raise ConfigError(f"model.n_heads {self.n_heads} is not a multiple of model.n_kv_heads {self.n_kv_heads}")
        if self.positions in ("rotary", "rotary_2d") and (self.rotary_dim < 2 or self.rotary_dim % 2):
            raise ConfigError(f"rotary dims {self.rotary_dim} (head_dim {self.head_dim} x rotary_fraction "
                              f"{self.rotary_fraction}) must be a positive even number")
        if self.positions == "rotary_2d" and self.head_dim % 4:
            raise ConfigError(f"2-D rotary needs a head_dim divisible by 4 (two rotated halves), got {self.head_dim}")
        if self.prefix_attention and self.positions != "rotary_2d":
            raise ConfigError("prefix attention comes with 2-D positions (positions rotary_2d, the glm family) only")
        if self.positions == "learned" and not self.max_position_embeddings:
            raise ConfigError("model.max_position_embeddings is required for learned absolute positions")
        if self.top_query and not self.max_position_embeddings:
            raise ConfigError("model.max_position_embeddings is required for the top query layer (its query table)")

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.n_heads

    @property
    def num_blocks(self) -> int:
        """Decoder blocks before the final norm: num_layers, less the top query layer if there is one.
        Every one of num_layers has a KV cache (GraphDims.num_layers counts them all)."""
        return self.num_layers - 1 if self.top_query else self.num_layers

    @property
    def group(self) -> int:
        """Query heads per KV head."""
        return self.n_heads // self.n_kv_heads

    @property
    def rotary_dim(self) -> int:
        """Rotated dims (per half with rotary_2d, where each half rotates whole)."""
        if self.positions == "rotary_2d":
            return self.head_dim // 2
        return int(self.head_dim * self.rotary_fraction)

    @property
    def row_inputs(self) -> int:
        """Per-row graph inputs the network takes after the lengths (GLM: context_length, mask_position)."""
        return 2 if self.positions == "rotary_2d" else 0

    @property
    def deepnorm_alpha(self) -> float:
        return float((2.0 * self.num_layers) ** 0.5)

    def check_world_size(self, world_size: int) -> None:
        """Tensor parallelism splits whole KV-head groups, MLP columns and vocabulary rows."""
        for what, size in (("n_heads", self.n_heads), ("n_kv_heads", self.n_kv_heads),
                           ("intermediate_size", self.intermediate_size), ("vocab_size", self.vocab_size)):
            if size % world_size:
                raise ConfigError(f"parallel.model_parallel {world_size} does not divide model.{what} {size}; "
                                  f"choose a model_parallel that divides n_heads, n_kv_heads, "
                                  f"intermediate_size and vocab_size")

    def check_seq_length(self, seq_length: int) -> None:
        limit = self.max_position_embeddings
        if (self.positions == "learned" or self.top_query) and seq_length > limit:
            raise ConfigError(f"seq_length {seq_length} exceeds the model's learned position table "
                              f"(max_position_embeddings {limit}); export with seq_length <= {limit}")
        if self.seq_length_limit is not None and seq_length > self.seq_length_limit:
            by = self.seq_length_limit_by or "the model's dynamic rotary scaling changes every position"
            raise ConfigError(f"seq_length {seq_length} exceeds {self.seq_length_limit}, past which {by}; "
                              f"export with seq_length <= {self.seq_length_limit}")

    def to_json(self) -> dict:
        data = asdict(self)
        data["head_dim"] = self.head_dim
        return data

    @classmethod
    def from_json(cls, data: dict) -> "DecoderConfig":
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})
