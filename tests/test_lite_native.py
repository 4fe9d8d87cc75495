"""MindSpore Lite 2.0 through the native ctypes binding and the `mslite` backend, on tiny real graphs.

Graphs come from tests/support/lite_graphs.py, exported by MindSpore 2.0 (.venv-ms20) in a separate
process; every test touching Lite runs in a child process of its own (tests/support/lite_process.py).
Expected values are computed with numpy from the same weights (tolerance 1e-5).
"""
from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from support.lite_process import (REPO, ensure_lite_installed, in_child, in_lite_process, shared_graphs,
                                  shared_new_graphs)
from lite_runtime.contract.errors import ArtifactError, ConfigError, UnsupportedError
from lite_runtime.contract.families import FAMILIES, GraphDims
from lite_runtime.contract.manifest import GraphEntry, Manifest, graph_relpath, load_manifest

B, S, LAYERS, KV, D, VOCAB = 2, 8, 2, 2, 4, 16   # tests/support/lite_graphs.py toy model
TOL = dict(rtol=1e-5, atol=1e-5)


@pytest.fixture(scope="session")
def graphs(tmp_path_factory) -> Path:
    if not in_child():
        ensure_lite_installed()
    return shared_graphs(tmp_path_factory)


@pytest.fixture(scope="session")
def new_graphs(tmp_path_factory) -> Path:
    return shared_new_graphs(tmp_path_factory)


@pytest.fixture(scope="session")
def weights(graphs):
    return dict(np.load(graphs / "weights.npz"))


# --- the toy language model: export folder and numpy reference ------------------------------------
def make_export(graphs: Path, folder: Path, kv_cache: str = "io", **changes) -> Manifest:
    dims = GraphDims(B, S, LAYERS, KV, D, VOCAB)
    spec = FAMILIES["llama"]
    entries = {}
    for kind, name in (("prefill", "toy_prefill"), ("increment", "toy_increment")):
        rel = graph_relpath(kind, 0)
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(graphs / f"{name}.mindir", folder / rel)
        entries[kind] = GraphEntry([rel], spec.inputs(kind, kv_cache, dims), spec.outputs(kind, kv_cache, dims))
    fields = dict(family="llama", model_config={}, graph_dims=dims.to_json(),
                  kv_cache=kv_cache, seq_length=S, batch_size=B, world_size=1, compute_dtype="float32",
                  graphs=entries, bos_token_id=1, eos_token_id=[2], pad_token_id=0, tokenizer=None,
                  mindspore_version="2.0.0", mindir_version="1")
    fields.update(changes)
    Manifest(**fields).save(str(folder))
    return load_manifest(str(folder))


def kv_rows(w, emb, layer_scale, steps):
    rows = []
    for scale in layer_scale:
        for wmat in (w["toy_wk"], w["toy_wv"]):
            proj = emb.reshape(B * steps, KV * D) @ wmat * scale
            rows.append(proj.reshape(B, steps, KV, D).transpose(0, 2, 1, 3))
    return rows


def reference_prefill(w, ids, lengths):
    emb = w["toy_embed"][ids]
    h = emb[np.arange(B), lengths - 1]
    return h @ w["toy_out"], kv_rows(w, emb, (1.0, 2.0), S)


def reference_increment(w, ids, lengths, cache):
    emb = w["toy_embed"][ids]
    mask = (np.arange(S)[None, :] < (lengths - 1)[:, None]).astype(np.float32)[:, None, :, None]
    ctx = sum((k * mask).sum(2) + 0.5 * (v * mask).sum(2) for k, v in zip(cache[0::2], cache[1::2]))
    h = emb.reshape(B, KV * D) + 0.1 * ctx.reshape(B, KV * D)
    return h @ w["toy_out"], kv_rows(w, emb, (1.0, 2.0), 1)


def write_ini(path: Path, text: str) -> str:
    path.write_text(text)
    return str(path)


