"""Weight-only quantized exports (`quantization: {weights: int8 | int4, group_size}`, target cpu): the
linear layers are Custom nodes run by the project's Lite kernels. A tiny Llama exported so gives, on
Lite, the greedy tokens of transformers run on the same quantized-then-dequantized weights, and logits
within family_cases.TOLERANCE of them (the quantization is the export's only change: the products sum
in another order); the manifest records the scheme; what cannot run them is refused in one line."""
import json
import os
import re
from pathlib import Path

import numpy as np
import pytest

from lite_runtime.contract.errors import ArtifactError, ConfigError, UnsupportedError
from lite_runtime.contract.manifest import load_manifest
from support.family_cases import BATCH, SEQ, STEPS, TOLERANCE, check_parity, lite_run
from support.tiny_models import REPO, VENV_MS20_PYTHON, export_in_subprocess, rank_table, run_cli, write_yaml

SCHEMES = [("int8", 32, "packed"), ("int4", 32, "packed"), ("int4", 64, "segments"), ("int8", 32, "segments"),
           ("int8", -1, "packed"),        # int8 per output channel
           ("int4", 128, "tied"), ("int8", 32, "head"),      # head: the head quantized to int8 too
           ("int8", 32, "tied_head"),     # a head tied to the embedding, quantized as an int8 copy of it
           ("int8", 128, "tied_shared"),  # the embedding int8 too: the tied head reads its int8 table (rows of 64:
                                          # one short group)
           ("float32", 32, "tied"),       # float32 weights as the kernels' panels, the tied table too
           ("float32", 32, "tied_segments")]   # and so as segments: the embedding's and the head's each hold it


def schemes_of(form):
    """(head, embedding) schemes of a test form."""
    shared = form.startswith("tied_shared")
    return "int8" if form.endswith("head") or shared else "float32", "int8" if shared else "float32"


def tied_folder(folder):
    """The tiny Llama with its head tied to the embedding (as SmolLM2's): lm_head.weight dropped."""
    import shutil
    from safetensors.numpy import load_file, save_file
    tied = folder / "hf_tied"
    if not tied.exists():
        shutil.copytree(folder / "hf", tied)
        config = json.loads((tied / "config.json").read_text())
        (tied / "config.json").write_text(json.dumps(dict(config, tie_word_embeddings=True)))
        tensors = load_file(str(tied / "model.safetensors"))
        tensors.pop("lm_head.weight")
        save_file(tensors, str(tied / "model.safetensors"), metadata={"format": "pt"})
    return tied


@pytest.fixture(scope="module")
def quantized(hf_family):
    """(scheme, group, form) -> (export folder, reference logits, reference tokens), made on first use."""
    folder, made = hf_family("llama"), {}

    def get(scheme, group, form):
        key = (scheme, group, form)
        if key not in made:
            name = f"q_{scheme}_g{group}_{form}"
            ref = folder / f"{name}_reference.npz"
            hf = tied_folder(folder) if form.startswith("tied") else folder / "hf"
            head, embedding = schemes_of(form)
            result = run_cli([os.path.join(REPO, "tests", "support", "quant_reference.py"), str(hf), scheme,
                              str(group), str(STEPS), str(ref), "2" if form.endswith("tp2") else "1", head, embedding])
            assert result.returncode == 0, result.stderr[-3000:]
            cfg = {"model": {"hf_dir": str(hf)}, "seq_length": SEQ, "batch_size": BATCH, "target": "cpu",
                   "quantization": {"weights": scheme, "group_size": group}, "output_dir": str(folder / name)}
            if form.endswith("segments"):     # one rank's step as segments of whole layers, each a .ms
                cfg["parallel"] = {"collectives": "host"}
            cfg["quantization"].update(head=head, embedding=embedding)
            if form.endswith("tp2"):          # two ranks' steps as segments, the all-reduces on the host
                cfg["parallel"] = {"model_parallel": 2, "collectives": "host"}
            export = export_in_subprocess(write_yaml(str(folder / f"{name}.yaml"), cfg), python=VENV_MS20_PYTHON)
            got = np.load(ref)
            made[key] = export, got["logits"], got["tokens"]
        return made[key]
    return get


