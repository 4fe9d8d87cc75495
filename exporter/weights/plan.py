"""Weight plans: how a family's checkpoint names map onto the network's canonical names.

A plan is a list of rules. A rule's source is a tensor name where `{L}` stands for a layer index
and `{wb}` for `weight` or `bias`; its targets are canonical names with the same placeholders.
A rule with several targets splits a fused tensor (`split`); `transpose` turns (in, out)
storage (Conv1D, MindFormers' projection/mapping layers) into the (out, in) the network holds.
Tensor-parallel split rules are not here: they belong to the layers (models/linear.py).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from lite_runtime.contract.errors import WeightError

Split = Callable[[np.ndarray, object], List[np.ndarray]]
_TOKENS = {"{L}": r"(?P<L>\d+)", "{wb}": r"(?P<wb>weight|bias)"}


@dataclass(frozen=True)
class Rule:
    source: str
    targets: Tuple[str, ...]
    split: Optional[Split] = None
    transpose: bool = False

    def pattern(self) -> "re.Pattern":
        text = re.escape(self.source)
        for token, group in _TOKENS.items():
            text = text.replace(re.escape(token), group)
        return re.compile(text)


def rule(source: str, *targets: str, split: Optional[Split] = None, transpose: bool = False) -> Rule:
    return Rule(source, targets, split, transpose)


class WeightPlan:
    """`apply(tensors, cfg)` renames (and splits, transposes) a checkpoint's tensors."""

    def __init__(self, rules: Sequence[Rule], ignore: Sequence[str] = (), optional_prefix: str = ""):
        self.rules = [(r, r.pattern()) for r in rules]
        self.ignore = [re.compile(p) for p in ignore]
        self.optional_prefix = optional_prefix   # e.g. GPT-2 files saved without "transformer."

    def apply(self, tensors: Dict[str, np.ndarray], cfg, where: str, family: str,
              finish: Optional[Callable[[str, np.ndarray], object]] = None) -> Dict[str, np.ndarray]:
        """`finish(name, array)`, when given, takes each converted tensor as it is made (a lazy `tensors`
        is then never held whole)."""
        out, unknown = {}, []
        for name in list(tensors):
            ignored = any(p.fullmatch(name) for p in self.ignore)
            found = None if ignored else self._match(name)
            if found is None:
                if not ignored:
                    unknown.append(name)
                del tensors[name]      # unread, if `tensors` is lazy
                continue
            r, groups = found
            value = np.asarray(tensors.pop(name))   # emptied as it goes: a source and its copy are never all held
            if r.transpose:
                value = value.T
            parts = r.split(value, cfg) if r.split else [value]
            for target, part in zip(r.targets, parts):
                target = target.format(**groups)
                part = np.ascontiguousarray(part)
                out[target] = finish(target, part) if finish is not None else part
        if unknown:
            shown = ", ".join(sorted(unknown)[:8]) + (f" ... ({len(unknown)} in all)" if len(unknown) > 8 else "")
            raise WeightError(f"{where}: tensors with no meaning in a {family} model: {shown}")
        return out

    def _match(self, name: str):
        candidates = [name]
        if self.optional_prefix and not name.startswith(self.optional_prefix):
            candidates.append(self.optional_prefix + name)
        for candidate in candidates:
            for r, pattern in self.rules:
                m = pattern.fullmatch(candidate)
                if m:
                    return r, m.groupdict()
        return None

    def stored_transposed(self, name: str) -> bool:
        """Whether the source tensor `name` is stored (in, out) (its rule transposes it)."""
        found = self._match(name)
        return bool(found and found[0].transpose)

    def target_of(self, name: str) -> Optional[str]:
        """The canonical name of checkpoint tensor `name` when its rule maps it one to one."""
        found = self._match(name)
        if found is None or len(found[0].targets) != 1:
            return None
        return found[0].targets[0].format(**found[1])

    def source_of(self, canonical: str) -> Optional[Tuple[str, bool]]:
        """(checkpoint name, stored transposed) of a canonical tensor a rule maps one to one."""
        for r, _ in self.rules:
            if len(r.targets) != 1:
                continue
            text = re.escape(r.targets[0])
            for token, group in _TOKENS.items():
                text = text.replace(re.escape(token), group)
            m = re.fullmatch(text, canonical)
            if m:
                return r.source.format(**m.groupdict()), r.transpose
        return None


# --- fused-tensor splits (first axis = output rows; shards of a rank folder split the same way) ---

def qkv_sections(value: np.ndarray, cfg) -> List[np.ndarray]:
    """[q; k; v] stacked along the output axis, q with n_heads heads and k, v with n_kv_heads."""
    q, kv = cfg.n_heads, cfg.n_kv_heads
    unit = value.shape[0] // (q + 2 * kv)
    if unit * (q + 2 * kv) != value.shape[0]:
        raise WeightError(f"a fused qkv tensor of shape {value.shape} does not split into "
                          f"{q} query and 2 x {kv} key/value heads")
    return np.split(value, [q * unit, (q + kv) * unit], axis=0)


def qkv_per_head(value: np.ndarray, cfg) -> List[np.ndarray]:
    """Per-head interleaved [q_h; k_h; v_h] blocks (Bloom's query_key_value)."""
    hd = cfg.head_dim
    if value.shape[0] % (3 * hd):
        raise WeightError(f"a fused per-head qkv tensor of shape {value.shape} does not split into heads of {hd}")
    grouped = value.reshape((-1, 3, hd) + value.shape[1:])
    return [grouped[:, i].reshape((-1,) + value.shape[1:]) for i in range(3)]


def halves(value: np.ndarray, cfg) -> List[np.ndarray]:
    """[gate; up] stacked along the output axis."""
    if value.shape[0] % 2:
        raise WeightError(f"a fused gate/up tensor of shape {value.shape} has an odd number of rows")
    return np.split(value, 2, axis=0)


def unit_rows(value: np.ndarray, cfg) -> List[np.ndarray]:
    """Each row scaled to unit L2 norm (Baichuan2's NormHead, done once on the weights at export:
    torch's `normalize`, w / max(||w||, 1e-12)). Rows stay rows, so a vocabulary shard normalises alike."""
    wide = np.asarray(value, np.float64)
    norms = np.maximum(np.sqrt((wide * wide).sum(axis=-1, keepdims=True)), 1e-12)
    return [(wide / norms).astype(np.float32)]
