"""The official `mindspore_lite` path of the mslite backend, against a RECORDING STAND-IN module.

The real package only runs on Ascend servers (and its PyPI wheel is cp37-only), so these tests
inject `StandInMindsporeLite` as `sys.modules["mindspore_lite"]`. It implements only the calls the
backend makes and records them; the tests check the call sequence (context fields, ModelGroup,
build_from_file arguments, inputs set before predict). It proves the wiring, not Lite's behaviour.
"""
from __future__ import annotations

import enum
import os
import sys
from types import SimpleNamespace

import numpy as np
import pytest

from lite_runtime.contract.errors import ArtifactError, UnsupportedError
from lite_runtime.contract.families import FAMILIES, GraphDims
from lite_runtime.contract.manifest import GraphEntry, Manifest, graph_relpath

pytestmark = pytest.mark.fast      # no export, no graph, no Lite, no model process: `make test-fast`

B, S, LAYERS, KV, D, VOCAB = 1, 8, 2, 2, 4, 16


class StandInMindsporeLite:
    """A recording stand-in for the `mindspore_lite` module (NOT the real package)."""

    def __init__(self, graph_inputs, graph_outputs):
        self.calls = []
        self.graph_inputs, self.graph_outputs = graph_inputs, graph_outputs   # {path: [TensorSpec]}
        stand_in = self

        class DataType(enum.Enum):
            INT32 = 34
            INT64 = 35
            FLOAT32 = 43

        class ModelType(enum.Enum):
            MINDIR = 0

        class ModelGroupFlag(enum.Enum):
            SHARE_WEIGHT = 1
            SHARE_WORKSPACE = 2

        class Recorder:
            def __init__(self, prefix):
                object.__setattr__(self, "_prefix", prefix)

            def __setattr__(self, name, value):
                stand_in.calls.append(("set", f"{self._prefix}.{name}", value))
                object.__setattr__(self, name, value)

        class Context(Recorder):
            def __init__(self):
                super().__init__("context")
                object.__setattr__(self, "ascend", Recorder("context.ascend"))
                object.__setattr__(self, "cpu", Recorder("context.cpu"))
                stand_in.calls.append(("Context",))

        class Tensor:
            def __init__(self, spec):
                self.name, self.shape = spec.name, list(spec.shape)
                self.dtype = DataType[spec.dtype.upper()]
                self.data = np.zeros(spec.shape, spec.dtype)

            def set_data_from_numpy(self, array):
                stand_in.calls.append(("set_data", self.name, array.shape))
                self.data = array.copy()

            def get_data_to_numpy(self):
                return self.data

        class Model:
            def __init__(self):
                self.path = None

            def build_from_file(self, model_path, model_type, context, config_path="", **options):
                stand_in.calls.append(("build_from_file", model_path, model_type, context, config_path, options))
                self.path = model_path
                self._inputs = [Tensor(s) for s in stand_in.graph_inputs[model_path]]

            def get_inputs(self):
                return self._inputs

            def predict(self, inputs):
                stand_in.calls.append(("predict", self.path, [t.name for t in inputs]))
                outputs = [Tensor(s) for s in stand_in.graph_outputs[self.path]]
                outputs[0].data = np.full(outputs[0].shape, float(len(stand_in.calls)), np.float32)
                return outputs

        class ModelGroup:
            def __init__(self, flags):
                stand_in.calls.append(("ModelGroup", flags))

            def add_model(self, models):
                stand_in.calls.append(("add_model", list(models)))

        self.module = SimpleNamespace(Context=Context, Model=Model, ModelType=ModelType, DataType=DataType,
                                      ModelGroup=ModelGroup, ModelGroupFlag=ModelGroupFlag,
                                      __name__="mindspore_lite (recording stand-in)")

    def named(self, name):
        return [c for c in self.calls if c[0] == name]


