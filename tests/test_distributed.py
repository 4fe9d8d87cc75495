"""Tensor-parallel (TP=2) export and runs under MindSpore's distributed engine on CPU.

Reference: the single-rank export of the same checkpoint. Tolerance: logits within 1e-4,
greedy tokens identical for 32 steps; seeded sampling gives the single-rank text (only the first rank of a
replica samples; the others replay its calls).
"""
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import psutil
import pytest

from lite_runtime.backends import load_session
from lite_runtime.contract.manifest import load_manifest
from support.tiny_models import (error_lines, rank_table, REPO, VENV_MS20_PYTHON, shard_mindformers_llama, export_in_subprocess,
                                 make_tokenizer, run_cli, save_ckpt, tiny_export_config, write_strategy, write_yaml)
from support.greedy_runner import greedy_run

STEPS = 32


def launched_greedy(table, backend, export, out):
    """tests/support/tp_worker.py on every rank of `table`: [(logits, tokens) of rank 0, of rank 1]."""
    out.mkdir()
    result = run_cli(["-m", "lite_runtime.cli.launch", "--rank_table", table, "--backend", backend, "--log_dir",
                      str(out / "logs"), "--", os.path.join(REPO, "tests", "support", "tp_worker.py"), str(out), str(STEPS),
                      "--model_dir", export])
    assert result.returncode == 0, result.stderr[-2000:]
    return [(r["logits"], r["tokens"]) for r in (np.load(out / f"rank_{rank}.npz") for rank in range(2))]


def _replayed(log, first: int) -> int:
    """How many calls of rank `first` a follower's log says it replayed."""
    import re
    found = re.findall(rf"replayed (\d+) calls of rank {first}\b", log.read_text())
    assert len(found) == 1, log.read_text()[-2000:]
    return int(found[0])


@pytest.fixture(scope="module")
def ms_tp2_greedy(tp_setup):
    folder, exports, table = tp_setup
    return launched_greedy(table, "ms", exports["full"], folder / "run_full")


@pytest.mark.parametrize("source", ["full", "sharded", "resharded"])
def test_tp2_greedy_matches_single_rank(tp_setup, ms_tp2_greedy, source):
    folder, exports, table = tp_setup
    assert load_manifest(exports[source]).world_size == 2
    ranks = ms_tp2_greedy if source == "full" else launched_greedy(table, "ms", exports[source], folder / f"run_{source}")
    ref_logits, ref_tokens = greedy_run(load_session("ms", load_manifest(exports["single"])), STEPS)
    for logits, tokens in ranks:
        np.testing.assert_array_equal(tokens, ref_tokens)
        assert np.abs(logits - ref_logits).max() <= 1e-4


def test_lite_tp2_segments_equal_lite_tp1_and_ms_tp2(tp_setup, ms_tp2_greedy, lite_tp, tmp_path):
    """Lite on CPU, each rank's step in segments and the all-reduces on the host: the greedy tokens of
    Lite with one rank and of the ms backend's TP=2 (collectives in its graphs), for 32 steps on a
    batch of mixed lengths; logits within 1e-4."""
    folder, _, table = tp_setup
    manifest = load_manifest(lite_tp["tp2"])
    assert manifest.collectives == "host" and manifest.lite_files["layer1.attn"][1] == "segments/rank_1/layer1.attn.ms"
    single = run_cli([os.path.join(REPO, "tests", "support", "greedy_runner.py"), "mslite", lite_tp["tp1"],
                      str(tmp_path / "tp1.npz"), str(STEPS)])
    assert single.returncode == 0, single.stderr[-2000:]
    lite_single = np.load(tmp_path / "tp1.npz")
    for (logits, tokens), (ms_logits, ms_tokens) in zip(launched_greedy(table, "mslite", lite_tp["tp2"],
                                                                        tmp_path / "run"), ms_tp2_greedy):
        np.testing.assert_array_equal(tokens, lite_single["tokens"])
        np.testing.assert_array_equal(tokens, ms_tokens)
        assert np.abs(logits - lite_single["logits"]).max() <= 1e-4
        assert np.abs(logits - ms_logits).max() <= 1e-4


