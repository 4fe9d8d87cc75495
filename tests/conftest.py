import json
import os
import sys
import tempfile

import pytest
import yaml

sys.path.insert(0, os.path.dirname(__file__))     # the support package: `from support.<module> import ...`
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tools"))  # served_process
pytest.register_assert_rewrite("support")         # its shared checks report as the tests' own asserts do
from support.family_cases import BATCH, NUMPY_CASES, SEQ, STEPS, mindformers_ckpt, mindformers_yaml
from support.tiny_models import (REPO, VENV_MS20_PYTHON, export_in_subprocess, llama_config, make_tokenizer, random_weights,
                                 rank_table, run_cli, save_ckpt, shard_mindformers_llama, tiny_export_config, write_strategy,
                                 write_yaml)

os.environ.setdefault("GLOG_v", "3")  # keep MindSpore's C++ log quiet
# The record of checked export hashes (lite_runtime/contract/hashes.py) in a folder of this run's own.
os.environ["XDG_CACHE_HOME"] = tempfile.mkdtemp(prefix="lite-test-cache-")
DEMO_YAML = os.path.join(REPO, "tools", "demo_model", "demo.yaml")


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


@pytest.fixture(scope="session")
def tp_setup(tiny_ckpt, tmp_path_factory):
    """The tiny model for the ms backend on 2 ranks and on 1, from the .ckpt and from 2-way shards:
    (folder, {single, full, sharded, merged, resharded: export dir}, 2-rank table)."""
    folder = tmp_path_factory.mktemp("tp")
    ckpt, weights = tiny_ckpt
    tokenizer = make_tokenizer(str(folder))
    exports = {}
    for rank in range(2):
        os.makedirs(folder / "shards" / f"rank_{rank}")
        save_ckpt(shard_mindformers_llama(weights, rank, 2), str(folder / "shards" / f"rank_{rank}" / "tiny.ckpt"))
    strategy = write_strategy(str(folder / "strategy.ckpt"), {n: v.shape for n, v in weights.items()}, 2)
    shards = str(folder / "shards")
    for name, source, mp in (("single", ckpt, 1), ("full", ckpt, 2), ("sharded", shards, 2),
                             ("merged", shards, 1), ("resharded", shards, 2)):
        cfg = tiny_export_config(source, str(folder / name), parallel={"model_parallel": mp})
        cfg["model"]["tokenizer"] = tokenizer
        if name in ("merged", "resharded"):    # upstream: load_checkpoint dir + src_strategy_path_or_dir
            cfg.update(src_strategy_path_or_dir=strategy, auto_trans_ckpt=True)
        exports[name] = export_in_subprocess(write_yaml(str(folder / f"{name}.yaml"), cfg))
    return folder, exports, rank_table(folder / "table2.json", 2)


@pytest.fixture(scope="session")
def lite_tp(tp_setup, tiny_ckpt):
    """MindSpore 2.0 exports in the packed kv mode: 2 ranks as step segments (collectives on the host;
    converted to .ms, which the runtime prefers) and 1 rank (MindIR), with the tokenizer."""
    folder, _, _ = tp_setup
    out = {}
    for name, parallel in (("tp2", {"model_parallel": 2, "collectives": "host"}), ("tp1", {"model_parallel": 1})):
        cfg = tiny_export_config(tiny_ckpt[0], str(folder / f"lite_{name}"), parallel=parallel, kv_cache="packed",
                                 lite_ms=name == "tp2")
        cfg["model"]["tokenizer"] = os.path.join(folder, "tokenizer.model")
        out[name] = export_in_subprocess(write_yaml(str(folder / f"lite_{name}.yaml"), cfg), python=str(VENV_MS20_PYTHON))
    return out


@pytest.fixture
def tp_exports(request):
    """backend -> (TP=2 export, TP=1 export) of the tiny model for that backend (built on first use)."""
    def get(backend):
        if backend == "ms":
            _, exports, _ = request.getfixturevalue("tp_setup")
            return exports["full"], exports["single"]
        lite = request.getfixturevalue("lite_tp")
        return lite["tp2"], lite["tp1"]
    return get


