"""`InputOfInfer`: per-family builders of the graph feeds, derived from the family spec.

Upstream users know `InputOfInfer.get_inputs(model_name, ...)` and its `MAPPING`; here every
decoder family shares the decode loop, so the classes differ only in their spec, and the mapping
is generated from `families.FAMILIES` (no family can be missing or mapped twice). A family whose
graphs take per-row inputs of their own (`FamilySpec.row_inputs`) has its own builder here, made
with the export's manifest (the special ids it reads are recorded there, named by the family's spec).
"""
from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Type

import numpy as np

from lite_runtime.contract.errors import ValidationError
from lite_runtime.contract.families import FAMILIES, GLM, FamilySpec, family_from_model_name, get_family


class BaseInputsOfInfer:
    """Builds the non-cache feeds of both graphs, in the family's graph input order, keeping no state:
    a family's per-row inputs come from the rows' prompts (`row_inputs`, computed once per batch by
    `generation.prepare_batch`) and are handed back for every decode step. `manifest`: the export's,
    for builders that read its special ids (None: the family's upstream defaults)."""

    spec: FamilySpec = None

    def __init__(self, manifest=None):
        self.manifest = manifest

    def row_inputs(self, input_ids: np.ndarray, valid_length: np.ndarray) -> List[np.ndarray]:
        """The family's per-row graph inputs (`spec.row_inputs`, each (B,) int32) of the rows' prompts."""
        return []

    def prefill_inputs(self, input_ids: np.ndarray, valid_length: np.ndarray,
                       row_inputs: Optional[Sequence[np.ndarray]] = None) -> List[np.ndarray]:
        """`row_inputs`: those of `row_inputs()`, if already computed."""
        if row_inputs is None:
            row_inputs = self.row_inputs(input_ids, valid_length)
        return self._feeds(input_ids, valid_length, row_inputs)

    def decode_inputs(self, step_ids: np.ndarray, valid_length: np.ndarray,
                      row_inputs: Sequence[np.ndarray] = ()) -> List[np.ndarray]:
        """`row_inputs`: the prefill's (they do not change while the rows decode)."""
        return self._feeds(step_ids, valid_length, row_inputs)

    def get_inputs(self, input_ids: np.ndarray, valid_length: np.ndarray, is_first_iteration: bool,
                   row_inputs: Optional[Sequence[np.ndarray]] = None):
        """Upstream-style entry: prefill feeds on the first iteration, decode feeds after."""
        if is_first_iteration:
            return self.prefill_inputs(input_ids, valid_length, row_inputs)
        return self.decode_inputs(input_ids, valid_length, () if row_inputs is None else row_inputs)

    def _feeds(self, ids: np.ndarray, valid_length: np.ndarray, row_inputs: Sequence[np.ndarray]) -> List[np.ndarray]:
        names, family = (self.spec.row_inputs, self.spec.name) if self.spec is not None else ((), "model's")
        if len(row_inputs) != len(names):
            raise ValidationError(f"the {family} graphs take {len(names)} row inputs after the lengths "
                                  f"({', '.join(names) or 'none'}), got {len(row_inputs)}: pass the prefill's "
                                  "row_inputs() (prepare_batch computes them from the prompts)")
        return [ids, valid_length, *row_inputs]


class CommonInputsOfInfer(BaseInputsOfInfer):
    """Token ids + per-row valid length: what every decoder family of the registry takes.

    The arrays are passed through without copying; the decode loop owns them.
    """


class LlamaInputsOfInfer(CommonInputsOfInfer):
    spec = FAMILIES["llama"]


class GlmInputsOfInfer(CommonInputsOfInfer):
    """GLM v1 (ChatGLM-6B): each row's `context_length` and `mask_position`, found in its prompt once
    and fed unchanged on every decode step (the graph derives each token's 2-D position from them
    and its own index, so nothing advances on the host and no mask array is built).

    As MindFormers' GLMForPreTraining (get_position_ids_np / get_masks_np): context_length is the
    index of <sop> (the bos id) in the row; mask_position the index of [gMASK], else of [MASK].
    Token t has position t and block position 0 before context_length, position mask_position and
    block position t - context_length + 1 from it on; keys before context_length are seen by every
    query. Upstream refuses prompts without them; here a row without <sop> is all context
    (context_length = its length) and a row without a mask token takes mask_position =
    context_length (the padding rows of a batch are such rows).
    """

    spec = GLM
    SOP = 130004     # GLMConfig's bos_token_id (ChatGLM-6B's ice_text.model); the export's bos_token_id wins

    def __init__(self, manifest=None):
        super().__init__(manifest)
        bos = getattr(manifest, "bos_token_id", None)
        self.sop = self.SOP if bos is None else int(bos)
        ids = GLM.token_ids(getattr(manifest, "model_config", None))
        self.mask, self.gmask = ids["mask_token_id"], ids["gmask_token_id"]

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
