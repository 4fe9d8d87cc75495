import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))
from tiny_models import (export_in_subprocess, llama_config, random_weights, save_ckpt, tiny_export_config,
                         write_yaml)

os.environ.setdefault("GLOG_v", "3")  # keep MindSpore's C++ log quiet


@pytest.fixture(scope="session")
def tiny_ckpt(tmp_path_factory):
    """A random tiny GQA Llama as a MindFormers-named .ckpt, with its weights."""
    folder = tmp_path_factory.mktemp("tiny_ckpt")
    weights = random_weights(llama_config(), seed=0)
    return save_ckpt(weights, str(folder / "tiny.ckpt")), weights


@pytest.fixture(scope="session")
def tiny_exports(tiny_ckpt, tmp_path_factory):
    """The tiny model exported with MindSpore 2.10 in both kv modes: {"io": dir, "in_graph": dir}."""
    folder = tmp_path_factory.mktemp("tiny_exports")
    out = {}
    for mode in ("io", "in_graph"):
        cfg = tiny_export_config(tiny_ckpt[0], str(folder / mode), kv_cache=mode)
        out[mode] = export_in_subprocess(write_yaml(str(folder / f"{mode}.yaml"), cfg))
    return out
