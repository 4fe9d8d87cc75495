"""`target: cpu | ascend` chooses the export's form when the yaml does not: Ascend (and no target, as
upstream) gets the two graphs of kv_cache io; Lite on CPU one packed step graph converted to `.ms`,
written as segments when there are several ranks or one rank's weights exceed what one `.ms` holds
(the export process lowers that limit here, `exporter.writing.forms.LITE_MS_LIMIT`, to take the real
path on the tiny Llama, and the size of a segment, `SEGMENT_BYTES`, to one layer per segment). Keys
the yaml gives win, and a yaml asking for upstream's two graph copies keeps them. Checked on real
exports (MindSpore 2.0) run on real Lite against transformers."""
import json
import os

import pytest

from exporter.config.schema import config_from_dict
from exporter.model_source import resolve_model
from exporter.models.config import DecoderConfig
from exporter.writing.export_plan import stored_bytes
from exporter.writing.forms import LITE_MS_LIMIT, StoredBytes, blocks_per_segment, weight_bytes
from support.export_scripts import LOWERED_LIMIT_EXPORT
from support.family_cases import BATCH, SEQ, check_parity, lite_run, reference
from support.tiny_models import VENV_MS20_PYTHON, error_lines, run_cli, write_yaml




def form(**keys):
    config = config_from_dict({"output_dir": "out", "seq_length": 32, "model": {"hf_dir": "hf"}, **keys})
    return config.kv_cache, config.parallel.collectives, config.lite_ms, config.segments_by_size


@pytest.mark.fast
def test_without_a_target_or_for_ascend_the_export_has_upstreams_two_graphs():
    assert form() == ("io", "graph", False, False)
    assert form(target="ascend") == ("io", "graph", False, False)
    assert form(target="ascend", parallel={"model_parallel": 2}) == ("io", "graph", False, False)


@pytest.mark.fast
def test_for_cpu_the_export_is_one_step_graph_and_several_ranks_are_segments():
    assert form(target="cpu") == ("packed", "graph", True, True)
    assert form(target="cpu", parallel={"model_parallel": 2}) == ("packed", "host", True, False)


@pytest.mark.fast
def test_keys_the_yaml_gives_win_over_the_target():
    assert form(target="cpu", kv_cache="io", lite_ms=False) == ("io", "graph", False, False)
    assert form(target="cpu", parallel={"collectives": "graph"}) == ("packed", "graph", True, False)
    assert form(target="cpu", compute_dtype="float16") == ("io", "graph", True, False)   # Lite CPU: float16 io only
    copies = {"prefill_model_path": "a_prefill_graph.mindir", "increment_model_path": "a_inc_graph.mindir"}
    assert form(target="cpu", infer=copies)[0] == "io"


@pytest.mark.fast
def test_for_cpu_the_attention_runs_on_the_kernel_unless_the_yaml_says_graph():
    def attention(**keys):
        return config_from_dict({"output_dir": "out", "seq_length": 32, "model": {"hf_dir": "hf"}, **keys}).attention
    assert attention(target="cpu") == "paged"         # one step graph on one rank: over the kernels' paged store
    assert attention(target="cpu", parallel={"model_parallel": 2}) == "paged"        # segments: each rank's store
    assert attention(target="cpu", parallel={"collectives": "host"}) == "paged"
    assert attention(target="cpu", attention="graph") == "graph"
    assert attention(target="cpu", compute_dtype="float16") == "graph"     # kv_cache io there
    assert attention() == attention(kv_cache="packed") == attention(target="ascend") == "graph"
    assert attention(kv_cache="packed", attention="kernel") == "kernel"


@pytest.mark.fast
@pytest.mark.parametrize("keys, words", [
    ({"target": "gpu"}, "target 'gpu' is not allowed; allowed: cpu, ascend"),
    ({"target": "cpu", "compute_dtype": "float16", "parallel": {"model_parallel": 2}},
     "target cpu with parallel.model_parallel 2 needs kv_cache packed and compute_dtype float32"),
    ({"target": "cpu", "attention": "flash"}, "attention 'flash' is not allowed; allowed: graph, kernel, paged"),
    ({"target": "ascend", "attention": "kernel"},
     "attention kernel is a Custom node that the project's kernels run on MindSpore Lite on CPU, in the packed "
     "step: it needs kv_cache packed and compute_dtype float32, not target ascend; this config has target ascend, "
     "kv_cache io"),
])
def test_a_target_that_cannot_be_met_is_refused_in_one_line(tmp_path, keys, words):
    yaml = write_yaml(str(tmp_path / "x.yaml"), {"output_dir": str(tmp_path / "out"), "seq_length": 32,
                                                 "model": {"hf_dir": str(tmp_path)}, **keys})
    result = run_cli(["-m", "exporter", "--config", yaml])
    assert result.returncode != 0
    (line,) = error_lines(result.stderr)
    assert yaml in line and words in line, line
    assert not os.path.exists(tmp_path / "out")


