"""Deployment runtime: loads an export's graphs with MindSpore Lite (or MindSpore), decodes, samples,
streams. Never imports the exporter; imports mindspore only inside the `ms` backend.

Public names are imported lazily, so the light contract modules (families, manifest, errors)
stay cheap to import for the exporter.
"""
import importlib

_PUBLIC = {"InferConfig": "infer_config", "InferTask": "infer_task", "InputOfInfer": "inputs",
           "BaseInputsOfInfer": "inputs", "CommonInputsOfInfer": "inputs", "LlamaInputsOfInfer": "inputs",
           "pipeline": "pipeline", "ToolchainError": "errors"}


def __getattr__(name):
    if name in _PUBLIC:
        return getattr(importlib.import_module(f".{_PUBLIC[name]}", __name__), name)
    raise AttributeError(f"module 'lite_runtime' has no attribute {name!r}")


__all__ = list(_PUBLIC)