@pytest.mark.parametrize("backend, facts", [("ms", ["step segments", "backend 'mslite' under the launcher"]),
                                            ("mslite", ["2 ranks of step segments", "run it with the launcher"])])
def test_a_segment_export_runs_on_mslite_under_the_launcher_only(lite_tp, backend, facts):
    result = run_cli(["run_infer_main.py", "--model_dir", lite_tp["tp2"], "--backend", backend, "--predict_data", "one"])
    assert result.returncode != 0 and len(error_lines(result.stderr)) == 1, result.stderr[-2000:]
    assert all(f in result.stderr for f in facts), result.stderr


def test_paged_ranks_preempt_alike_and_answer_as_one_rank(family_export, tmp_path):
    """`target: cpu` on 2 ranks: each rank's K/V in its own paged store, whose blocks rank 0's scheduler gives out.
    A store that holds one sequence of the export's 3 rows makes it preempt requests; rank 1, which only replays
    the calls, frees a row's blocks when a call shows it restarted, before taking any, and so holds the same
    blocks. The answers are those of one rank with a store of the same blocks (float32 K/V: both the same)."""
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("one two three four\nalpha beta\nfive six seven eight nine ten\neleven\ntwelve thirteen\n")
    gen = ["--predict_data", str(prompts), "--max_new_tokens", "20", "--backend", "mslite", "--kv_cache_dtype",
           "float32"]

    def args(export):
        d = load_manifest(export).dims        # a store of one row's blocks (the rank's heads)
        block_bytes = 2 * d.num_layers * d.kv_heads_per_rank * d.kv_block * 4 * d.head_dim
        return ["run_infer_main.py", "--model_dir", export, "--kv_cache_gb",
                repr((d.kv_blocks_per_row + 0.5) * block_bytes / 2 ** 30)] + gen
    tp2, tp1 = family_export("llama", "lite_tp2_packed_cpu"), family_export("llama", "lite_packed_cpu")
    single = run_cli(args(tp1))
    assert single.returncode == 0, single.stderr[-2000:]
    assert "preempted the request" in single.stderr and single.stdout.startswith("one two three four")
    multi = run_cli(["-m", "lite_runtime.cli.launch", "--rank_table", rank_table(tmp_path / "t2.json", 2),
                     "--backend", "mslite", "--log_dir", str(tmp_path / "logs"), "--"] + args(tp2))
    assert multi.returncode == 0, multi.stderr[-2000:]
    assert multi.stdout == single.stdout
    rank0 = (tmp_path / "logs" / "rank_0.log").read_text()
    assert rank0.count("preempted the request") == single.stderr.count("preempted the request")


@pytest.mark.parametrize("backend", ["ms", "mslite"])
def test_seeded_sampling_agrees_on_every_rank_and_with_single_rank(tp_setup, tp_exports, backend, tmp_path):
    folder, exports, table = tp_setup
    tp2, tp1 = tp_exports(backend)
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("one two three\nalpha beta\nfive six seven eight nine\n")
    gen = ["--predict_data", str(prompts), "--do_sample", "True", "--top_k", "20", "--top_p", "0.9",
           "--temperature", "1.5", "--seed", "7", "--max_new_tokens", "12"]
    single = run_cli(["run_infer_main.py", "--model_dir", tp1, "--backend", backend] + gen)
    assert single.returncode == 0, single.stderr[-2000:]
    logs = tmp_path / "seeded_logs"
    multi = run_cli(["-m", "lite_runtime.cli.launch", "--rank_table", table, "--backend", backend,
                     "--log_dir", str(logs), "--", "run_infer_main.py", "--model_dir", tp2] + gen)
    assert multi.returncode == 0, multi.stderr[-2000:]
    expected = single.stdout.strip().splitlines()
    assert len(expected) == 3
    assert multi.stdout.strip().splitlines() == expected
    assert _replayed(logs / "rank_1.log", 0) >= 12     # a call per new token at least: rank 1 samples nothing


