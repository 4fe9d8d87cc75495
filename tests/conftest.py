import json
import os
import shutil
import sys
import tempfile

import pytest
import yaml
from filelock import FileLock

sys.path.insert(0, os.path.dirname(__file__))     # the support package: `from support.<module> import ...`
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tools"))  # served_process
pytest.register_assert_rewrite("support")         # its shared checks report as the tests' own asserts do
from support.long_context_models import FORMS as LONG_FORMS, POSITIONS as LONG_POSITIONS
from support.family_cases import BATCH, NUMPY_CASES, SEQ, STEPS, mindformers_ckpt, mindformers_yaml
from support.tiny_models import (REPO, VENV_MS20_PYTHON, export_in_subprocess, llama_config, make_tokenizer, random_weights,
                                 rank_table, run_cli, save_ckpt, shard_mindformers_llama, tiny_export_config, write_strategy,
                                 write_yaml)

os.environ.setdefault("GLOG_v", "3")  # keep MindSpore's C++ log quiet
# The record of checked export hashes (lite_runtime/contract/hashes.py) in a folder of this run's own.
os.environ["XDG_CACHE_HOME"] = tempfile.mkdtemp(prefix="lite-test-cache-")
DEMO_YAML = os.path.join(REPO, "tools", "demo_model", "demo.yaml")


# The files that take minutes, handed out first (make test: `--no-loadscope-reorder`) so that the two workers
# finish together; the rest keep pytest's order. From the slowest tests `make test` prints.
LONG_FILES = ("test_families.py", "test_distributed.py", "test_real_model.py", "test_quantized_export.py",
              "test_export_memory.py", "test_slora.py", "test_speculative_draft.py", "test_install.py")


def pytest_collection_modifyitems(items):
    items.sort(key=lambda item: LONG_FILES.index(item.path.name) if item.path.name in LONG_FILES else len(LONG_FILES))


def built_once(tmp_path_factory, name, build):
    """The folder `name`, filled by `build(folder)` once for the whole run: `make test` runs the files on two
    pytest-xdist workers, and the exports several files share are made by whichever worker needs them first
    (the other waits on the lock). A build that failed is retried by the next user."""
    base = tmp_path_factory.getbasetemp()
    root = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "shared"
    root.mkdir(exist_ok=True)
    folder, done = root / name, root / f"{name}.done"
    with FileLock(str(root / f"{name}.lock")):
        if not done.exists():
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir()
            build(folder)
            done.touch()
    return folder


@pytest.fixture(scope="session")
def tiny_ckpt(tmp_path_factory):
    """A random tiny GQA Llama as a MindFormers-named .ckpt, with its weights."""
    folder = tmp_path_factory.mktemp("tiny_ckpt")
    weights = random_weights(llama_config(), seed=0)
    return save_ckpt(weights, str(folder / "tiny.ckpt")), weights


@pytest.fixture(scope="session")
def tiny_exports(tiny_ckpt, tmp_path_factory):
    """The tiny model exported with MindSpore 2.10 in both kv modes: {"io": dir, "in_graph": dir}."""
    def build(folder):
        for mode in ("io", "in_graph"):
            cfg = tiny_export_config(tiny_ckpt[0], str(folder / mode), kv_cache=mode)
            export_in_subprocess(write_yaml(str(folder / f"{mode}.yaml"), cfg))
    folder = built_once(tmp_path_factory, "tiny_exports", build)
    return {mode: str(folder / mode) for mode in ("io", "in_graph")}


TP_EXPORTS = ("single", "full", "sharded", "merged", "resharded")


@pytest.fixture(scope="session")
def tp_setup(tiny_ckpt, tmp_path_factory):
    """The tiny model for the ms backend on 2 ranks and on 1, from the .ckpt and from 2-way shards:
    (folder, {single, full, sharded, merged, resharded: export dir}, 2-rank table)."""
    def build(folder):
        ckpt, weights = tiny_ckpt
        tokenizer = make_tokenizer(str(folder))
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
            export_in_subprocess(write_yaml(str(folder / f"{name}.yaml"), cfg))
        rank_table(folder / "table2.json", 2)
    folder = built_once(tmp_path_factory, "tp", build)
    return folder, {name: str(folder / name) for name in TP_EXPORTS}, str(folder / "table2.json")


@pytest.fixture(scope="session")
def lite_tp(tp_setup, tiny_ckpt, tmp_path_factory):
    """MindSpore 2.0 exports in the packed kv mode: 2 ranks as step segments (collectives on the host;
    converted to .ms, which the runtime prefers) and 1 rank (MindIR), with the tokenizer."""
    tp_folder, _, _ = tp_setup
    cases = (("tp2", {"model_parallel": 2, "collectives": "host"}), ("tp1", {"model_parallel": 1}))

    def build(folder):
        for name, parallel in cases:
            cfg = tiny_export_config(tiny_ckpt[0], str(folder / name), parallel=parallel, kv_cache="packed",
                                     lite_ms=name == "tp2")
            cfg["model"]["tokenizer"] = os.path.join(tp_folder, "tokenizer.model")
            export_in_subprocess(write_yaml(str(folder / f"{name}.yaml"), cfg), python=str(VENV_MS20_PYTHON))
    folder = built_once(tmp_path_factory, "lite_tp", build)
    return {name: str(folder / name) for name, _ in cases}


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
    def get(family):
        def build(folder):
            script = "numpy_references.py" if family in NUMPY_CASES else "hf_models.py"
            result = run_cli([os.path.join(REPO, "tests", "support", script), family, str(folder), str(STEPS)])
            assert result.returncode == 0, result.stderr[-3000:]
            if (folder / "mindformers.npz").exists():
                mindformers_ckpt(folder)    # written here, not by the first of two workers to need it
        return built_once(tmp_path_factory, f"family_{family}", build)
    return get


