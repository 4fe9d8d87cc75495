"""The form of an export: what its `target` leaves open until the model is known, and the words of
the export's last line.

`ExportConfig` chooses what it can from the yaml alone (`_choose_form`); `target: cpu` waits for the
model to decide whether one rank's step is written as segments because it would not fit one `.ms`,
and for the exporting MindSpore, which must be one whose MindIR Lite 2.0 reads.
"""
from __future__ import annotations

from exporter.config.schema import ExportConfig
from exporter.models.config import DecoderConfig
from lite_runtime.contract.errors import ConfigError
from lite_runtime.contract.manifest import Manifest
from lite_runtime.contract.mindir import FIRST_UNREADABLE_MINDSPORE

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


def settle_form(config: ExportConfig, cfg: DecoderConfig) -> None:
    """What `target: cpu` needs of the exporting MindSpore, and its choice that needs the model's sizes."""
    if config.target == "cpu" and mindspore_version() >= FIRST_UNREADABLE_MINDSPORE:
        import mindspore as ms
        raise ConfigError(f"{config.source}: target cpu writes the form of MindSpore Lite 2.0 on CPU, which reads only "
                          f"MindIR of MindSpore 2.0; this is MindSpore {ms.__version__}: export with the MindSpore 2.0 "
                          "environment (make export-lite), or give no target for backend ms")
    if config.segments_by_size and config.compute_dtype == "float32" and weight_bytes(cfg) > LITE_MS_LIMIT:
        config.parallel.collectives = "host"


def _infer_copies(config: ExportConfig) -> bool:
    return bool(config.infer.prefill_model_path or config.infer.increment_model_path)


def removes_mindir(config: ExportConfig) -> bool:
    """Whether the graphs' MindIR is only the input of Lite's converter, removed once each graph is a
    `.ms`: so for `target: cpu`, whose runtime loads the `.ms` (the `ms` backend runs no MindSpore 2.0
    MindIR), unless the yaml asks for upstream's infer: copies, which are copies of the MindIR."""
    return bool(config.lite_ms) and config.target == "cpu" and not _infer_copies(config)


def mindir_kept(config: ExportConfig) -> str:
    """Why an export with `.ms` models keeps their MindIR beside them (the manifest's `mindir_kept`);
    '' when it has no `.ms` (the MindIR is what runs) or removes the MindIR (`removes_mindir`)."""
    if not config.lite_ms or removes_mindir(config):
        return ""
    if _infer_copies(config):
        return "the infer: copies (prefill_model_path, increment_model_path) are copies of the MindIR graphs"
    return ("lite_ms: true without target: cpu keeps both forms: the runtime loads the .ms, "
            "lite_format 'mindir' the MindIR")


def describe_form(config: ExportConfig, manifest: Manifest) -> str:
    """Which graphs the export holds and why, for its last line."""
    if config.parallel.collectives == "host":
        form = f"kv_cache {config.kv_cache} as step segments per rank"
    else:
        form = {"io": "kv_cache io: prefill + increment graphs, each with its own copy of the weights",
                "in_graph": "kv_cache in_graph: prefill + increment graphs holding the cache",
                "dynamic": "kv_cache dynamic: one step graph",
                "packed": "kv_cache packed: one step graph over a list of tokens of any rows"}[config.kv_cache]
    if manifest.lite_files:
        form += ", converted to Lite's .ms"
    if manifest.external_data:
        form += ", weights as external data"
    if config.target:
        form += f", for target {config.target}"
    return form