GE_ONLY_INI = """[ascend_context]
provider=ge
[ge_session_options]
ge.exec.precision_mode=must_keep_origin_dtype
ge.externalWeight=1
"""


# --- LiteModel ------------------------------------------------------------------------------------
@in_lite_process
def test_affine_graph_matches_numpy(graphs, weights):
    from lite_runtime.backends.lite_native import LiteModel
    model = LiteModel(str(graphs / "affine.mindir"), num_threads=2)
    assert [(s.name, s.dtype, s.shape) for s in model.inputs] == [("x", "float32", (2, 4)),
                                                                   ("bias", "float32", (3,))]
    assert [(s.dtype, s.shape) for s in model.outputs] == [("float32", (2, 3)), ("float32", (2,))]
    x = np.random.default_rng(0).standard_normal((2, 4)).astype(np.float32)
    bias = np.array([0.5, -1.0, 2.0], np.float32)
    model.bind_inputs([x, bias])
    y, z = model.predict()
    np.testing.assert_allclose(y, x @ weights["affine_w"] + bias, **TOL)
    np.testing.assert_allclose(z, 0.5 * x.sum(1), **TOL)
    model.close()


@in_lite_process
def test_int32_inputs_and_outputs(graphs, weights):
    from lite_runtime.backends.lite_native import LiteModel
    with LiteModel(str(graphs / "mixed.mindir")) as model:
        assert [s.dtype for s in model.inputs] == ["int32", "float32"]
        assert [s.dtype for s in model.outputs] == ["float32", "int32"]
        ids = np.array([[1, 2, 3], [4, 5, 9]], np.int32)
        model.bind_inputs([ids, np.array([3.0], np.float32)])
        gathered, doubled = model.predict()
        np.testing.assert_allclose(gathered, weights["mixed_e"][ids] * 3.0, **TOL)
        np.testing.assert_array_equal(doubled, ids * 2 + 1)


@in_lite_process
def test_binding_is_zero_copy(graphs, weights):
    """Writing into a bound array changes the next result without binding again."""
    from lite_runtime.backends.lite_native import LiteModel
    model = LiteModel(str(graphs / "affine.mindir"))
    x, bias = np.ones((2, 4), np.float32), np.zeros(3, np.float32)
    model.bind_inputs([x, bias])
    first = model.predict()[0].copy()
    x[1] = [1.0, -2.0, 3.0, -4.0]
    bias[:] = 7.0
    second = model.predict()[0]
    assert not np.allclose(first, second)
    np.testing.assert_allclose(second, x @ weights["affine_w"] + bias, **TOL)
    assert not second.flags.writeable        # results are views of buffers reused by the next call


@in_lite_process
def test_binding_checks_dtype_shape_and_layout(graphs):
    from lite_runtime.backends.lite_native import LiteModel
    model = LiteModel(str(graphs / "affine.mindir"))
    with pytest.raises(ValueError, match=r"input 0 \(x\) must have dtype float32, got float64"):
        model.bind_input(0, np.zeros((2, 4)))
    with pytest.raises(ValueError, match=r"input 1 \(bias\) must have shape \(3,\), got \(4,\)"):
        model.bind_input(1, np.zeros(4, np.float32))
    with pytest.raises(ValueError, match="C-contiguous"):
        model.bind_input(0, np.zeros((4, 2), np.float32).T)
    with pytest.raises(ValueError, match="has 2 inputs"):
        model.bind_inputs([np.zeros((2, 4), np.float32)])
    from lite_runtime.backends.lite_native import LiteError
    with pytest.raises(LiteError, match="input bias is not bound"):
        model.bind_input(0, np.zeros((2, 4), np.float32))
        model.run()


