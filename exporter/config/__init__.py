"""The export yaml: its schema (schema.py) and the MindFormers run-yaml translation (mindformers.py)."""
from exporter.config.schema import ExportConfig, config_from_dict, find_model_dir_config, load_config

__all__ = ["ExportConfig", "config_from_dict", "find_model_dir_config", "load_config"]