@pytest.fixture(scope="session")
def family_export(hf_family, tmp_path_factory):
    """(family, variant) -> export folder. Variants: io, in_graph, packed (MindSpore 2.10), lite,
    lite_packed (MindSpore 2.0, .ms), mindformers (.ckpt + MindFormers yaml), tp2 (2 ranks),
    lite_tp2_packed (MindSpore 2.0, 2 ranks as step segments), lite_segments_packed (one rank as step
    segments, .ms); a `_b1` suffix: batch size 1; `_cpu`: `target: cpu` (attention, layer ops and float32
    products as nodes of the project's kernels; its K/V in their paged store); `_paged`: the same with
    `attention: paged` written in the yaml; `_kernel`: with `attention: kernel` (host arrays)."""
    def get(family, variant):
        folder = hf_family(family)

        def build(out):
            if variant == "mindformers":
                cfg = mindformers_yaml(family, folder, mindformers_ckpt(folder), str(out))
            else:
                kv_cache = "packed" if "packed" in variant else "in_graph" if variant == "in_graph" else "io"
                cfg = {"model": {"hf_dir": str(folder / "hf")}, "seq_length": SEQ, "batch_size": BATCH,
                       "kv_cache": kv_cache, "output_dir": str(out)}
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
                if variant.endswith("_cpu"):     # target cpu: its attention, layer ops and products on the kernels
                    cfg["target"] = "cpu"
                if variant.endswith("_paged"):   # the same, its K/V in the kernels' paged store
                    cfg.update(target="cpu", attention="paged")
                if variant.endswith("_kernel"):  # target cpu with the kernels' attention over host arrays
                    cfg.update(target="cpu", attention="kernel")
            python = str(VENV_MS20_PYTHON) if variant.startswith("lite") else sys.executable
            export_in_subprocess(write_yaml(str(out) + ".yaml", cfg), python=python)
        return str(built_once(tmp_path_factory, f"family_{family}_export_{variant}", build))
    return get


@pytest.fixture(scope="session")
def long_model(tmp_path_factory):
    """family -> folder of a tiny model with 2,048 positions and transformers' answers to prompts of
    long_context_models.LENGTHS (tests/test_long_prompts.py)."""
    def get(family):
        def build(folder):
            result = run_cli([os.path.join(REPO, "tests", "support", "long_context_models.py"), family, str(folder)])
            assert result.returncode == 0, result.stderr[-3000:]
        return built_once(tmp_path_factory, f"long_{family}", build)
    return get


@pytest.fixture(scope="session")
def long_export(long_model, tmp_path_factory):
    """(family, form of long_context_models.FORMS) -> (model folder, its export at seq_length 2,048)."""
    def get(family, form):
        folder = long_model(family)

        def build(out):
            cfg = dict({"model": {"hf_dir": str(folder / "hf")}, "seq_length": LONG_POSITIONS, "batch_size": 2,
                        "output_dir": str(out / "export")}, **LONG_FORMS[form])
            python = str(VENV_MS20_PYTHON) if form.startswith("lite") else sys.executable
            export_in_subprocess(write_yaml(str(out / "export.yaml"), cfg), python=python)
        return folder, str(built_once(tmp_path_factory, f"long_{family}_{form}", build) / "export")
    return get


@pytest.fixture(scope="session")
def demo_exports(tmp_path_factory):
    """The demo yaml (kv_cache packed) for ms and mslite, for ms in the two-graph io layout, and for mslite with
    `attention: kernel` and `attention: paged`."""
    names = ("ms", "mslite", "ms_io", "mslite_kernel", "mslite_paged")

    def build(folder):
        with open(DEMO_YAML) as f:
            io_config = yaml.safe_load(f)
        demo_dir = os.path.dirname(DEMO_YAML)
        io_config["model"]["tokenizer"] = os.path.join(demo_dir, io_config["model"]["tokenizer"])
        io_config.update(load_checkpoint=os.path.join(demo_dir, io_config["load_checkpoint"]), kv_cache="io")
        io_yaml = write_yaml(str(folder / "demo_io.yaml"), io_config)
        kernel_config = dict(io_config, kv_cache="packed", attention="kernel")
        kernel_yaml = write_yaml(str(folder / "demo_kernel.yaml"), kernel_config)
        paged_yaml = write_yaml(str(folder / "demo_paged.yaml"), dict(kernel_config, attention="paged"))
        for name, python, config in zip(names, (None, VENV_MS20_PYTHON, None, VENV_MS20_PYTHON, VENV_MS20_PYTHON),
                                        (DEMO_YAML, DEMO_YAML, io_yaml, kernel_yaml, paged_yaml)):
            args = ["-m", "exporter", "--config", config, "--output_dir", str(folder / name)]
            result = run_cli(args, python=python) if python else run_cli(args)
            assert result.returncode == 0, result.stderr[-2000:]
    folder = built_once(tmp_path_factory, "demo", build)
    return {name: str(folder / name) for name in names}