@in_lite_process
def test_lite_error_text_surfaces_for_a_bad_path(tmp_path):
    from lite_runtime.backends.lite_native import LiteModel
    missing = tmp_path / "missing.mindir"
    with pytest.raises(ArtifactError, match=f"File: {missing} does not exist"):
        LiteModel(str(missing))
    garbage = tmp_path / "garbage.mindir"
    garbage.write_bytes(b"not a protobuf")
    with pytest.raises(ArtifactError, match="MindSpore Lite cannot load .*garbage.mindir: Build failed"):
        LiteModel(str(garbage))


@in_lite_process
def test_missing_ini_reports_lites_error(graphs, tmp_path):
    from lite_runtime.backends.lite_native import LiteModel
    with pytest.raises(ArtifactError, match="LoadConfig failed: .*Invalid config file"):
        LiteModel(str(graphs / "affine.mindir"), config_path=str(tmp_path / "absent.ini"))


@in_lite_process
def test_mindir_of_new_mindspore_is_refused_clearly(new_graphs):
    from lite_runtime.backends.lite_native import LiteModel
    with pytest.raises(ArtifactError) as info:
        LiteModel(str(new_graphs / "affine.mindir"))
    message = str(info.value)
    assert "maximum mind ir version: 1" in message
    assert "MindSpore 2.0" in message and "make export-lite" in message


@in_lite_process
def test_missing_shim_says_how_to_install(monkeypatch, tmp_path):
    from lite_runtime.backends import lite_native
    monkeypatch.setattr(lite_native, "_lib", None)
    monkeypatch.setenv("LITE_SHIM_LIB", str(tmp_path / "liblite_shim.so"))
    with pytest.raises(UnsupportedError, match=rf"no shim at \$LITE_SHIM_LIB: {tmp_path}/liblite_shim.so; "
                       r"run `lite-setup` .* \(in a checkout: `make setup`\)"):
        lite_native.LiteModel("any.mindir")


# --- MSLiteSession --------------------------------------------------------------------------------
def run_toy_generation(session, weights, steps=3):
    """Prefill + `steps` decode steps through the session and through numpy; compare every logit."""
    rng = np.random.default_rng(7)
    lengths = np.array([3, 5], np.int32)
    ids = np.zeros((B, S), np.int32)
    for row, n in enumerate(lengths):
        ids[row, :n] = rng.integers(3, VOCAB, n)
    cache = [np.zeros((B, KV, S, D), np.float32) for _ in range(2 * LAYERS)]
    logits = session.prefill(ids, lengths)
    want, rows = reference_prefill(weights, ids, lengths)
    np.testing.assert_allclose(logits, want, **TOL)
    for c, r in zip(cache, rows):
        c[...] = r
    for _ in range(steps):
        token = np.argmax(want, axis=1).astype(np.int32).reshape(B, 1)
        lengths = lengths + 1
        logits = session.decode(token, lengths)
        want, rows = reference_increment(weights, token, lengths, cache)
        np.testing.assert_allclose(logits, want, **TOL)
        for c, r in zip(cache, rows):
            c[np.arange(B), :, lengths - 1] = r[:, :, 0]
    for mine, theirs in zip(session.cache.arrays, cache):
        np.testing.assert_allclose(mine, theirs, **TOL)


@in_lite_process
def test_session_prefill_and_decode_match_numpy(graphs, weights, tmp_path):
    from lite_runtime.backends.mslite_backend import MSLiteSession
    manifest = make_export(graphs, tmp_path)
    with MSLiteSession(manifest, 0, num_threads=2) as session:
        cache_addresses = [a.ctypes.data for a in session.cache.arrays]
        run_toy_generation(session, weights)
        assert [a.ctypes.data for a in session.cache.arrays] == cache_addresses
        assert session.graph_seconds > 0


@in_lite_process
def test_session_binds_the_host_cache_once(graphs, weights, tmp_path):
    """The increment graph reads the host cache arrays themselves: no copy, no rebinding per step."""
    from lite_runtime.backends.mslite_backend import MSLiteSession
    session = MSLiteSession(make_export(graphs, tmp_path))
    increment = session.lite_models["increment"]
    assert all(bound is cache for bound, cache in zip(increment._bound_inputs[2:], session.cache.arrays))
    calls = []
    original = increment.bind_input
    increment.bind_input = lambda *a: calls.append(a) or original(*a)
    run_toy_generation(session, weights, steps=2)
    assert calls == []
    seconds = session.bare_decode_predict()
    assert 0 < seconds < 1
    session.close()