def make_manifest(root, kv_cache="io") -> Manifest:
    dims, spec = GraphDims(B, S, LAYERS, KV, D, VOCAB), FAMILIES["llama"]
    graphs = {kind: GraphEntry([graph_relpath(kind, 0)], spec.inputs(kind, kv_cache, dims),
                               spec.outputs(kind, kv_cache, dims)) for kind in ("prefill", "increment")}
    return Manifest(family="llama", model_config={}, graph_dims=dims.to_json(),
                    kv_cache=kv_cache, seq_length=S, batch_size=B, world_size=1, compute_dtype="float32",
                    graphs=graphs, bos_token_id=1, eos_token_id=[2], pad_token_id=0, tokenizer=None,
                    mindspore_version="2.3.0", mindir_version="3", root=str(root))


@pytest.fixture
def stand_in(monkeypatch, tmp_path):
    def install(manifest):
        paths = {kind: manifest.graph_path(kind, 0) for kind in ("prefill", "increment")}
        fake = StandInMindsporeLite({paths[k]: manifest.graphs[k].inputs for k in paths},
                                    {paths[k]: manifest.graphs[k].outputs for k in paths})
        monkeypatch.setitem(sys.modules, "mindspore_lite", fake.module)
        return fake
    return install


def write_ini(path, provider=True):
    path.write_text(("[ascend_context]\nprovider=ge\n" if provider else "") +
                    "[ge_session_options]\nge.exec.precision_mode=must_keep_origin_dtype\n")
    return str(path)


def test_ascend_in_graph_uses_ge_context_and_one_shared_weight_group(stand_in, tmp_path):
    from lite_runtime.backends.mslite_backend import MSLiteSession
    manifest = make_manifest(tmp_path, kv_cache="in_graph")
    fake = stand_in(manifest)
    prefill_ini, increment_ini = write_ini(tmp_path / "p.ini"), write_ini(tmp_path / "i.ini")
    session = MSLiteSession(manifest, 0, config_path=f"{prefill_ini},{increment_ini}", device_id=3,
                            target="Ascend", config_dict={"ascend_context": {"plugin_custom_ops": "All"}})
    mod = fake.module
    assert fake.calls[:6] == [("Context",), ("set", "context.target", ["ascend"]),
                              ("set", "context.ascend.device_id", 3), ("set", "context.ascend.rank_id", 0),
                              ("set", "context.ascend.provider", "ge"),
                              ("ModelGroup", mod.ModelGroupFlag.SHARE_WEIGHT)]
    (_, grouped), = fake.named("add_model")
    builds = fake.named("build_from_file")
    assert [b[1] for b in builds] == [manifest.graph_path("prefill", 0), manifest.graph_path("increment", 0)]
    assert [b[4] for b in builds] == [prefill_ini, increment_ini]
    assert all(b[2] is mod.ModelType.MINDIR and b[3] is builds[0][3] for b in builds)
    assert all(b[5] == {"config_dict": {"ascend_context": {"plugin_custom_ops": "All"}}} for b in builds)
    assert [id(m) for m in grouped] == [id(session._runner.models[k]) for k in ("prefill", "increment")]
    assert fake.calls.index(fake.named("add_model")[0]) < fake.calls.index(builds[0])
    assert session.cache.arrays == []                 # in_graph: the cache lives in the shared graphs

    logits = session.prefill(np.ones((B, S), np.int32), np.array([3], np.int32))
    assert logits.shape == (B, VOCAB)
    session.decode(np.ones((B, 1), np.int32), np.array([4], np.int32))
    predicts = fake.named("predict")
    assert [p[1] for p in predicts] == [b[1] for b in builds]
    assert predicts[1][2] == ["input_ids", "batch_valid_length"]
    assert session.bare_decode_predict() >= 0
    session.close()


