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
    assert len(report["tokens"]) == 3 and all(len(row) == STEPS for row in report["tokens"])


def test_bench_parent_never_imports_mindspore():
    code = (f"import sys; sys.path.insert(0, {os.path.join(REPO, 'tools')!r}); import bench_decode as b; "
            "b.build_parser(); "
            "assert not [m for m in sys.modules if m.split('.')[0] == 'mindspore']")
    result = run_cli(["-c", code])
    assert result.returncode == 0, result.stderr[-2000:]


def test_peer_report_takes_same_round_ratios_and_drops_runtimes_with_other_tokens():
    """tools/compare_peers.py's summary on made-up rounds (its wiring; the runtimes are not run here)."""
    sys.path.insert(0, os.path.join(REPO, "tools"))
    from compare_peers import summarise

    def run(runtime, round_, step, tokens=((5, 6),)):
        return dict(runtime=runtime, batch=1, round=round_, step=step, ttft=2 * step, rss=100.0, load_s=0.1,
                    steps=1, tokens=[list(t) for t in tokens])
    # Per round mslite / ort = 0.5, 1.0, 0.125: their median is 0.5; the ratio of medians would be 0.25.
    results = []
    for round_, (mine, ort) in enumerate([(1.0, 2.0), (4.0, 4.0), (1.0, 8.0)]):
        results += [run("transformers", round_, 8.0), run("mslite", round_, mine), run("ort", round_, ort),
                    run("openvino", round_, 1.0, ((5, 7),) if round_ == 1 else ((5, 6),))]
    summary = summarise(results)
    assert summary["ratios"][("ort", 1)]["step"] == 0.5 and summary["ratios"][("ort", 1)]["ttft"] == 0.5
    assert summary["rows"][("ort", 1)]["step"] == 4.0 and summary["rows"][("ort", 1)]["rounds"] == 3
    assert not summary["rows"][("openvino", 1)]["same_tokens"] and ("openvino", 1) not in summary["ratios"]
