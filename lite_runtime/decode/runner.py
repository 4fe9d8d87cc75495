"""The engine's runner: a step plan (scheduler.py) made into one call of the session's step graph."""
from __future__ import annotations

from typing import List, Optional, Tuple

import numpy as np

from lite_runtime.decode.inputs import InputOfInfer
from lite_runtime.decode.scheduler import EngineLimits, Row, StepPlan


class StepRunner:
    def __init__(self, session, limits: EngineLimits):
        m = session.manifest
        self.session, self.limits = session, limits
        # A family's own per-row graph inputs (GLM v1's context_length, mask_position) come from each
        # prompt, once, by its feed builder.
        self.inputs = InputOfInfer.get_inputs(m.family, m)
        self.idle_values = self.row_values([limits.pad_id])     # what an idle row feeds
        self.steps = 0

    def row_values(self, prompt: List[int]) -> List[int]:
        rows = self.inputs.row_inputs(np.array([prompt], np.int32), np.array([len(prompt)], np.int32))
        return [int(v[0]) for v in rows]

    def run(self, plan: StepPlan, rows: List[Optional[Row]]) -> Tuple[np.ndarray, np.ndarray]:
        """(logits, first): row r's j-th picked logits are logits[first[r] + j]. Only the picked rows' logits are
        made (the head runs for them alone): a step of one running row in a 32-row export returns one row of
        logits, not 32 of which 31 are zeros."""
        idle = self.idle_values
        extra = [np.array([row.row_values[k] if row else idle[k] for row in rows], np.int32) for k in range(len(idle))]
        if self.limits.adapters:
            extra.append(np.array([row.request.adapter_slot if row else 0 for row in rows], np.int32))
        self.steps += 1
        logits = self.session.verify(plan.tokens, plan.counts, plan.past, plan.picks, *extra)
        return logits, np.cumsum(plan.picks) - plan.picks
