"""`python tools/benchmark.py` on the tiny model (backend ms, a few steps): the JSON report has
every field and sane values. No timing thresholds: these machines are noisy."""
import json
import os
import sys

from tiny_models import REPO, run_cli

FIELDS = ("backend", "batch", "graph_batch", "decode_steps", "ttft_ms", "step_ms", "graph_ms", "host_ms",
          "sample_ms", "detok_ms", "tok_s", "e2e_tok_s", "peak_rss_mb", "load_s", "bare_predict_ms",
          "step_over_bare", "detokenize", "mindspore_in_process")
STEPS = 5


def test_bench_reports_every_figure(tiny_exports, tmp_path):
    out = tmp_path / "bench.json"
    result = run_cli([os.path.join(REPO, "tools", "benchmark.py"), "--model_dir", tiny_exports["io"], "--backend", "ms",
                      "--steps", str(STEPS), "--prompt_len", "8", "--python", sys.executable,
                      "--json", str(out)], timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    assert "host ms/step" in result.stdout and "TTFT ms" in result.stdout
    [report] = json.loads(out.read_text())
    missing = [f for f in FIELDS if f not in report]
    assert not missing, missing
    assert report["backend"] == "ms" and report["batch"] == report["graph_batch"] == 3
    assert report["decode_steps"] == STEPS - 1 and report["new_tokens"] == STEPS
    assert report["ttft_ms"] > 0 and report["tok_s"] > 0 and report["peak_rss_mb"] > 10
    for key in ("step_ms", "graph_ms", "host_ms"):
        stats = report[key]
        assert 0 <= stats["min"] <= stats["median"] <= stats["p90"], (key, stats)
    assert report["graph_ms"]["median"] <= report["step_ms"]["median"]
    assert report["host_ms"]["min"] >= 0
    assert report["bare_predict_ms"] is None and report["step_over_bare"] is None  # ms has no bare hook


def test_bench_parent_never_imports_mindspore():
    code = (f"import sys; sys.path.insert(0, {os.path.join(REPO, 'tools')!r}); import bench_decode as b; "
            "b.build_parser(); "
            "assert not [m for m in sys.modules if m.split('.')[0] == 'mindspore']")
    result = run_cli(["-c", code])
    assert result.returncode == 0, result.stderr[-2000:]
