"""The sizes an export's form is decided by once the model is known (exporter/writing/export_plan.py):
whether `target: cpu` writes one rank's step as segments because it would not fit one `.ms`, how many
layers each of them holds, and the exporting MindSpore, which must be one whose MindIR Lite 2.0 reads.
"""
from __future__ import annotations

from exporter.models.config import DecoderConfig

# Lite 2.0 writes a model's weights into its .ms flatbuffer only up to 2 GB; a larger one comes out as
# .ms + .msw, which Lite loads at 2.0x the weights, where segments with the weight release load at 1.15x.
LITE_MS_LIMIT = 2 * 1024 ** 3


# One rank's segments hold whole layers up to this size each. Measured at 1.1B (3 layers per segment
# here): steps as fast as with 6 (1 GiB), whose export peaked 1 GB higher (1.57x the weights, 1.33x here).
SEGMENT_BYTES = 512 * 1024 ** 2


def block_weights(cfg: DecoderConfig) -> int:
    """Weights of one layer, biases and norms left out (under 0.1 %)."""
    attn = cfg.hidden_size * cfg.head_dim * 2 * (cfg.n_heads + cfg.n_kv_heads)
    return attn + (3 if cfg.mlp == "swiglu" else 2) * cfg.hidden_size * cfg.intermediate_size


def weight_bytes(cfg: DecoderConfig, dtype_bytes: int = 4) -> int:
    """The decoder's weights counted from its sizes (biases and norms left out: under 0.1 %)."""
    tables = cfg.vocab_size * cfg.hidden_size * (1 if cfg.tie_word_embeddings else 2)
    position_tables = int(cfg.positions == "learned") + int(cfg.top_query)
    tables += (cfg.max_position_embeddings or 0) * cfg.hidden_size * position_tables
    return dtype_bytes * (cfg.num_layers * block_weights(cfg) + tables)


def blocks_per_segment(cfg: DecoderConfig, world_size: int) -> int:
    """Whole layers per segment of one rank's step (float32), 0 for several ranks (they reduce
    between attention and MLP)."""
    return max(1, SEGMENT_BYTES // (4 * block_weights(cfg))) if world_size == 1 else 0


def mindspore_version() -> tuple:
    import mindspore as ms
    return tuple(int(p) for p in ms.__version__.split(".")[:2])
