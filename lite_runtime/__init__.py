"""Deployment runtime: loads an export's graphs with MindSpore Lite (or MindSpore), decodes, samples,
streams. Never imports the exporter; imports mindspore only inside the `ms` backend.

Public names are imported lazily, so the light contract modules (families, manifest, errors)
stay cheap to import for the exporter. Except `pipeline`, which is also its submodule's name:
importing `lite_runtime.pipeline` binds the package attribute to the module, so
`from lite_runtime import pipeline` would give the module. It is bound eagerly (numpy, no mindspore).
"""
import importlib

_PUBLIC = {"InferConfig": "infer_config", "InferTask": "infer_task", "InputOfInfer": "inputs",
           "BaseInputsOfInfer": "inputs", "CommonInputsOfInfer": "inputs", "LlamaInputsOfInfer": "inputs",
           "ToolchainError": "errors"}


def __getattr__(name):
    if name in _PUBLIC:
        return getattr(importlib.import_module(f".{_PUBLIC[name]}", __name__), name)
    raise AttributeError(f"module 'lite_runtime' has no attribute {name!r}")


__all__ = list(_PUBLIC) + ["pipeline"]

from .pipeline import pipeline  # noqa: E402  (after __getattr__: the modules it imports may use it)