@in_lite_process
def test_session_checks_the_shape_of_what_it_is_fed(graphs, tmp_path):
    from lite_runtime.backends.mslite_backend import MSLiteSession
    from lite_runtime.contract.errors import ValidationError
    with MSLiteSession(make_export(graphs, tmp_path)) as session:
        with pytest.raises(ValidationError, match=r"prefill input input_ids must have shape \(2, 8\), got \(2, 5\)"):
            session.prefill(np.ones((B, 5), np.int32), np.array([2, 3], np.int32))
        logits = session.prefill(np.ones((B, S), np.int64), np.array([2, 3]))   # int64 is narrowed in place
        assert logits.dtype == np.float32 and logits.shape == (B, VOCAB)


@in_lite_process
def test_session_with_ge_only_ini_runs_on_cpu_and_says_so_once(graphs, weights, tmp_path, caplog):
    from lite_runtime.backends.mslite_backend import MSLiteSession
    ini = write_ini(tmp_path / "ge.ini", GE_ONLY_INI)
    manifest = make_export(graphs, tmp_path / "export")
    with caplog.at_level(logging.WARNING, logger="lite_runtime.mslite"):
        with MSLiteSession(manifest, config_path=f"{ini},{ini}") as session:
            run_toy_generation(session, weights, steps=1)
        MSLiteSession(manifest, config_path=ini).close()
    notices = [r for r in caplog.records if "ignores the GE sections" in r.getMessage()]
    assert len(notices) == 1
    assert "[ascend_context], [ge_session_options]" in notices[0].getMessage()


@in_lite_process
def test_session_refuses_a_malformed_ini(graphs, tmp_path):
    from lite_runtime.backends.mslite_backend import MSLiteSession
    manifest = make_export(graphs, tmp_path / "export")
    bad = write_ini(tmp_path / "bad.ini", "[ascend_context]\nprovider ge\n")
    with pytest.raises(ConfigError, match="bad.ini: line 2"):
        MSLiteSession(manifest, config_path=bad)
    good = write_ini(tmp_path / "good.ini", GE_ONLY_INI)
    with pytest.raises(ConfigError, match="names 3 files"):
        MSLiteSession(manifest, config_path=f"{good},{good},{good}")


@in_lite_process
def test_session_refuses_in_graph_exports_on_cpu(graphs, tmp_path):
    from lite_runtime.backends.mslite_backend import MSLiteSession
    manifest = make_export(graphs, tmp_path, kv_cache="in_graph")
    with pytest.raises(UnsupportedError, match="kv_cache is 'in_graph'.*export again with kv_cache: io"):
        MSLiteSession(manifest)


@in_lite_process
def test_session_refuses_new_mindir_from_the_manifest(graphs, tmp_path):
    from lite_runtime.backends.mslite_backend import MSLiteSession
    manifest = make_export(graphs, tmp_path / "a", mindspore_version="2.10.0", mindir_version="3")
    with pytest.raises(UnsupportedError, match="MindIR version 3.*MindSpore 2.10.0.*make export-lite"):
        MSLiteSession(manifest)
    manifest = make_export(graphs, tmp_path / "b", mindspore_version="2.7.0", mindir_version="")
    with pytest.raises(UnsupportedError, match="MindSpore 2.7.0.*Lite-compatible environment"):
        MSLiteSession(manifest)


