"""Exported graphs (MindSpore 2.10, `ms` backend) against the eager MindSpore network.

The eager reference recomputes the whole sequence without a cache at every step (PyNative), so
it checks the prefill graph, the increment graph and the host/graph KV cache together.
Tolerance: max abs logit difference <= 1e-4 (fp32).
"""
import os

import numpy as np
import pytest

from lite_runtime.backends import load_session
from lite_runtime.contract.manifest import load_manifest
from support.tiny_models import llama_config

PROMPTS = [[5, 17, 33, 8, 61, 9, 12], [44, 3], [70, 21, 19, 88, 4, 6, 7, 30, 31, 45]]
STEPS = 32


def eager_logits(net, seqs, seq_length):
    import mindspore as ms
    ms.set_context(mode=ms.PYNATIVE_MODE)
    ids = np.zeros((len(seqs), seq_length), np.int32)
    for i, s in enumerate(seqs):
        ids[i, :len(s)] = s
    lengths = np.array([len(s) for s in seqs], np.int32)
    out = net.prefill(ms.Tensor(ids), ms.Tensor(lengths))
    ms.set_context(mode=ms.GRAPH_MODE)
    return out[0].asnumpy()


@pytest.mark.parametrize("kv_mode", ["io", "in_graph"])
def test_graphs_match_eager_network_for_32_steps(tiny_ckpt, tiny_exports, kv_mode):
    import mindspore as ms
    from exporter.families import family_by_name
    from exporter.models.attention import BuildContext
    from exporter.models.decoder import CausalLM
    from exporter.weights.checkpoints import load_into
    manifest = load_manifest(tiny_exports[kv_mode])
    session = load_session("ms", manifest)
    llama = family_by_name("llama", "test")
    sizes = llama_config()
    sizes["norm_eps"] = sizes.pop("rms_norm_eps")
    cfg = llama.config(sizes, "test")
    net = CausalLM(cfg, BuildContext(1, 0, "io", manifest.batch_size, manifest.seq_length, ms.float32))
    load_into(net, llama.mindformers_weights.apply(dict(tiny_ckpt[1]), cfg, "tiny", "llama"), "tiny")

    B, S = manifest.batch_size, manifest.seq_length
    ids = np.zeros((B, S), np.int32)
    lengths = np.array([len(p) for p in PROMPTS], np.int32)
    for i, p in enumerate(PROMPTS):
        ids[i, :len(p)] = p
    seqs = [list(p) for p in PROMPTS]
    logits = session.prefill(ids, lengths)
    worst = 0.0
    for step in range(STEPS):
        expected = eager_logits(net, seqs, S)
        worst = max(worst, float(np.abs(logits - expected).max()))
        assert np.abs(logits - expected).max() <= 1e-4, f"step {step}"
        nxt = expected.argmax(-1).astype(np.int32)
        for i in range(B):
            seqs[i].append(int(nxt[i]))
        lengths = lengths + 1
        logits = session.decode(nxt.reshape(B, 1), lengths)
    assert worst <= 1e-4


def test_manifest_records_the_contract(tiny_exports):
    m = load_manifest(tiny_exports["io"])
    assert m.family == "llama" and m.kv_cache == "io" and m.world_size == 1
    assert m.graphs["prefill"].files == ["mindir_full_checkpoint/rank_0_graph.mindir"]
    assert m.graphs["increment"].files == ["mindir_inc_checkpoint/rank_0_graph.mindir"]
    assert [t.name for t in m.graphs["increment"].inputs][:4] == [
        "input_ids", "batch_valid_length", "key_cache_0", "value_cache_0"]
    assert m.graphs["increment"].inputs[2].shape == (3, 2, 48, 8)   # (B, kv heads, S, head_dim)
    assert m.eos_token_id == [2] and m.pad_token_id == 0 and m.bos_token_id == 1
    assert m.mindspore_version.startswith("2.10") and m.mindir_version == "3"
    m.verify_files()


