"""Context sweeps drawn as curves: decode ms/token and peak RSS against the prompt's length, one line per side
and batch (a benchmark's medians). Used by tools/bench_quant.py --plot."""
from __future__ import annotations

import statistics
from typing import Dict, List, Tuple


def plot_context(results: Dict[Tuple[str, int, int], List[dict]], path: str, title: str) -> None:
    """`results`: (side, batch, depth) -> runs, each with `step_ms` and `rss_mb`; writes a PNG to `path`."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    lines: Dict[Tuple[str, int], List[Tuple[int, float, float]]] = {}
    for (side, batch, depth), runs in results.items():
        if runs:
            lines.setdefault((side, batch), []).append(
                (depth, statistics.median(r["step_ms"] for r in runs), statistics.median(r["rss_mb"] for r in runs)))
    figure, (speed, memory) = plt.subplots(1, 2, figsize=(12, 4.5))
    for (side, batch), points in sorted(lines.items()):
        points.sort()
        depths = [p[0] for p in points]
        label = f"{side}, {batch} row{'s' * (batch != 1)}"
        speed.plot(depths, [p[1] for p in points], marker="o", label=label)
        memory.plot(depths, [p[2] for p in points], marker="o", label=label)
    for axis, what in ((speed, "decode ms per step"), (memory, "peak RSS, MB")):
        axis.set_xscale("log", base=2)
        axis.set_xlabel("context: prompt tokens")
        axis.set_ylabel(what)
        axis.set_ylim(bottom=0)
        axis.grid(True, alpha=0.3)
    speed.legend(fontsize=8)
    figure.suptitle(title, fontsize=10)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
