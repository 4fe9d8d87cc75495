"""Deployment runtime: loads an export's graphs with MindSpore Lite (or MindSpore), decodes, samples,
streams. Never imports the exporter; imports mindspore only inside the `ms` backend.

Public names are resolved lazily, so importing a light module (`lite_runtime.contract.errors`)
loads nothing else of the runtime.
"""
import importlib

_PUBLIC = {"pipeline": "api.pipeline", "InferConfig": "api.infer_config", "InferTask": "api.infer_task",
           "TextGeneratorInfer": "api.text_generator", "InputOfInfer": "decode.inputs",
           "BaseInputsOfInfer": "decode.inputs", "CommonInputsOfInfer": "decode.inputs",
           "LlamaInputsOfInfer": "decode.inputs", "ToolchainError": "contract.errors"}


def __getattr__(name):
    if name in _PUBLIC:
        return getattr(importlib.import_module(f".{_PUBLIC[name]}", __name__), name)
    raise AttributeError(f"module 'lite_runtime' has no attribute {name!r}")


__all__ = list(_PUBLIC)