def test_cpu_target_io_export_sets_threads_and_no_group(stand_in, tmp_path):
    from lite_runtime.backends.mslite_backend import MSLiteSession
    manifest = make_manifest(tmp_path)
    fake = stand_in(manifest)
    session = MSLiteSession(manifest, num_threads=4)
    assert fake.calls[:3] == [("Context",), ("set", "context.target", ["cpu"]), ("set", "context.cpu.thread_num", 4)]
    assert not fake.named("ModelGroup")
    assert [b[4:] for b in fake.named("build_from_file")] == [("", {}), ("", {})]
    session.prefill(np.ones((B, S), np.int32), np.array([3], np.int32))
    session.decode(np.ones((B, 1), np.int32), np.array([4], np.int32))
    fed = [c[1] for c in fake.named("set_data")]
    assert fed[2:] == ["input_ids", "batch_valid_length"] + [s.name for s in manifest.graphs["increment"].inputs[2:]]


def test_ascend_without_ge_provider_in_ini_leaves_provider_unset(stand_in, tmp_path):
    from lite_runtime.backends.mslite_backend import MSLiteSession
    manifest = make_manifest(tmp_path)
    fake = stand_in(manifest)
    MSLiteSession(manifest, config_path=write_ini(tmp_path / "c.ini", provider=False), target="ascend")
    assert not [c for c in fake.calls if c[:2] == ("set", "context.ascend.provider")]


def test_graph_input_mismatch_is_named(stand_in, tmp_path):
    from lite_runtime.backends.mslite_backend import MSLiteSession
    manifest = make_manifest(tmp_path)
    fake = stand_in(manifest)
    path = manifest.graph_path("prefill", 0)
    spec = fake.graph_inputs[path][0]
    fake.graph_inputs[path] = [type(spec)("tokens", spec.dtype, spec.shape)] + fake.graph_inputs[path][1:]
    with pytest.raises(ArtifactError, match="graph input 0 is named 'tokens'.*expects input_ids"):
        MSLiteSession(manifest)


def test_an_export_quantized_by_lites_converter_builds_its_int8_graphs_on_ascend_only(stand_in, tmp_path):
    """`quantization.weights: int8` with `target: ascend`: the converter's outputs on Ascend, the float
    graphs on CPU, and a clear refusal before any Build while they are not written yet."""
    from lite_runtime.ascend.weight_quant import record
    from lite_runtime.backends.mslite_backend import MSLiteSession
    manifest = make_manifest(tmp_path)
    manifest.quantization = record()
    fake = stand_in(manifest)
    converted = {kind: manifest.graph_path(kind, 0)[: -len(".mindir")] + "_ascend_int8.mindir"
                 for kind in ("prefill", "increment")}
    with pytest.raises(ArtifactError, match=r"quantizes its weights to int8 with MindSpore Lite's converter on "
                                            r"Ascend, and .*full.*_ascend_int8.mindir does not exist yet: run "
                                            r"`python -m lite_runtime.cli.ge_config quantize --model_dir "):
        MSLiteSession(manifest, target="ascend")
    assert not fake.named("build_from_file")
    for kind, path in converted.items():
        fake.graph_inputs[path] = manifest.graphs[kind].inputs
        fake.graph_outputs[path] = manifest.graphs[kind].outputs
        os.makedirs(os.path.dirname(path), exist_ok=True)
        open(path, "wb").close()
    MSLiteSession(manifest, target="ascend")
    assert [b[1] for b in fake.named("build_from_file")] == list(converted.values())
    MSLiteSession(manifest, target="cpu")
    assert [b[1] for b in fake.named("build_from_file")][2:] == [manifest.graph_path(k, 0)
                                                                 for k in ("prefill", "increment")]


def test_ascend_target_without_the_package_is_refused(monkeypatch, tmp_path):
    from lite_runtime.backends.mslite_backend import MSLiteSession
    monkeypatch.setitem(sys.modules, "mindspore_lite", None)      # makes `import mindspore_lite` fail
    with pytest.raises(UnsupportedError, match="target 'ascend' needs the mindspore_lite package"):
        MSLiteSession(make_manifest(tmp_path), target="ascend")