def test_rank_table_size_mismatch_is_refused_before_start(tp_setup, tmp_path):
    folder, exports, _ = tp_setup
    table = rank_table(tmp_path / "table4.json", 4)
    logs = tmp_path / "logs"
    result = run_cli(["-m", "lite_runtime.cli.launch", "--rank_table", table, "--backend", "ms", "--log_dir", str(logs),
                      "--", "run_infer_main.py", "--model_dir", exports["full"], "--predict_data", "one"])
    assert result.returncode == 1
    assert "has 4 ranks" in result.stderr and "written for 2" in result.stderr
    assert len(error_lines(result.stderr)) == 1
    assert not logs.exists()


@pytest.mark.parametrize("backend, data_parallel, victim", [("ms", 1, 1), ("mslite", 1, 1), ("mslite", 2, 3)],
                         ids=["ms", "mslite", "mslite-dp2xmp2"])
def test_killed_rank_stops_the_run_and_leaves_no_process(tp_setup, tp_exports, backend, data_parallel, victim, tmp_path):
    """Rank `victim`'s own Python process killed (on mslite it runs under its one-process mpiexec); with
    dp=2 x mp=2 the second rank of the second replica."""
    folder, exports, table = tp_setup
    tp2, _ = tp_exports(backend)
    if data_parallel > 1:
        table = rank_table(tmp_path / "table4.json", 4)
    env = dict(os.environ, PYTHONPATH=REPO)
    launcher = subprocess.Popen(
        [sys.executable, "-m", "lite_runtime.cli.launch", "--rank_table", table, "--backend", backend,
         "--log_dir", str(tmp_path / "logs"), "--", "run_infer_main.py", "--model_dir", tp2, "--interactive",
         "--data_parallel", str(data_parallel)],
        cwd=REPO, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    target = victim
    try:
        victim, started = None, time.monotonic()
        while victim is None and time.monotonic() - started < 60:
            for child in psutil.Process(launcher.pid).children(recursive=True):
                try:
                    if (child.environ().get("RANK_ID") == str(target)
                            and child.cmdline()[1].endswith("run_infer_main.py")):
                        victim = child
                except psutil.Error:
                    pass
            time.sleep(0.5)
        assert victim is not None, f"rank {target} never started"
        family = [victim] + psutil.Process(launcher.pid).children(recursive=True)
        time.sleep(5)   # let the ranks load and wait for a prompt
        victim.send_signal(signal.SIGKILL)
        _, stderr = launcher.communicate(timeout=60)
    finally:
        if launcher.poll() is None:
            launcher.kill()
    assert launcher.returncode == 1
    assert f"rank {target}" in stderr and ("killed by signal 9" in stderr or "ended: Killed (signal 9)" in stderr), stderr
    time.sleep(1)
    alive = [p.pid for p in family if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    assert alive == []


def bad_shard_export(tp_setup, tmp_path, broken):
    """A TP=2 export from the good shards with `broken` ({rank: weights}) swapped in; returns (result, out)."""
    folder, _, _ = tp_setup
    bad = tmp_path / "bad_shards"
    for rank in range(2):
        os.makedirs(bad / f"rank_{rank}")
        (bad / f"rank_{rank}" / "tiny.ckpt").write_bytes((folder / "shards" / f"rank_{rank}" / "tiny.ckpt").read_bytes())
    for rank, weights in broken.items():
        save_ckpt(weights, str(bad / f"rank_{rank}" / "tiny.ckpt"))
    out = tmp_path / "out"
    cfg = tiny_export_config(str(bad), str(out), parallel={"model_parallel": 2})
    return run_cli(["-m", "exporter", "--config", write_yaml(str(tmp_path / "bad.yaml"), cfg)]), out


def test_failed_rank_during_export_is_named_and_nothing_is_left(tp_setup, tmp_path):
    from support.tiny_models import llama_config, random_weights
    # rank 1's shard comes from a model with another hidden size: its shapes do not fit
    wrong = shard_mindformers_llama(random_weights(llama_config(hidden_size=48), seed=1), 1, 2)
    result, out = bad_shard_export(tp_setup, tmp_path, {1: wrong})
    assert result.returncode == 1
    (line,) = error_lines(result.stderr)
    assert "(rank 1)" in line and "wrong shape" in line, line
    assert not out.exists()
    assert not [n for n in os.listdir(tmp_path) if n.startswith(".export-")]


def test_the_first_failed_rank_of_an_export_stops_it(tp_setup, tiny_ckpt, tmp_path):
    from support.tiny_models import llama_config, random_weights
    no_norm = {k: v for k, v in shard_mindformers_llama(tiny_ckpt[1], 0, 2).items() if k != "model.norm_out.weight"}
    wrong = shard_mindformers_llama(random_weights(llama_config(hidden_size=48), seed=1), 1, 2)
    result, out = bad_shard_export(tp_setup, tmp_path, {0: no_norm, 1: wrong})
    assert result.returncode == 1
    (line,) = error_lines(result.stderr)
    assert "(rank 0)" in line and "model.norm_out.weight" in line and "rank 1" not in result.stderr, result.stderr
    assert not out.exists()


PIPELINE_WORKER = os.path.join(REPO, "tests", "support", "pipeline_worker.py")


def pipeline_alone(export, folder, backend):
    """tests/support/pipeline_worker.py's 5 answers from one process (no launcher)."""
    alone = run_cli([PIPELINE_WORKER, export, str(folder), backend, "1"])
    assert alone.returncode == 0, alone.stderr[-2000:]
    expected = json.loads((folder / "rank_0.txt").read_text())
    assert len(expected) == 5
    return expected


def test_pipeline_in_a_launched_job_agrees_with_single_rank(tp_setup, tmp_path):
    from lite_runtime import pipeline
    from support.pipeline_worker import PROMPTS
    folder, exports, table = tp_setup
    result = run_cli(["-m", "lite_runtime.cli.launch", "--rank_table", table, "--backend", "ms", "--log_dir",
                      str(tmp_path / "logs"), "--", PIPELINE_WORKER,
                      exports["full"], str(tmp_path)])
    assert result.returncode == 0, result.stderr[-2000:]
    single = pipeline("text_generation", model=exports["single"], backend="ms")
    expected = single(PROMPTS, max_new_tokens=10, do_sample=True, top_k=10, seed=3)
    for rank in range(2):
        assert json.loads((tmp_path / f"rank_{rank}.txt").read_text()) == expected


@pytest.fixture(scope="module")
def lite_single_export(tiny_ckpt, tp_setup):
    """A single-rank export with the MindSpore 2.0 environment (the graphs Lite reads), with a tokenizer."""
    folder, _, _ = tp_setup
    cfg = tiny_export_config(tiny_ckpt[0], str(folder / "lite_single"))
    cfg["model"]["tokenizer"] = make_tokenizer(str(folder))
    return export_in_subprocess(write_yaml(str(folder / "lite_single.yaml"), cfg), python=str(VENV_MS20_PYTHON))


@pytest.mark.parametrize("backend", ["mslite", "ms"])
def test_data_parallel_answers_in_input_order(tp_setup, lite_single_export, backend, tmp_path):
    """dp=2 on a 2-rank table: 5 prompts split 3 + 2 over two replicas come back in input order, each
    the single-process answer (export batch 3: rank 0 runs one batch, rank 1 one padded batch)."""
    folder, exports, table = tp_setup
    export = lite_single_export if backend == "mslite" else exports["single"]
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("one two three\nalpha beta\nfive six seven eight nine\nten\neleven twelve\n")
    gen = ["--model_dir", export, "--predict_data", str(prompts), "--max_new_tokens", "8"]
    single = run_cli(["run_infer_main.py", "--backend", backend] + gen)
    assert single.returncode == 0, single.stderr[-2000:]
    expected = single.stdout.strip().splitlines()
    assert len(expected) == 5
    logs = tmp_path / "logs"
    multi = run_cli(["-m", "lite_runtime.cli.launch", "--rank_table", table, "--backend", backend,
                     "--log_dir", str(logs), "--", "run_infer_main.py", "--data_parallel", "2"] + gen)
    assert multi.returncode == 0, multi.stderr[-2000:]
    assert multi.stdout.strip().splitlines() == expected
    assert "rank_1.log" in os.listdir(logs)


@pytest.mark.parametrize("backend", ["mslite", "ms"])
def test_pipeline_with_data_parallel_answers_in_input_order(tp_setup, lite_single_export, backend, tmp_path):
    """pipeline(..., data_parallel=2) in a script on both ranks: every rank gets all 5 answers in input
    order, each the single-process answer (greedy)."""
    _, exports, table = tp_setup
    export = lite_single_export if backend == "mslite" else exports["single"]
    worker, expected = PIPELINE_WORKER, pipeline_alone(export, tmp_path, backend)
    out = tmp_path / "dp"
    out.mkdir()
    result = run_cli(["-m", "lite_runtime.cli.launch", "--rank_table", table, "--backend", backend,
                      "--log_dir", str(out / "logs"), "--", worker, export, str(out), backend, "2"])
    assert result.returncode == 0, result.stderr[-2000:]
    for rank in range(2):
        assert json.loads((out / f"rank_{rank}.txt").read_text()) == expected


def test_pipeline_data_parallel_needs_the_launcher_and_a_layout_for_it(tp_setup, monkeypatch):
    from lite_runtime import pipeline
    from lite_runtime.contract.errors import ConfigError
    _, exports, _ = tp_setup
    with pytest.raises(ConfigError, match="needs a script started on 2 ranks by the launcher.*RANK_SIZE is not set"):
        pipeline("text_generation", model=exports["single"], backend="ms", data_parallel=2)
    with pytest.raises(ConfigError, match="data_parallel must be a positive integer, got 0"):
        pipeline("text_generation", model=exports["single"], backend="ms", data_parallel=0)
    monkeypatch.setenv("RANK_SIZE", "3")
    with pytest.raises(ConfigError, match="needs a script started on 2 ranks.*RANK_SIZE '3'"):
        pipeline("text_generation", model=exports["single"], backend="ms", data_parallel=2)
    monkeypatch.setenv("RANK_SIZE", "2")
    with pytest.raises(ConfigError, match=r"\(2 rank\(s\) per replica\) needs a script started on 4 ranks.*RANK_SIZE '2'"):
        pipeline("text_generation", model=exports["full"], backend="ms", data_parallel=2)
    monkeypatch.setenv("RANK_SIZE", "4")
    monkeypatch.setenv("RANK_ID", "0")
    with pytest.raises(ConfigError, match="laid the job out for data_parallel 1; give `--data_parallel 2`"):
        pipeline("text_generation", model=exports["full"], backend="ms", data_parallel=2)


def test_data_parallel_needs_a_matching_table(tp_setup, tmp_path):
    folder, exports, table = tp_setup
    for export, dp, facts in ((exports["full"], "2", ["has 2 ranks", "written for 2 x data_parallel 2", "with 4 devices"]),
                              (exports["single"], "3", ["has 2 ranks", "x data_parallel 3"])):
        result = run_cli(["-m", "lite_runtime.cli.launch", "--rank_table", table, "--backend", "ms", "--",
                          "run_infer_main.py", "--model_dir", export, "--data_parallel", dp, "--predict_data", "one"])
        assert result.returncode == 1 and len(error_lines(result.stderr)) == 1, result.stderr
        assert all(f in result.stderr for f in facts), result.stderr
    alone = run_cli(["run_infer_main.py", "--model_dir", exports["single"], "--data_parallel", "2", "--predict_data", "x"])
    assert alone.returncode == 2 and "under the launcher" in alone.stderr


def test_shards_merged_by_their_strategy_export_for_one_rank(tp_setup):
    """2-way shards + the training run's strategy file -> model_parallel 1: the unsharded model."""
    folder, exports, _ = tp_setup
    assert load_manifest(exports["merged"]).world_size == 1
    got = greedy_run(load_session("ms", load_manifest(exports["merged"])), STEPS)
    want = greedy_run(load_session("ms", load_manifest(exports["single"])), STEPS)
    np.testing.assert_array_equal(got[1], want[1])
    assert np.abs(got[0] - want[0]).max() <= 1e-6


@pytest.mark.parametrize("devices, split_axis, facts", [
    (4, None, ["laid out over 4 devices", "2 rank folders"]),
    (2, lambda n: 1 if n.endswith("attention.wq.weight") else None, ["attention.wq.weight", "wrong shape"]),
], ids=["device_count", "layout"])
def test_strategy_that_does_not_fit_the_shards_is_refused(tp_setup, tiny_ckpt, devices, split_axis, facts, tmp_path):
    folder, _, _ = tp_setup
    shapes = {n: v.shape for n, v in tiny_ckpt[1].items()}
    strategy = write_strategy(str(tmp_path / "strategy.ckpt"), shapes, devices, split_axis)
    cfg = tiny_export_config(str(folder / "shards"), str(tmp_path / "out"), src_strategy_path_or_dir=strategy)
    result = run_cli(["-m", "exporter", "--config", write_yaml(str(tmp_path / "bad.yaml"), cfg)])
    assert result.returncode == 1 and len(error_lines(result.stderr)) == 1, result.stderr[-2000:]
    assert all(f in result.stderr for f in facts), result.stderr[-2000:]
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("backend", ["ms", "mslite"])
def test_dp2_x_mp2_answers_in_input_order(tp_setup, tp_exports, backend, tmp_path):
    """dp=2 x mp=2 on a 4-rank table: two replicas of the TP=2 export (ranks 0-1 and 2-3, each its own
    MindSpore cluster or MPI join); 5 prompts split 3 + 2 come back in input order, each the answer of
    one process with the TP=1 export (greedy), and every other rank replayed rank 0's calls."""
    tp2, tp1 = tp_exports(backend)
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("one two three\nalpha beta\nfive six seven eight nine\nten\neleven twelve\n")
    gen = ["--predict_data", str(prompts), "--max_new_tokens", "8"]
    single = run_cli(["run_infer_main.py", "--backend", backend, "--model_dir", tp1] + gen)
    assert single.returncode == 0, single.stderr[-2000:]
    expected = single.stdout.strip().splitlines()
    assert len(expected) == 5
    logs = tmp_path / "logs"
    multi = run_cli(["-m", "lite_runtime.cli.launch", "--rank_table", rank_table(tmp_path / "t4.json", 4),
                     "--backend", backend, "--log_dir", str(logs), "--", "run_infer_main.py", "--model_dir", tp2,
                     "--data_parallel", "2"] + gen)
    assert multi.returncode == 0, multi.stderr[-2000:]
    assert multi.stdout.strip().splitlines() == expected
    for rank in (1, 2, 3):      # rank 0 drives both replicas
        assert _replayed(logs / f"rank_{rank}.log", 0) >= 8
    if backend == "ms":
        assert {"scheduler_0.log", "scheduler_1.log"} <= set(os.listdir(logs))


@pytest.mark.parametrize("backend", ["ms", "mslite"])
def test_pipeline_dp2_x_mp2_answers_in_input_order(tp_setup, tp_exports, backend, tmp_path):
    """pipeline(..., data_parallel=2) with the TP=2 export in a script on 4 ranks (`--data_parallel 2
    --model_dir` among its arguments lay the job out): every rank gets the one-process answers of the
    TP=1 export, in input order."""
    tp2, tp1 = tp_exports(backend)
    worker, expected = PIPELINE_WORKER, pipeline_alone(tp1, tmp_path, backend)
    out = tmp_path / "dp"
    out.mkdir()
    result = run_cli(["-m", "lite_runtime.cli.launch", "--rank_table", rank_table(tmp_path / "t4.json", 4),
                      "--backend", backend, "--log_dir", str(out / "logs"), "--", worker, tp2, str(out), backend, "2",
                      "--model_dir", tp2, "--data_parallel", "2"])
    assert result.returncode == 0, result.stderr[-2000:]
    for rank in range(4):
        assert json.loads((out / f"rank_{rank}.txt").read_text()) == expected