@pytest.mark.parametrize("scheme, group, form", SCHEMES)
def test_a_quantized_llama_on_lite_gives_transformers_on_the_dequantized_weights(hf_family, quantized, scheme,
                                                                                group, form):
    export, ref_logits, ref_tokens = quantized(scheme, group, form)
    manifest = load_manifest(export)
    # int4: with mins, or a weight on Q4_0's grid without; int8: in groups, or per channel (either may be met in
    # the weights: rows not of 32s are per channel)
    layers = {"float32": ["LiteLinearF32P16"], "int8": ["LiteLinearI8P16", "LiteLinearI8GroupF16P16"],
              "int4": ["LiteLinearI4F16P16", "LiteLinearI4SymF16P16"]}[scheme]
    head, embedding = schemes_of(form)
    # the head on a kernel too
    head_types = ["LiteLinearI8P16", "LiteLinearI8GroupF16P16"] if head == "int8" else ["LiteLinearF32P16"]
    # the embedding looked up by a kernel: int8 (in groups, or by rows), or the float32 panels a tied head reads
    lookups = ["LiteGatherI8P16", "LiteGatherI8GroupF16P16"] if embedding == "int8" else ["LiteGatherF32P16"] \
        if form.startswith("tied") and head == embedding else []
    # the attention over the paged store (target cpu's default), as one graph or as segments
    assert manifest.kernels == (layers + [t for t in head_types if t not in layers] + lookups
                                + ["LitePagedAttend", "LiteRMSNorm", "LiteSwiGLU", "LiteRotary"])
    if lookups == ["LiteGatherF32P16"]:    # the tied table, read in place by the head and the lookup: the loader
        from lite_runtime.backends.lite_weights import matmul_weight_ranges     # must not give its pages back
        table = manifest.dims.vocab_size * manifest.model_config["hidden_size"] * 4
        given_back = [[length for _, length in matmul_weight_ranges(ms.read_bytes())].count(table)
                      for ms in sorted(Path(export).rglob("*.ms"))]
        assert len(given_back) == (3 if form == "tied_segments" else 1) and not any(given_back), given_back
    assert (manifest.quantization["head"], manifest.quantization["embedding"]) == (head, embedding)
    assert manifest.quantization["head_on_kernel"] is True
    assert manifest.quantization["weights"] == scheme
    assert manifest.quantization.get("group_size", group) == group
    assert (manifest.collectives == "host") == form.endswith("segments")
    logits, tokens = lite_run(hf_family("llama"), export, f"q_{scheme}_{group}_{form}_run")
    what = f"llama {scheme} g{group} ({form}) on Lite"
    check_parity(logits, tokens, ref_logits, ref_tokens, what)


def test_int8_activations_give_transformers_with_each_linear_input_quantized_alike(hf_family, quantized, tmp_path):
    """The runtime's int8_activations (AVX512-VNNI): the grouped int8 products on inputs quantized in runs of 32,
    against transformers on the dequantized weights with each such layer's input quantized so (a hook); where the
    CPU lacks VNNI, refused in one line."""
    export, _, _ = quantized("int8", 32, "packed")
    folder = hf_family("llama")
    ref = tmp_path / "a8_reference.npz"
    result = run_cli([os.path.join(REPO, "tests", "support", "quant_reference.py"), str(folder / "hf"), "int8", "32",
                      str(STEPS), str(ref), "1", "float32", "float32", "int8"])
    assert result.returncode == 0, result.stderr[-3000:]
    if "avx512_vnni" not in open("/proc/cpuinfo").read():
        result = run_cli([os.path.join(REPO, "tests", "support", "parity_runner.py"), "mslite", export,
                          str(folder / "prompts.json"), str(STEPS), str(tmp_path / "out.npz"), "int8_activations=True"])
        assert result.returncode != 0 and "needs a CPU with AVX512-VNNI" in result.stderr
        return
    logits, tokens = lite_run(folder, export, "q_int8_a8_run", "int8_activations=True")
    got = np.load(ref)
    check_parity(logits, tokens, got["logits"], got["tokens"], "llama int8 g32 with int8 activations on Lite")
    plain = quantized("int8", 32, "packed")[1]
    assert np.abs(plain - got["logits"]).max() > 10 * TOLERANCE     # the reference differs from the float products'


def test_int8_activations_without_int8_groups_or_on_backend_ms_are_one_line(hf_family, quantized):
    from support.runtime_checks import assert_one_line_error
    export, _, _ = quantized("int4", 32, "packed")
    base = ["run_infer_main.py", "--model_dir", export, "--predict_data", "hi", "--int8_activations", "True"]
    assert_one_line_error(run_cli(base), "int8_activations runs the products of `quantization: {weights: int8}` in "
                          "groups of 32", "has weights int4, group_size 32: leave it off")
    assert_one_line_error(run_cli(base + ["--backend", "ms"]), "int8_activations runs the kernels of backend 'mslite'",
                          "with backend 'ms'")


