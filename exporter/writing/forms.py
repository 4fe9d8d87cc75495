"""The sizes an export's form is decided by once the model is known (exporter/writing/export_plan.py):
whether `target: cpu` writes one rank's step as segments because its weights as stored (quantized or not)
would not fit one `.ms`, how many layers each of them holds, and the exporting MindSpore, which must be one
whose MindIR Lite 2.0 reads.
"""
from __future__ import annotations

from dataclasses import dataclass

from exporter.models.config import DecoderConfig

# Lite 2.0 writes a model's weights into its .ms flatbuffer only up to 2 GB; a larger one comes out as
# .ms + .msw, which Lite loads at 2.0x the weights, where segments with the weight release load at 1.15x.
LITE_MS_LIMIT = 2 * 1024 ** 3


# One rank's segments hold whole layers up to this size each. Measured at 1.1B (3 layers per segment
# here): steps as fast as with 6 (1 GiB), whose export peaked 1 GB higher (1.57x the weights, 1.33x here).
SEGMENT_BYTES = 512 * 1024 ** 2


@dataclass(frozen=True)
class StoredBytes:
    """Bytes a weight is stored in: the linear layers', the token embedding's and the head's (float32 4,
    int8 1 and a float16 scale a group (per channel: 1); int4 half a byte and a float16 scale and min a
    group)."""
    layers: float = 4.0
    embedding: float = 4.0
    head: float = 4.0

    @classmethod
    def of(cls, weights: str, group_size: int, embedding: str, head: str) -> "StoredBytes":
        per = {"int8": 1.0 + max(0.0, 2 / group_size), "int4": 0.5 + 4 / group_size}
        return cls(per.get(weights, 4.0), per.get(embedding, 4.0), per.get(head, 4.0))


def block_weights(cfg: DecoderConfig) -> int:
    """Weights of one layer, biases and norms left out (under 0.1 %)."""
    attn = cfg.hidden_size * cfg.head_dim * 2 * (cfg.n_heads + cfg.n_kv_heads)
    return attn + (3 if cfg.mlp == "swiglu" else 2) * cfg.hidden_size * cfg.intermediate_size


def weight_bytes(cfg: DecoderConfig, stored: StoredBytes = StoredBytes()) -> int:
    """The decoder's weights as stored, counted from its sizes (biases and norms left out: under 0.1 %);
    a tied head stored as its embedding is one table."""
    table = cfg.vocab_size * cfg.hidden_size
    tables = table * stored.embedding
    if not (cfg.tie_word_embeddings and stored.head == stored.embedding):
        tables += table * stored.head
    position_tables = int(cfg.positions == "learned") + int(cfg.top_query)
    tables += 4 * (cfg.max_position_embeddings or 0) * cfg.hidden_size * position_tables
    return int(cfg.num_layers * block_weights(cfg) * stored.layers + tables)


def blocks_per_segment(cfg: DecoderConfig, world_size: int, stored: StoredBytes = StoredBytes()) -> int:
    """Whole layers per segment of one rank's step (up to SEGMENT_BYTES as stored: a quantized model's
    segments hold more layers, and each Predict of a segment costs the step a hand-over between threads),
    0 for several ranks (they reduce between attention and MLP)."""
    return max(1, int(SEGMENT_BYTES // (stored.layers * block_weights(cfg)))) if world_size == 1 else 0


def mindspore_version() -> tuple:
    import mindspore as ms
    return tuple(int(p) for p in ms.__version__.split(".")[:2])