@in_lite_process
def test_session_translates_lites_version_error(graphs, new_graphs, tmp_path):
    """A manifest that claims MindSpore 2.0 but holds newer MindIR: Lite's own error, translated."""
    from lite_runtime.backends.mslite_backend import MSLiteSession
    manifest = make_export(graphs, tmp_path)
    shutil.copyfile(new_graphs / "affine.mindir", manifest.graph_path("prefill", 0))
    with pytest.raises(ArtifactError, match="too new for MindSpore Lite 2.0.*make export-lite"):
        MSLiteSession(manifest)


@in_lite_process
def test_session_names_the_first_mismatching_input(graphs, tmp_path):
    from lite_runtime.backends.mslite_backend import MSLiteSession
    manifest = make_export(graphs, tmp_path)
    inputs = manifest.graphs["increment"].inputs
    inputs[1] = type(inputs[1])(inputs[1].name, "int64", inputs[1].shape)
    with pytest.raises(ArtifactError, match=r"graph input 1 has dtype int32, but the manifest expects "
                                            r"batch_valid_length int64"):
        MSLiteSession(manifest)
    manifest = make_export(graphs, tmp_path / "swapped")
    entry = manifest.graphs["prefill"]
    entry.files[0], manifest.graphs["increment"].files[0] = manifest.graphs["increment"].files[0], entry.files[0]
    with pytest.raises(ArtifactError, match="has 6 inputs but the manifest lists 2"):
        MSLiteSession(manifest)


def test_mslite_process_never_loads_mindspore(graphs, tmp_path):
    """A whole generation through the backend registry; then no mindspore module in sys.modules."""
    export = tmp_path / "export"
    make_export(graphs, export)
    script = f"""
import sys
import numpy as np
from lite_runtime.backends import load_session
from lite_runtime.contract.manifest import load_manifest
session = load_session("mslite", load_manifest({str(export)!r}))
session.prefill(np.ones(({B}, {S}), np.int32), np.array([2, 3], np.int32))
session.decode(np.ones(({B}, 1), np.int32), np.array([3, 4], np.int32))
session.close()
loaded = sorted(m for m in sys.modules if m == "mindspore" or m.startswith("mindspore."))
print("MINDSPORE_MODULES", loaded)
"""
    result = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True,
                            timeout=300, env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert result.returncode == 0, result.stderr
    assert "MINDSPORE_MODULES []" in result.stdout


@pytest.mark.fast
def test_lite_error_text_says_a_repeated_log_line_once_with_its_count():
    """Lite logs one line per tensor for a missing .msw weight file; the error keeps its text, once."""
    from lite_runtime.backends.lite_native import _last_error

    class FakeShim:
        def lite_last_error(self):
            line = "Read weight file failed: model.msw does not exist"
            return ("Build failed: Common error code. Lite log: " + "; ".join([line] * 300) + "; Load failed").encode()
    assert _last_error(FakeShim()) == ("Build failed: Common error code. Lite log: Read weight file failed: model.msw "
                                       "does not exist (300 times); Load failed")


def test_lite_pipeline_exits_quietly_after_import_torch(tiny_ckpt, tmp_path):
    """`import torch` first changes the order modules are torn down at exit; a Lite pipeline left open
    must still free its models without "Exception ignored in LiteModel.__del__"."""
    from support.tiny_models import VENV_MS20_PYTHON, export_in_subprocess, make_tokenizer, tiny_export_config, write_yaml
    ensure_lite_installed()
    config = tiny_export_config(tiny_ckpt[0], str(tmp_path / "lite"), model={"tokenizer": make_tokenizer(str(tmp_path))})
    export = export_in_subprocess(write_yaml(str(tmp_path / "lite.yaml"), config), python=VENV_MS20_PYTHON)
    script = (f"import torch\nfrom lite_runtime import pipeline\n"
              f"pipe = pipeline(model={export!r}, backend='mslite')\nprint(pipe('one two', max_new_tokens=2))\n")
    result = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True,
                            timeout=300, env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert result.returncode == 0, result.stderr
    assert "text_generation_text" in result.stdout
    assert "Exception ignored" not in result.stderr, result.stderr