def test_float16_export_runs_close_to_float32(tiny_ckpt, tiny_exports, tmp_path):
    """compute_dtype float16: weights and matmuls in fp16, norms/softmax/logits in fp32.
    Tolerance 5e-2 on logits of magnitude ~5 (fp16 has ~3 significant digits)."""
    from support.tiny_models import export_in_subprocess, tiny_export_config, write_yaml
    cfg = tiny_export_config(tiny_ckpt[0], str(tmp_path / "fp16"), compute_dtype="float16")
    fp16 = load_session("ms", load_manifest(export_in_subprocess(write_yaml(str(tmp_path / "f.yaml"), cfg))))
    fp32 = load_session("ms", load_manifest(tiny_exports["io"]))
    B, S = 3, 48
    ids = np.zeros((B, S), np.int32)
    for i, p in enumerate(PROMPTS):
        ids[i, :len(p)] = p
    lengths = np.array([len(p) for p in PROMPTS], np.int32)
    a, b = fp16.prefill(ids, lengths), fp32.prefill(ids, lengths)
    assert a.dtype == np.float32
    assert np.abs(a - b).max() <= 5e-2 * max(1.0, np.abs(b).max() / 5)
    nxt = b.argmax(-1).astype(np.int32).reshape(B, 1)
    a, b = fp16.decode(nxt, lengths + 1), fp32.decode(nxt, lengths + 1)
    assert np.abs(a - b).max() <= 5e-2 * max(1.0, np.abs(b).max() / 5)


@pytest.mark.fast
def test_safetensors_tensors_are_read_as_the_ranks_slice(tmp_path):
    """A rank reads only its block of a tensor it splits (safetensors slices, bfloat16 ones from their
    raw bits); others whole; each tensor only when it is taken."""
    from safetensors.numpy import save_file
    from lite_runtime.contract.errors import WeightError
    from exporter.weights.safetensors_io import read_safetensors_part
    a, b, c = (np.arange(n, dtype=np.float32).reshape(s) for n, s in ((24, (4, 6)), (6, (6,)), (5, (5,))))
    save_file({"a": a, "b": b, "c": c}, str(tmp_path / "m.safetensors"))
    tensors, cut = read_safetensors_part(str(tmp_path / "m.safetensors"), {"a": 1, "b": 0, "c": 0}, 1, 2)
    assert cut == {"a", "b"}       # c (5 rows) does not split in 2: whole, for the sharding step to refuse
    np.testing.assert_array_equal(tensors["a"], a[:, 3:])
    np.testing.assert_array_equal(tensors["b"], b[3:])
    np.testing.assert_array_equal(tensors["c"], c)
    os.remove(tmp_path / "m.safetensors")        # nothing was read ahead of being asked for
    with pytest.raises(WeightError, match="cannot read safetensors file"):
        tensors.pop("a")


@pytest.mark.fast
def test_bfloat16_tensors_are_read_as_the_exports_float_type(tmp_path):
    """bfloat16 (numpy has none) against torch's own conversion: exact to float32, and to float16 as
    torch rounds it; a value beyond float16's range is refused for a float16 export."""
    import torch
    from safetensors.torch import save_file
    from lite_runtime.contract.errors import WeightError
    from exporter.weights.safetensors_io import read_safetensors_part
    w = torch.randn(6, 4, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    ids = torch.arange(5, dtype=torch.int32)
    save_file({"w": w, "ids": ids}, str(tmp_path / "m.safetensors"))
    for dtype, expected in ((np.float32, w.float()), (np.float16, w.half())):
        tensors, _ = read_safetensors_part(str(tmp_path / "m.safetensors"), {}, 0, 1, dtype)
        assert tensors["w"].dtype == dtype
        np.testing.assert_array_equal(tensors["w"], expected.numpy())
        np.testing.assert_array_equal(tensors["ids"], ids.numpy())
    save_file({"big": torch.full((2,), 1e5, dtype=torch.bfloat16)}, str(tmp_path / "big.safetensors"))
    with pytest.raises(WeightError, match="tensor big has values beyond float16's range"):
        read_safetensors_part(str(tmp_path / "big.safetensors"), {}, 0, 1, np.float16)[0].pop("big")
