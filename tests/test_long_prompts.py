"""Prompts at every length the engine meets, up to a 2,048-token export, on tiny random models against
transformers (tests/support/long_context_models.py): lengths that cross the cache's buckets (16-64 positions),
the engine's prompt chunks (128), the packed prefill's windows (256) and 1,500, past which Lite 2.0's CPU
MatMul sums a one-row product of graph-made operands wrongly (a lone prompt's last-token pick; the one query
head a KV head of a decode step's past: exporter/models/attention.py's Weigh). Each family's forms on Lite:
`target: cpu` (the kernels' attention over the paged store, in one graph and as segments; `attention: kernel`:
over host arrays), the packed step's attention as Lite's own ops (.ms),
upstream's io graphs (MindIR); and the packed step on `ms`. The engine's greedy tokens (float16 K/V in the paged
store), each prompt alone (fed whole) and beside a running request (in chunks), equal transformers'; the io graphs' logits are within 1e-4.
GLM v1 and PanGu-alpha (numpy references, 48 positions) are not here: their families' tests run them."""
import json
import os

import numpy as np
import pytest

from support.hf_models import BUILDERS
from support.long_context_models import LENGTHS, STEPS
from support.tiny_models import REPO, run_cli

TOLERANCE = 1e-4
# every family transformers has (or a checkpoint's own code: hf_models.py): grouped query heads and one query
# head a KV head (gpt2, bloom, internlm, baichuan2 7B: the one-row products), rotary, learned positions, ALiBi
FAMILIES = sorted(BUILDERS)


@pytest.mark.parametrize("form", ["lite_cpu", "lite_paged", "lite_packed", "lite_segments", "ms_packed"])
@pytest.mark.parametrize("family", FAMILIES)
def test_the_engine_at_every_length_alone_and_beside_a_request(long_export, family, form, tmp_path):
    folder, export = long_export(family, form)
    reference = np.load(folder / "reference.npz")["tokens"].tolist()
    float16 = ["kv_cache_dtype=float16"] if form == "lite_paged" else []     # the paged store's other dtype
    result = run_cli([os.path.join(REPO, "tests", "support", "long_prompt_runner.py"),
                      "ms" if form.startswith("ms") else "mslite", export, str(folder / "prompts.json"), str(STEPS)]
                     + float16, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    got = json.loads(result.stdout.strip().splitlines()[-1])
    for n, expected, alone, beside in zip(LENGTHS, reference, got["alone"], got["beside"]):
        assert alone == expected, f"{n} prompt tokens, alone"
        assert beside == expected, f"{n} prompt tokens, beside a running request"


@pytest.mark.parametrize("family", FAMILIES)
def test_upstreams_io_graphs_on_lite_at_every_length(long_export, family, tmp_path):
    """The prefill graph, then decode steps each reading all 2,048 cache positions (masked)."""
    folder, export = long_export(family, "lite_io")
    reference = np.load(folder / "reference.npz")
    result = run_cli([os.path.join(REPO, "tests", "support", "parity_runner.py"), "mslite", export,
                      str(folder / "prompts.json"), str(STEPS - 1), str(tmp_path / "out.npz")], timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    got = np.load(tmp_path / "out.npz")
    for i, n in enumerate(LENGTHS):
        assert got["tokens"][i].tolist() == reference["tokens"][i].tolist(), f"{n} prompt tokens"
        diff = np.abs(got["logits"][i] - reference["logits"][i]).max()
        assert diff <= TOLERANCE, f"{n} prompt tokens: max abs logit difference {diff}"


def test_the_paged_stores_dtype_is_chosen_on_the_command_line(long_export):
    _, export = long_export("llama", "lite_paged")
    args = [os.path.join(REPO, "run_infer_main.py"), "--model_dir", export, "--backend", "mslite",
            "--predict_data", "An increasing sequence: one, two,", "--max_new_tokens", "4"]
    answers = {}
    for dtype in ("float16", "float32"):
        result = run_cli(args + ["--kv_cache_dtype", dtype])
        assert result.returncode == 0, result.stderr[-2000:]
        answers[dtype] = result.stdout
    assert answers["float16"] == answers["float32"]       # a 9-token prompt: float16's rounding moves no choice
    refused = run_cli(args + ["--kv_cache_dtype", "int4"])
    assert refused.returncode == 2 and "--kv_cache_dtype" in refused.stderr and "'int4'" in refused.stderr, \
        refused.stderr[-2000:]