def test_for_cpu_the_exporting_mindspore_must_write_mindir_that_lite_reads(hf_family, tmp_path):
    """MindSpore 2.10 (this process's venv) writes MindIR Lite 2.0 cannot read: refused before tracing."""
    out = tmp_path / "out"
    yaml = write_yaml(str(tmp_path / "x.yaml"), {"output_dir": str(out), "seq_length": SEQ, "target": "cpu",
                                                 "model": {"hf_dir": str(hf_family("llama") / "hf")}})
    result = run_cli(["-m", "exporter", "--config", yaml])
    assert result.returncode != 0
    (line,) = error_lines(result.stderr)
    assert "target cpu writes the form of MindSpore Lite 2.0 on CPU" in line and "make export-lite" in line, line
    assert not out.exists()


@pytest.mark.fast
def test_the_weight_count_is_the_published_one_of_tinyllama():
    """TinyLlama-1.1B has 1,100,048,384 parameters; the count leaves out its 45 norm vectors of 2048."""
    cfg = DecoderConfig(vocab_size=32000, hidden_size=2048, num_layers=22, n_heads=32, n_kv_heads=4,
                        intermediate_size=5632)
    assert weight_bytes(cfg) // 4 == 1_100_048_384 - 45 * 2048
    assert weight_bytes(cfg) > LITE_MS_LIMIT      # so target cpu writes it as segments
    assert blocks_per_segment(cfg, 1) == 3


@pytest.mark.fast
def test_quantized_weights_are_sized_as_stored():
    """The plan counts a weight at the bytes it is stored in: TinyLlama-1.1B in int4 g32 (0.5 bytes and a
    float16 scale and min a group of 32) with an int8 head and embedding (a byte and, as Q8_0 blocks may be
    kept, a float16 scale per 32) fits one `.ms`; a 7B shape in int4 is cut four layers a segment (one in
    float32), in int8 two."""
    tiny = DecoderConfig(vocab_size=32000, hidden_size=2048, num_layers=22, n_heads=32, n_kv_heads=4,
                         intermediate_size=5632)
    seven = DecoderConfig(vocab_size=32000, hidden_size=4096, num_layers=32, n_heads=32, n_kv_heads=32,
                          intermediate_size=11008)
    quantization = {"weights": "int4", "group_size": 32, "head": "int8", "embedding": "int8"}
    int4 = stored_bytes(config_from_dict({"output_dir": "out", "seq_length": 32, "model": {"hf_dir": "hf"},
                                           "target": "cpu", "quantization": quantization}))
    assert int4 == StoredBytes(0.625, 1.0625, 1.0625)
    assert weight_bytes(tiny, int4) == int(22 * (tiny.hidden_size * tiny.head_dim * 2 * 36 + 3 * 2048 * 5632)
                                           * 0.625 + 2 * 32000 * 2048 * 1.0625)
    assert weight_bytes(tiny, int4) < LITE_MS_LIMIT
    assert [blocks_per_segment(seven, 1, stored) for stored in
            (StoredBytes(), StoredBytes.of("int8", 32, "int8", "int8"), int4)] == [1, 2, 4]
    tied = DecoderConfig(vocab_size=32000, hidden_size=2048, num_layers=1, n_heads=32, n_kv_heads=4,
                         intermediate_size=5632, tie_word_embeddings=True)
    one_table = weight_bytes(tied, StoredBytes(4.0, 1.0, 1.0))
    assert weight_bytes(tied, StoredBytes(4.0, 4.0, 1.0)) == one_table + 3 * 32000 * 2048 + 32000 * 2048


LIMIT_AT = """
import runpy, sys
import exporter.writing.forms as forms
forms.LITE_MS_LIMIT = int(sys.argv.pop(1))      # bytes
sys.argv = ["exporter"] + sys.argv[1:]
runpy.run_module("exporter", run_name="__main__")
"""


