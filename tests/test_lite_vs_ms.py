"""MindSpore Lite (native binding to the Lite 2.0 C++ runtime) against MindSpore's own executor.

The tiny random GQA Llama and the bundled demo model are exported in the MindSpore 2.0
environment (the MindIR Lite 2.0 reads) and decoded greedily for 32 steps on a batch of prompts
of different lengths by `mslite`, in a process without mindspore. The reference is the `ms`
backend on the same weights exported by MindSpore 2.10 (2.10 cannot load 2.0 MindIR).
Tokens must be identical, logits within 1e-4.
"""
import os
import sys

import numpy as np
import pytest

from support.tiny_models import (REPO, VENV_MS20_PYTHON, export_in_subprocess, run_cli, tiny_export_config,
                                 write_yaml)

STEPS = 32
DEMO_YAML = os.path.join(REPO, "tools", "demo_model", "demo.yaml")


@pytest.fixture(scope="module")
def ms20_export(tiny_ckpt, tmp_path_factory):
    """model name -> its export written by MindSpore 2.0 (made on first use)."""
    folder = tmp_path_factory.mktemp("ms20")
    made = {}

    def get(model):
        if model not in made:
            made[model] = {}
            for env, python in (("ms20", VENV_MS20_PYTHON), ("ms210", sys.executable)):
                out = str(folder / f"{model}_{env}")
                if model == "tiny":
                    config = tiny_export_config(tiny_ckpt[0], out)
                    export_in_subprocess(write_yaml(out + ".yaml", config), python=python)
                else:
                    result = run_cli(["-m", "exporter", "--config", DEMO_YAML, "--output_dir", out], python=python)
                    assert result.returncode == 0, result.stderr[-2000:]
                made[model][env] = out
        return folder, made[model]
    return get


def greedy(backend, export, out):
    result = run_cli([os.path.join(REPO, "tests", "support", "greedy_runner.py"), backend, export, out, str(STEPS)])
    assert result.returncode == 0, result.stderr[-3000:]
    return np.load(out)


@pytest.mark.parametrize("model", ["tiny", "demo"])
def test_lite_matches_ms_backend_for_32_greedy_steps(ms20_export, model):
    folder, exports = ms20_export(model)
    lite = greedy("mslite", exports["ms20"], str(folder / f"{model}_lite.npz"))
    ms = greedy("ms", exports["ms210"], str(folder / f"{model}_ms.npz"))
    assert lite["logits"].shape[0] == STEPS + 1
    np.testing.assert_array_equal(lite["tokens"], ms["tokens"])
    assert np.abs(lite["logits"] - ms["logits"]).max() <= 1e-4
