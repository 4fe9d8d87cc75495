"""The bundled demo model end to end: its continuations through run_infer_main.py and pipeline(),
on MindSpore (`ms`, MindSpore 2.10 export) and on MindSpore Lite (`mslite`, MindSpore 2.0 export).

The expected continuations are facts of the training corpus (tools/train_demo_model.py), not
outputs recorded from this code.
"""
import os
import re

import pytest
from support.tiny_models import REPO, run_cli

EXPECTED = {
    "An increasing sequence: one,": " two, three, four, five",
    "Counting: seven, eight,": " nine, ten",
    "The alphabet: a, b,": " c, d, e",
    "Counting down: ten, nine,": " eight, seven, six",
    "The capital of France is": " Paris.",
}


@pytest.mark.parametrize("backend", ["ms", "mslite"])
def test_run_infer_main_continues_the_demo_prompts(demo_exports, backend, tmp_path):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("\n".join(EXPECTED) + "\n")
    export = demo_exports[backend]      # given relative to the working directory, as `make demo` does
    result = run_cli([os.path.join(REPO, "run_infer_main.py"), "--model_dir", os.path.basename(export),
                      "--backend", backend, "--predict_data", str(prompts), "--max_new_tokens", "12"],
                     cwd=os.path.dirname(export))
    assert result.returncode == 0, result.stderr[-2000:]
    lines = result.stdout.strip().splitlines()
    assert len(lines) == len(EXPECTED)
    for line, (prompt, continuation) in zip(lines, EXPECTED.items()):
        assert line.startswith(prompt + continuation), line
    runtime = "MindSpore Lite 2.0.0 CPU" if backend == "mslite" else "MindSpore 2.10"
    summary = [ln for ln in result.stderr.splitlines() if ln.startswith(f"{backend}: ")]
    assert len(summary) == 1 and runtime in summary[0], result.stderr
    pattern = rf"load [\d.]+ s; TTFT [\d.]+ ms; decode [\d.]+ tokens/s; {len(EXPECTED)} prompt\(s\)"
    assert re.search(pattern, summary[0]), summary


@pytest.mark.parametrize("backend", ["ms", "mslite"])
def test_streaming_prints_the_same_text(demo_exports, backend):
    args = ["run_infer_main.py", "--model_dir", demo_exports[backend], "--backend", backend,
            "--predict_data", "An increasing sequence: one,", "--max_new_tokens", "20"]
    plain = run_cli(args)
    streamed = run_cli(args + ["--stream", "True"])
    assert plain.returncode == 0 and streamed.returncode == 0, plain.stderr + streamed.stderr
    assert streamed.stdout.strip() == plain.stdout.strip()
    assert plain.stdout.startswith("An increasing sequence: one, two, three, four, five")


def test_pipeline_batch_equals_each_prompt_alone(demo_exports):
    from lite_runtime import pipeline
    pipe = pipeline("text_generation", model=demo_exports["ms"], backend="ms")
    prompts = list(EXPECTED)[:4]       # four prompts of different token lengths, one graph batch
    together = pipe(prompts, max_new_tokens=10)
    alone = [pipe(p, max_new_tokens=10)[0] for p in prompts]
    assert together == alone
    assert together[0] == {"text_generation_text": [together[0]["text_generation_text"][0]]}
    assert together[0]["text_generation_text"][0].startswith("An increasing sequence: one, two, three")
    more = pipe(list(EXPECTED) + list(EXPECTED)[:2], max_new_tokens=10)   # 7 prompts: two graph batches
    assert more[:4] == together and more[5:] == alone[:2]


def test_pipeline_upstream_forms(demo_exports):
    from lite_runtime import InferConfig, InferTask, pipeline
    folder = demo_exports["ms"]
    graphs = (os.path.join(demo_exports["ms_io"], "mindir_full_checkpoint", "rank_0_graph.mindir"),
              os.path.join(demo_exports["ms_io"], "mindir_inc_checkpoint", "rank_0_graph.mindir"))
    prompt, continuation = "Counting: seven, eight,", " nine, ten"
    for pipe in (pipeline("text_generation", model=graphs, backend="ms"),
                 pipeline("text_generation", model="llama_demo", model_dir=folder, backend="ms"),
                 InferTask.get_infer_task("text_generation", InferConfig(model_dir=folder, backend="ms", dynamic=True))):
        assert pipe(prompt, max_new_tokens=4)[0]["text_generation_text"][0].startswith(prompt + continuation)


def test_interactive_prompt_loop_ends_cleanly_on_eof(demo_exports):
    result = run_cli(["run_infer_main.py", "--model_dir", demo_exports["ms"], "--backend", "ms",
                      "--max_new_tokens", "6", "--interactive"], stdin="Counting: seven, eight,\n\nThe alphabet: a, b,\n")
    assert result.returncode == 0, result.stderr[-2000:]
    lines = result.stdout.strip().splitlines()
    assert len(lines) == 2
    assert lines[0].startswith("Counting: seven, eight, nine, ten")
    assert lines[1].startswith("The alphabet: a, b, c, d")


def test_pipeline_on_lite_in_a_process_without_mindspore(demo_exports):
    code = ("import sys; from lite_runtime import pipeline; "
            f"pipe = pipeline('text_generation', model={demo_exports['mslite']!r}, backend='mslite'); "
            "print(pipe(['An increasing sequence: one,', 'The capital of France is'], max_new_tokens=8)); "
            "assert 'mindspore' not in sys.modules")
    result = run_cli(["-c", code])
    assert result.returncode == 0, result.stderr[-2000:]
    assert "An increasing sequence: one, two, three, four, five" in result.stdout
    assert "The capital of France is Paris." in result.stdout