@pytest.fixture(scope="session")
def hf_family(tmp_path_factory):
    """family -> folder with hf/, reference.npz, prompts.json, mindformers.npz (made on first use)."""
    made = {}

    def get(family):
        if family not in made:
            folder = tmp_path_factory.mktemp(f"family_{family}")
            script = "numpy_references.py" if family in NUMPY_CASES else "hf_models.py"
            result = run_cli([os.path.join(REPO, "tests", "support", script), family, str(folder), str(STEPS)])
            assert result.returncode == 0, result.stderr[-3000:]
            made[family] = folder
        return made[family]
    return get


@pytest.fixture(scope="session")
def family_export(hf_family, tmp_path_factory):
    """(family, variant) -> export folder. Variants: io, in_graph, packed (MindSpore 2.10), lite,
    lite_packed (MindSpore 2.0, .ms), mindformers (.ckpt + MindFormers yaml), tp2 (2 ranks),
    lite_tp2_packed (MindSpore 2.0, 2 ranks as step segments), lite_segments_packed (one rank as step
    segments, .ms); a `_b1` suffix: batch size 1; `_attn`: `attention: kernel`."""
    made = {}

    def get(family, variant):
        key = (family, variant)
        if key not in made:
            folder = hf_family(family)
            out = str(folder / f"export_{variant}")
            if variant == "mindformers":
                cfg = mindformers_yaml(family, folder, mindformers_ckpt(folder), out)
            else:
                kv_cache = "packed" if "packed" in variant else "in_graph" if variant == "in_graph" else "io"
                cfg = {"model": {"hf_dir": str(folder / "hf")}, "seq_length": SEQ, "batch_size": BATCH,
                       "kv_cache": kv_cache, "output_dir": out}
                if not (folder / "hf").exists():     # no HF layout: family, sizes, tokenizer + the .ckpt
                    cfg["model"] = json.loads((folder / "model.json").read_text())
                    cfg["load_checkpoint"] = mindformers_ckpt(folder)
                if variant == "tp2":
                    cfg["parallel"] = {"model_parallel": 2}
                if variant.startswith("lite_tp2"):     # each rank's step as segments, reduced on the host
                    cfg["parallel"] = {"model_parallel": 2, "collectives": "host"}
                if variant.startswith("lite_segments"):   # one rank's step as segments, each its own .ms
                    cfg["parallel"], cfg["lite_ms"] = {"collectives": "host"}, True
                if variant.startswith("lite_packed"):
                    cfg["lite_ms"] = True
                if variant.endswith("_b1"):      # one cache row: tensors of (1,) shape
                    cfg["batch_size"] = 1
                if variant.endswith("_attn"):    # the attention as one node of the project's kernels
                    cfg["attention"] = "kernel"
            python = str(VENV_MS20_PYTHON) if variant.startswith("lite") else sys.executable
            made[key] = export_in_subprocess(write_yaml(str(folder / f"{variant}.yaml"), cfg), python=python)
        return made[key]
    return get


@pytest.fixture(scope="session")
def demo_exports(tmp_path_factory):
    """The demo yaml (kv_cache packed) for ms and mslite, for ms in the two-graph io layout, and for mslite with
    `attention: kernel`."""
    folder = tmp_path_factory.mktemp("demo")
    with open(DEMO_YAML) as f:
        io_config = yaml.safe_load(f)
    demo_dir = os.path.dirname(DEMO_YAML)
    io_config["model"]["tokenizer"] = os.path.join(demo_dir, io_config["model"]["tokenizer"])
    io_config.update(load_checkpoint=os.path.join(demo_dir, io_config["load_checkpoint"]), kv_cache="io")
    io_yaml = write_yaml(str(folder / "demo_io.yaml"), io_config)
    out = {}
    kernel_config = dict(io_config, kv_cache="packed", attention="kernel")
    kernel_yaml = write_yaml(str(folder / "demo_kernel.yaml"), kernel_config)
    for name, python, config in (("ms", None, DEMO_YAML), ("mslite", VENV_MS20_PYTHON, DEMO_YAML),
                                 ("ms_io", None, io_yaml), ("mslite_kernel", VENV_MS20_PYTHON, kernel_yaml)):
        args = ["-m", "exporter", "--config", config, "--output_dir", str(folder / name)]
        result = run_cli(args, python=python) if python else run_cli(args)
        assert result.returncode == 0, result.stderr[-2000:]
        out[name] = str(folder / name)
    return out
