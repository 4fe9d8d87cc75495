"""Offline exporter: model weights -> prefill + increment MindIR graphs per rank + manifest.json."""
from lite_runtime.contract.families import INCREMENT_MODEL_INPUT_MAP, PREFILL_MODEL_INPUT_MAP

from exporter.config.schema import ExportConfig, config_from_dict, load_config


def export(config):
    """Export `config` (an ExportConfig, a yaml path or a dict); returns the output folder."""
    from exporter.writing.export import export as _export
    if isinstance(config, str):
        config = load_config(config)
    elif isinstance(config, dict):
        config = config_from_dict(config)
    return _export(config)


__all__ = ["export", "ExportConfig", "load_config", "config_from_dict",
           "PREFILL_MODEL_INPUT_MAP", "INCREMENT_MODEL_INPUT_MAP"]