def test_a_quantized_export_under_the_limit_as_stored_is_one_ms(hf_family, tmp_path):
    """Lite's limit set between the tiny Llama's weights as stored in int4 and in float32: target cpu writes
    its int4 export as one `.ms` step, where float32 weights would be segments (the case below)."""
    out = tmp_path / "int4"
    cfg = {"model": {"hf_dir": str(hf_family("llama") / "hf")}, "seq_length": SEQ, "batch_size": BATCH,
           "target": "cpu", "output_dir": str(out), "quantization": {"weights": "int4"}}
    yaml = write_yaml(str(out) + ".yaml", cfg)
    config = config_from_dict(dict(cfg))
    model = resolve_model(config).config
    float32, int4 = weight_bytes(model), weight_bytes(model, stored_bytes(config))
    assert int4 < float32
    result = run_cli(["-c", LIMIT_AT, str((int4 + float32) // 2), "--config", yaml], python=str(VENV_MS20_PYTHON))
    assert result.returncode == 0, result.stderr[-3000:]
    assert sorted(json.load(open(out / "manifest.json"))["lite_files"]) == ["step"]


@pytest.fixture(scope="module")
def cpu_exports(hf_family, tmp_path_factory):
    """limit -> (export folder, its last line): the llama case with only `target: cpu` chosen."""
    made = {}

    def get(limit):
        if limit not in made:
            out = tmp_path_factory.mktemp("target") / f"cpu_{limit}"
            cfg = {"model": {"hf_dir": str(hf_family("llama") / "hf")}, "seq_length": SEQ, "batch_size": BATCH,
                   "target": "cpu", "output_dir": str(out)}
            yaml = write_yaml(str(out) + ".yaml", cfg)
            script = ["-c", LOWERED_LIMIT_EXPORT] if limit == "lowered" else ["-m", "exporter"]
            result = run_cli(script + ["--config", yaml], python=str(VENV_MS20_PYTHON))
            assert result.returncode == 0, result.stderr[-3000:]
            made[limit] = str(out), error_lines(result.stderr)[-1]
        return made[limit]
    return get


def test_paged_segments_that_do_not_read_the_store_are_refused_before_any_build(cpu_exports):
    """A manifest whose attention segment lost one of the paged feeds: one line naming it, no Build (the
    open_model given is a stand-in that fails the test if called)."""
    from lite_runtime.backends.segment_chain import SegmentChain
    from lite_runtime.contract.errors import ArtifactError
    from lite_runtime.contract.manifest import load_manifest
    manifest = load_manifest(cpu_exports("lowered")[0])
    blocks = manifest.segments["layer1.blocks"]
    blocks.inputs = [spec for spec in blocks.inputs if spec.name != "kv_store"]

    def no_build(name):
        raise AssertionError(f"built {name} before checking the manifest")
    with pytest.raises(ArtifactError, match=r"manifest.json: a paged export's attention segments read "
                                            r"block_tables and kv_store, but segment layer1.blocks reads only one"):
        SegmentChain(manifest, 0, no_build, None)


@pytest.mark.parametrize("limit, form_words, graphs", [
    ("lite's", "kv_cache packed: one step graph over a list of tokens of any rows, its K/V in the kernels' paged "
     "store, converted to Lite's .ms, for target cpu", ["step"]),
    ("lowered", "kv_cache packed as step segments per rank, its K/V in the kernels' paged store, converted to "
     "Lite's .ms, for target cpu",
     ["embed", "head", "layer0.blocks", "layer1.blocks"]),
])
def test_a_cpu_export_runs_on_lite_as_transformers_does(hf_family, cpu_exports, limit, form_words, graphs):
    export, last_line = cpu_exports(limit)
    assert form_words in last_line, last_line
    manifest = json.load(open(os.path.join(export, "manifest.json")))
    assert manifest["kv_cache"] == "packed"
    assert sorted(manifest["lite_files"]) == graphs
    folder = hf_family("llama")
    prompts, ref_logits, ref_tokens = reference(folder)
    logits, tokens = lite_run(folder, export, f"target_cpu_{limit}")
    check_parity(logits, tokens, ref_logits, ref_tokens, f"llama Lite, target cpu ({limit} limit)")