@pytest.mark.parametrize("scheme, form", [("int8", "tp2"), ("int4", "tp2"), ("int8", "tied_shared_tp2")])
def test_quantized_tp2_segments_give_transformers_on_each_ranks_quantized_shares(hf_family, quantized, scheme, form,
                                                                                tmp_path):
    """Two ranks under the launcher (MPI): each rank quantizes its own share of every weight. A
    column-parallel share is whole output rows, quantized as with one rank; a row-parallel share (o_proj,
    down_proj) is half of each row's inputs, with its own int8 scale. A head tied to an int8 embedding (as
    SmolLM2's) is each rank's vocabulary rows of the float table, quantized as such, beside the whole int8 table."""
    export, ref_logits, ref_tokens = quantized(scheme, 32, form)
    manifest = load_manifest(export)
    assert manifest.world_size == 2 and manifest.collectives == "host"
    prompts = hf_family("llama") / "prompts.json"
    result = run_cli(["-m", "lite_runtime.cli.launch", "--rank_table", rank_table(tmp_path / "table2.json", 2),
                      "--backend", "mslite", "--log_dir", str(tmp_path / "logs"), "--",
                      os.path.join(REPO, "tests", "support", "tp_worker.py"), str(tmp_path), str(STEPS), str(prompts),
                      "--model_dir", export])
    assert result.returncode == 0, result.stderr[-2000:]
    for rank in range(2):
        got = np.load(tmp_path / f"rank_{rank}.npz")
        what = f"llama {scheme} g32 on 2 ranks (rank {rank})"
        check_parity(got["logits"], got["tokens"], ref_logits, ref_tokens, what)


def test_quantized_weights_are_smaller_on_disk(hf_family, family_export, quantized):
    def weight_bytes(export):
        m = load_manifest(export)
        return sum(os.path.getsize(os.path.join(export, f)) for files in m.lite_files.values() for f in files)
    f32 = weight_bytes(family_export("llama", "lite_packed"))
    int8 = weight_bytes(quantized("int8", 32, "packed")[0])
    int4 = weight_bytes(quantized("int4", 32, "packed")[0])
    assert int4 < int8 < f32


@pytest.mark.fast
def test_quantization_values_are_refused_in_one_line(tmp_path):
    from exporter.config.schema import config_from_dict
    base = {"model": {"hf_dir": "x"}, "seq_length": 8, "output_dir": str(tmp_path), "target": "cpu"}
    with pytest.raises(ConfigError, match=r"^<dict>: quantization.weights 'int3' is not allowed; allowed: none, "
                                          r"float32, int8, int4$"):
        config_from_dict(dict(base, quantization={"weights": "int3"}))
    with pytest.raises(ConfigError, match=r"quantization.group_size 48 is not allowed; allowed: 32, 64, 128, or "
                                          r"with weights int8 -1 \(one scale per output channel\)$"):
        config_from_dict(dict(base, quantization={"weights": "int4", "group_size": 48}))
    with pytest.raises(ConfigError, match=r"quantization.group_size -1 is not allowed"):
        config_from_dict(dict(base, quantization={"weights": "int4", "group_size": -1}))
    assert config_from_dict(dict(base, quantization={"weights": "int8", "group_size": -1})).quantization.group_size \
        == -1
    with pytest.raises(ConfigError, match=r"needs target cpu and compute_dtype float32 \(or target ascend, int8 only: "
                                          r"Lite's converter quantizes for GE\); this config has target None$"):
        config_from_dict(dict(base, target=None, quantization={"weights": "int8"}))
    with pytest.raises(ConfigError, match=r"on target ascend MindSpore Lite's converter quantizes the weights for GE: "
                                          r".*this config has quantization.weights int4, quantization.head int8$"):
        config_from_dict(dict(base, target="ascend", quantization={"weights": "int4", "head": "int8"}))
    with pytest.raises(ConfigError, match=r"on target ascend .*per output channel.*this config has "
                                          r"quantization.group_size 64$"):
        config_from_dict(dict(base, target="ascend", quantization={"weights": "int8", "group_size": 64}))
    with pytest.raises(ConfigError, match=r"quantization.head 'int4' is not allowed; allowed: float32, int8$"):
        config_from_dict(dict(base, quantization={"weights": "int4", "head": "int4"}))
    with pytest.raises(ConfigError, match=r"quantization.head int8 needs quantized weights"):
        config_from_dict(dict(base, quantization={"head": "int8"}))
    with pytest.raises(ConfigError, match=r"quantization.embedding int8 needs quantized weights \(quantization.weights "
                                          r"int8 or int4, not float32\)$"):
        config_from_dict(dict(base, quantization={"weights": "float32", "embedding": "int8"}))
    with pytest.raises(ConfigError, match=r"quantization.embedding 'int4' is not allowed; allowed: float32, int8$"):
        config_from_dict(dict(base, quantization={"weights": "int8", "embedding": "int4"}))
    with pytest.raises(ConfigError, match=r"quantization.embedding int8 needs quantized weights"):
        config_from_dict(dict(base, quantization={"embedding": "int8"}))
    assert config_from_dict(dict(base, quantization={"weights": "int4", "group_size": 128})).quantization.group_size \
        == 128
    # the head and the embedding follow the weights unless set (llama.cpp's types quantize both); float32 on Ascend
    follow = config_from_dict(dict(base, quantization={"weights": "int4"})).quantization
    assert (follow.head, follow.embedding) == ("int8", "int8")
    kept = config_from_dict(dict(base, quantization={"weights": "int8", "head": "float32"})).quantization
    assert (kept.head, kept.embedding) == ("float32", "int8")
    ascend = config_from_dict(dict(base, target="ascend", quantization={"weights": "int8"})).quantization
    assert (ascend.head, ascend.embedding) == ("float32", "float32")


