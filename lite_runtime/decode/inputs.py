"""`InputOfInfer`: per-family builders of the graph feeds, derived from the family spec.

Upstream users know `InputOfInfer.get_inputs(model_name, ...)` and its `MAPPING`; here every
decoder family shares the decode loop, so the classes differ only in their spec, and the mapping
is generated from `families.FAMILIES` (no family can be missing or mapped twice).
"""
from __future__ import annotations

from typing import Dict, List, Type

import numpy as np

from lite_runtime.contract.families import FAMILIES, FamilySpec, family_from_model_name, get_family


class BaseInputsOfInfer:
    """Builds the non-cache feeds of both graphs, in the family's graph input order."""

    spec: FamilySpec = None

    def prefill_inputs(self, input_ids: np.ndarray, valid_length: np.ndarray) -> List[np.ndarray]:
        raise NotImplementedError

    def decode_inputs(self, step_ids: np.ndarray, valid_length: np.ndarray) -> List[np.ndarray]:
        raise NotImplementedError

    def get_inputs(self, input_ids: np.ndarray, valid_length: np.ndarray, is_first_iteration: bool):
        """Upstream-style entry: prefill feeds on the first iteration, decode feeds after."""
        if is_first_iteration:
            return self.prefill_inputs(input_ids, valid_length)
        return self.decode_inputs(input_ids, valid_length)


class CommonInputsOfInfer(BaseInputsOfInfer):
    """Token ids + per-row valid length: what every decoder family of the registry takes.

    The arrays are passed through without copying; the decode loop owns them.
    """

    def prefill_inputs(self, input_ids, valid_length):
        return [input_ids, valid_length]

    def decode_inputs(self, step_ids, valid_length):
        return [step_ids, valid_length]


class LlamaInputsOfInfer(CommonInputsOfInfer):
    spec = FAMILIES["llama"]


def _inputs_class(name: str) -> Type[BaseInputsOfInfer]:
    if name == "llama":
        return LlamaInputsOfInfer
    return type(f"{name.capitalize()}InputsOfInfer", (CommonInputsOfInfer,), {"spec": FAMILIES[name]})


_CLASSES = {name: _inputs_class(name) for name in FAMILIES}


class InputOfInfer:
    """Family name or alias -> inputs class, e.g. `InputOfInfer.get_inputs("llama2_7b")`."""

    MAPPING: Dict[str, Type[BaseInputsOfInfer]] = {
        alias: _CLASSES[spec.name] for spec in FAMILIES.values() for alias in (spec.name,) + spec.aliases}

    @classmethod
    def get_inputs(cls, model_name: str) -> BaseInputsOfInfer:
        spec = get_family(family_from_model_name(model_name), source=f"model_name {model_name!r}")
        return _CLASSES[spec.name]()
