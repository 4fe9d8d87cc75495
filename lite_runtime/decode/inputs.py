"""`InputOfInfer`: per-family builders of the graph feeds, derived from the family spec.

Upstream users know `InputOfInfer.get_inputs(model_name, ...)` and its `MAPPING`; here every
decoder family shares the decode loop, so the classes differ only in their spec, and the mapping
is generated from `families.FAMILIES` (no family can be missing or mapped twice). A family whose
graphs take per-row inputs of their own (`FamilySpec.row_inputs`) has its own builder here, made
with the export's manifest (the special ids it reads are recorded there).
"""
from __future__ import annotations

from typing import Dict, List, Optional, Type

import numpy as np

from lite_runtime.contract.errors import ValidationError
from lite_runtime.contract.families import FAMILIES, GLM, FamilySpec, family_from_model_name, get_family


class BaseInputsOfInfer:
    """Builds the non-cache feeds of both graphs, in the family's graph input order. `manifest`:
    the export's, for builders that read its special ids (None: the family's upstream defaults)."""

    spec: FamilySpec = None

    def __init__(self, manifest=None):
        self.manifest = manifest

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


class GlmInputsOfInfer(CommonInputsOfInfer):
    """GLM v1 (ChatGLM-6B): each row's `context_length` and `mask_position`, found in its prompt at
    prefill and fed unchanged on every decode step (the graph derives each token's 2-D position from
    them and its own index, so nothing advances on the host and no mask array is built).

    As MindFormers' GLMForPreTraining (get_position_ids_np / get_masks_np): context_length is the
    index of <sop> (the bos id) in the row; mask_position the index of [gMASK], else of [MASK].
    Token t has position t and block position 0 before context_length, position mask_position and
    block position t - context_length + 1 from it on; keys before context_length are seen by every
    query. Upstream refuses prompts without them; here a row without <sop> is all context
    (context_length = its length) and a row without a mask token takes mask_position =
    context_length (the padding rows of a batch are such rows).
    """

    spec = GLM
    # GLMConfig's defaults (ChatGLM-6B's ice_text.model ids)
    SOP, MASK, GMASK = 130004, 130000, 130001

    def __init__(self, manifest=None):
        super().__init__(manifest)
        config = getattr(manifest, "model_config", None) or {}
        bos = getattr(manifest, "bos_token_id", None)
        self.sop = self.SOP if bos is None else int(bos)
        self.mask = int(config.get("mask_token_id") if config.get("mask_token_id") is not None else self.MASK)
        self.gmask = int(config.get("gmask_token_id") if config.get("gmask_token_id") is not None else self.GMASK)
        self._rows: Optional[List[np.ndarray]] = None

    def row_inputs(self, input_ids: np.ndarray, valid_length: np.ndarray) -> List[np.ndarray]:
        """[context_length (B,), mask_position (B,)] int32 of the rows' prompts."""
        context = np.empty(len(valid_length), np.int32)
        mask_position = np.empty(len(valid_length), np.int32)
        for row, n in enumerate(valid_length):
            prompt = input_ids[row, :int(n)]
            sop = np.flatnonzero(prompt == self.sop)
            context[row] = sop[0] if len(sop) else len(prompt)
            gmask, mask = np.flatnonzero(prompt == self.gmask), np.flatnonzero(prompt == self.mask)
            found = gmask if len(gmask) else mask
            mask_position[row] = found[0] if len(found) else context[row]
        return [context, mask_position]

    def prefill_inputs(self, input_ids, valid_length):
        self._rows = self.row_inputs(input_ids, valid_length)
        return [input_ids, valid_length] + self._rows

    def decode_inputs(self, step_ids, valid_length):
        if self._rows is None:
            raise ValidationError("GLM decode inputs asked for before a prefill: the rows' context_length and "
                                  "mask_position come from their prompts")
        return [step_ids, valid_length] + self._rows


_BUILDERS: Dict[str, Type[BaseInputsOfInfer]] = {"llama": LlamaInputsOfInfer, "glm": GlmInputsOfInfer}


def _inputs_class(name: str) -> Type[BaseInputsOfInfer]:
    if name in _BUILDERS:
        return _BUILDERS[name]
    if FAMILIES[name].row_inputs:
        raise TypeError(f"family {name!r} declares graph inputs {FAMILIES[name].row_inputs} but has no feed builder")
    return type(f"{name.capitalize()}InputsOfInfer", (CommonInputsOfInfer,), {"spec": FAMILIES[name]})


_CLASSES = {name: _inputs_class(name) for name in FAMILIES}


class InputOfInfer:
    """Family name or alias -> inputs class, e.g. `InputOfInfer.get_inputs("llama2_7b")`."""

    MAPPING: Dict[str, Type[BaseInputsOfInfer]] = {
        alias: _CLASSES[spec.name] for spec in FAMILIES.values() for alias in (spec.name,) + spec.aliases}

    @classmethod
    def get_inputs(cls, model_name: str, manifest=None) -> BaseInputsOfInfer:
        """The family's feed builder; `manifest` (the export's) gives it the ids it reads, if any."""
        spec = get_family(family_from_model_name(model_name), source=f"model_name {model_name!r}")
        return _CLASSES[spec.name](manifest)
