"""`pipeline(task, model, tokenizer, backend, **kwargs)` in the four upstream forms:

- an export folder (`model="out/llama"`);
- a `(prefill_path, increment_path)` tuple;
- a configured model name (`model="llama2_7b"` with `model_dir=`, the graph paths, or `config=` a yaml);
- an export yaml (`model="run_llama.yaml"`): its `infer:` graph paths, else the export in its output_dir;
- an `InferConfig` (the same as `InferTask.get_infer_task(task, config, tokenizer=...)`).
"""
from __future__ import annotations

import dataclasses
import os
from typing import Union

from lite_runtime.contract.errors import ArtifactError, ConfigError
from lite_runtime.contract.families import family_from_model_name, get_family
from lite_runtime.api.infer_config import InferConfig
from lite_runtime.api.infer_task import InferTask
from lite_runtime.api.generation_options import GenerationOptions

_CONFIG_KEYS = {f.name for f in dataclasses.fields(InferConfig)}
# Generation keywords given at construction (as upstream passes add_special_tokens, is_sample_acceleration):
# the defaults of every call. Not a streamer: one serves one request.
_CALL_KEYS = set(GenerationOptions.keywords())


def pipeline(task: str = "text_generation", model: Union[str, tuple, InferConfig, None] = None,
             tokenizer=None, backend: str = "mslite", **kwargs):
    options = GenerationOptions(**{k: kwargs.pop(k) for k in list(kwargs) if k in _CALL_KEYS})
    if isinstance(model, InferConfig):
        if kwargs:
            raise ConfigError(f"pipeline: with an InferConfig, give settings in it, not as keywords "
                              f"({', '.join(sorted(kwargs))})")
        config = model
    else:
        settings = dict(kwargs, backend=backend)
        yaml_path = settings.pop("config", None)
        if isinstance(model, str) and model.endswith((".yaml", ".yml")):
            yaml_path, model = model, None
        if yaml_path is not None:
            settings.update(_yaml_settings(yaml_path))
        if model is not None or yaml_path is None:
            settings.update(_model_settings(model, settings))
        unknown = sorted(set(settings) - _CONFIG_KEYS)
        if unknown:
            raise ConfigError(f"pipeline: unknown keyword {unknown[0]!r}; allowed: "
                              f"{', '.join(sorted(_CONFIG_KEYS | _CALL_KEYS))}")
        config = InferConfig(**settings)
    generator = InferTask.get_infer_task(task, config, tokenizer=tokenizer)
    generator.options = options
    return generator


def _model_settings(model, settings: dict) -> dict:
    if isinstance(model, (tuple, list)):
        if len(model) != 2:
            raise ConfigError(f"pipeline: model as a tuple must be (prefill_path, increment_path), got {model!r}")
        return {"prefill_model_path": str(model[0]), "increment_model_path": str(model[1])}
    if not isinstance(model, str) or not model:
        raise ConfigError(f"pipeline: model must be an export folder, a (prefill, increment) tuple, a model "
                          f"name or an InferConfig; got {model!r}")
    if os.path.isdir(model):
        return {"model_dir": model}
    if os.sep in model or model.endswith(".mindir") or os.path.splitext(model)[1]:
        raise ArtifactError(f"pipeline: model path {model} does not exist")
    get_family(family_from_model_name(model), source=f"pipeline model {model!r}")
    if not settings.get("model_dir") and not settings.get("prefill_model_path"):
        raise ConfigError(f"pipeline: model name {model!r} needs model_dir= (an export folder) or "
                          "prefill_model_path= and increment_model_path=")
    return {"model_name": model}


def _yaml_settings(path) -> dict:
    """Where the graphs of an export yaml are: its `infer:` copies, else the export in its output_dir."""
    import yaml
    if not isinstance(path, str) or not os.path.isfile(path):
        raise ArtifactError(f"pipeline: config file {path} does not exist")
    with open(path, encoding="utf-8") as f:
        data = yaml.safe_load(f) or {}
    infer = data.get("infer") or {}
    export_first = f"export first: python -m exporter --config {path}"
    paths = {k: infer.get(k) for k in ("prefill_model_path", "increment_model_path")}
    if any(paths.values()):
        for key, graph in paths.items():
            if not graph:
                raise ConfigError(f"{path}: infer.{key} is missing (the infer section names only one graph)")
        for key, graph in paths.items():
            if not os.path.isfile(graph):
                raise ArtifactError(f"{path}: infer.{key} {graph} does not exist; {export_first}")
        settings = dict(paths)
    else:
        folder = data.get("output_dir") or "./output"
        if not os.path.isfile(os.path.join(folder, "manifest.json")):
            raise ArtifactError(f"{path} names no graphs (infer.prefill_model_path, infer.increment_model_path) and "
                                f"its output_dir {folder} holds no export; {export_first}")
        settings = {"model_dir": folder}
    for key in ("infer_seq_length", "ge_config_path"):
        if infer.get(key):
            settings[key] = infer[key]
    return settings