def int8_export_naming_kernels(quantized, tmp_path, kernels) -> str:
    """A copy of the int8 export whose manifest names `kernels`."""
    import shutil
    export = str(tmp_path / "export")
    shutil.copytree(quantized("int8", 32, "packed")[0], export)
    path = os.path.join(export, "manifest.json")
    data = json.load(open(path))
    json.dump(dict(data, kernels=kernels), open(path, "w"))
    return export


def test_a_weight_int4_or_grouped_int8_cannot_hold_is_refused_naming_it():
    """int4's scales and mins are float16: a weight beyond 65504 is refused by name, with what to use instead;
    so is one beyond 127 times that in grouped int8 (its scales float16 too), which per channel holds."""
    import mindspore as ms
    from mindspore import nn
    from exporter.models.linear import Linear, LinearKernels
    from lite_runtime.contract.errors import WeightError

    class OneLayer(nn.Cell):
        head_is_embedding = False

        def __init__(self):
            super().__init__()
            self.proj = Linear(64, 16, ms.float32)
    kernels = LinearKernels(OneLayer(), "int4", 32)
    w = np.zeros((16, 64), np.float32)
    w[3, 5] = 1e5
    with pytest.raises(WeightError, match=r"proj\.weight: a weight of magnitude 1e\+05 is beyond float16's 65504.*"
                                          r"quantization\.weights float32, or int8 with group_size -1"):
        kernels.finish("proj.weight", w)
    w[3, 5] = 1e7
    with pytest.raises(WeightError, match=r"proj\.weight: a weight of magnitude 1e\+07 is beyond 127 times float16's "
                                          r"65504, the type of grouped int8's scales; export it with .*group_size -1"):
        LinearKernels(OneLayer(), "int8", 32).finish("proj.weight", w)
    assert LinearKernels(OneLayer(), "int8", -1).finish("proj.weight", w).storage == "int8"


def test_an_export_needing_kernels_the_runtime_lacks_is_refused_in_one_line(quantized, tmp_path):
    from lite_runtime.backends import load_session
    export = int8_export_naming_kernels(quantized, tmp_path, ["LiteLinearQ3"])
    script = ("import sys\nfrom lite_runtime.backends import load_session\n"        # Lite: without mindspore
              "from lite_runtime.contract.errors import UnsupportedError\n"
              "from lite_runtime.contract.manifest import load_manifest\n"
              "try:\n    load_session('mslite', load_manifest(sys.argv[1]))\n"
              "except UnsupportedError as e:\n    print(e)\n")
    said = run_cli(["-c", script, export])
    assert said.returncode == 0, said.stderr[-2000:]
    assert re.search(r"needs the project's Lite kernels LiteLinearQ3, which this runtime lacks .*run `lite-setup` "
                     r"again$", said.stdout.strip()), said.stdout
    with pytest.raises(UnsupportedError, match="only the project's kernels on MindSpore Lite run; use backend 'mslite'"):
        load_session("ms", load_manifest(export))


@pytest.mark.parametrize("kernel, layout", [("LiteLinearI8", "int8 rows stored whole"),
                                            ("LiteLinearI8P4", "int8 in panels of 4 rows"),
                                            ("LiteLinearI4Min", "int4 rows stored whole"),
                                            ("LiteLinearI4MinP16", "int4 with float32 scales and mins")])
def test_an_int8_export_of_a_retired_layout_is_refused_with_the_command_that_exports_it_again(quantized, tmp_path,
                                                                                              kernel, layout):
    export = int8_export_naming_kernels(quantized, tmp_path, [kernel])
    with pytest.raises(ArtifactError, match=rf"linear layers run the kernel {kernel} \({layout}.*\), which is "
                                            r"retired: export it again with this version: python -m exporter"):
        load_manifest(export)
