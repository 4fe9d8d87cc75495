"""The project's Lite kernels (liblite_kernels.so): weight-only linear products (and the packed call's attention,
directly) against numpy, directly and
as Custom nodes of MindSpore 2.0 graphs that MindSpore Lite runs, as MindIR and as .ms (registered in
the converter's process), on 1 and 2 threads, at decode and prefill row counts."""
import math
import os
import subprocess
import sys

import numpy as np
import pytest

from lite_runtime.backends import lite_kernels
from lite_runtime.backends.lite_native import LiteModel, kernel_types, load_shim, shim_path
from exporter.weights import quantize as quantizers
from lite_runtime.contract import quant
from support.kernel_constants import constants, on_q8_0_grid
from support.tiny_models import REPO, VENV_MS20_PYTHON

ROWS = (1, 2, 3, 8, 70)        # decode paths (1, 2), the dequantised tiles, and past one 64-row pass
CASES = ("f32", "f32p16", "f32p16_wide", "i8", "i8_wide", "i4_g32", "i4_g64", "i4_g128", "i4_g32_wide", "i4s_g32",
         "i4s_g32_wide", "i8g_g32", "i8g_g128", "i8g_g32_wide")
LAYER_CASES = ("rms_norm", "layer_norm", "swiglu", "gelu", "gelu_tanh", "fast_gelu", "rotary_half",
               "rotary_pairs_partial")     # kernel_graphs.LAYER_CASES
TOLERANCE = 2e-5               # of the largest |y|: float32 sums in another order than numpy's float64


def reference(x, w):
    return x.astype(np.float64) @ w.astype(np.float64).T


def assert_close(y, ref, what):
    err = float(np.abs(y - ref).max() / max(np.abs(ref).max(), 1e-6))
    assert err < TOLERANCE, f"{what}: largest error {err:.3g} of max |y|"


@pytest.fixture(scope="module")
def library():
    load_shim()
    path = lite_kernels.library_path(shim_path())
    assert path, "liblite_kernels.so is not beside the shim: run `make setup` (lite-setup)"
    return path


@pytest.fixture(scope="module")
def graphs(tmp_path_factory, library):
    """Each case as MindIR (MindSpore 2.0) and as .ms (Lite's converter with the kernels registered)."""
    from exporter.writing.lite_convert import convert_graphs, converter_python
    out = tmp_path_factory.mktemp("kernel_graphs")
    subprocess.run([VENV_MS20_PYTHON, os.path.join(REPO, "tests", "support", "kernel_graphs.py"), str(out)], check=True,
                   cwd=REPO, timeout=600)
    convert_graphs(str(out), {"step": [f"{case}.mindir" for case in CASES + LAYER_CASES]}, converter_python("test"))
    return out


def test_the_library_registers_every_kernel_kind(library):
    assert set(kernel_types()) == set(quant.OP_TYPES.values()) | set(quant.GATHER_TYPES.values()) | \
        set(quant.LAYER_KERNELS)
    assert lite_kernels.isa() in ("avx512", "avx2", "generic")


@pytest.mark.parametrize("fmt", ["mindir", "ms"])
@pytest.mark.parametrize("case", CASES)
def test_a_custom_linear_on_lite_equals_numpy(graphs, case, fmt):
    consts = np.load(graphs / f"{case}.npz")
    w = consts["w"]
    n, k = w.shape
    rng = np.random.default_rng(len(case))
    for threads in (1, 2):
        model = LiteModel(str(graphs / f"{case}.{fmt}"), num_threads=threads)
        try:
            for rows in ROWS + (1,):     # back to one row: Resize shrinks as well as grows
                x = rng.standard_normal((rows, k)).astype(np.float32)
                model.resize([[rows, k]], [[rows, n]])
                model.bind_inputs([x])
                y, = model.predict()
                assert y.shape == (rows, n)
                assert_close(y, reference(x, w),
                             f"{case}.{fmt}, {threads} threads, M={rows}")
        finally:
            model.close()


def test_the_loader_keeps_the_weights_the_kernels_read(graphs):
    """The kernels read their weights where the model holds them (the float32 tiles as the int8 panels):
    the loader, which gives back the model's pages of the weights only Lite's MatMul reads (packing its own
    copy; lite_weights), must give back none of them."""
    from lite_runtime.backends.lite_weights import matmul_weight_ranges
    for case in ("f32p16_wide", "i8_wide", "i8g_g32_wide"):
        assert matmul_weight_ranges((graphs / f"{case}.ms").read_bytes()) == [], case


def rotate_reference(x, hd, rotary_dim, interleaved):
    """Each head's rotated partner, written as Hugging Face's models do: rotate_half (Llama) concatenates
    (-x2, x1) over the rotated dims; interleaved pairs (GPT-J, ChatGLM2) take (-x[2i+1], x[2i]); the dims
    past rotary_dim have none."""
    heads = x.reshape(x.shape[0], -1, hd).astype(np.float64)
    r, out = heads[..., :rotary_dim], np.zeros_like(heads)
    if interleaved:
        out[..., 0:rotary_dim:2], out[..., 1:rotary_dim:2] = -r[..., 1::2], r[..., 0::2]
    else:
        half = rotary_dim // 2
        out[..., :rotary_dim] = np.concatenate([-r[..., half:], r[..., :half]], -1)
    return heads, out


def layer_reference(case, consts, inputs):
    x = inputs[0].astype(np.float64)
    if case == "rms_norm":
        weight, eps = consts["arr_0"], float(consts["arr_1"][0])
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * weight
    if case == "layer_norm":
        weight, bias, eps = consts["arr_0"], consts["arr_1"], float(consts["arr_2"][0])
        centred = x - x.mean(-1, keepdims=True)
        return centred / np.sqrt((centred * centred).mean(-1, keepdims=True) + eps) * weight + bias
    if case == "swiglu":
        return x / (1.0 + np.exp(-x)) * inputs[1]
    if case == "gelu":        # the exact form, by the error function (math.erf: numpy has none)
        return 0.5 * x * (1.0 + np.vectorize(math.erf)(x / math.sqrt(2.0)))
    if case == "gelu_tanh":   # as GPT-2 and Bloom write it
        return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))
    if case == "fast_gelu":   # MindSpore's FastGeLU
        return x / (1.0 + np.exp(-1.702 * x))
    hd, rotary_dim, interleaved, _ = (int(v) for v in consts["arr_1"])
    heads, partner = rotate_reference(x, hd, rotary_dim, bool(interleaved))
    return heads * inputs[1] + partner * inputs[2]


@pytest.mark.parametrize("fmt", ["mindir", "ms"])
@pytest.mark.parametrize("case", LAYER_CASES)
def test_a_layer_op_on_lite_equals_numpy(graphs, case, fmt):
    """RMS and layer norm, SwiGLU, GELU's three forms and rotary (rotate-half; interleaved pairs over part of a
    head) as one node each; 3000
    rows are shared by the kernels' threads when they hold them."""
    consts = np.load(graphs / f"{case}.npz")
    rng = np.random.default_rng(len(case))
    for threads, kernels_hold in ((1, 0), (2, 0), (1, 2)):
        lite_kernels.set_threads(kernels_hold)
        model = LiteModel(str(graphs / f"{case}.{fmt}"), num_threads=threads)
        try:
            for rows in (1, 3, 70, 3000, 1):
                if case.startswith("rotary"):
                    hd, _, _, heads = (int(v) for v in consts["arr_1"])
                    cos = rng.standard_normal((rows, 1, hd)).astype(np.float32)
                    inputs = [rng.standard_normal((rows, heads * hd)).astype(np.float32), cos, cos * 0.5 + 0.1]
                    out = [rows, heads, hd]
                else:
                    inputs = [rng.standard_normal((rows, 37)).astype(np.float32) * 3 for _ in model.inputs]
                    out = [rows, 37]
                model.resize([list(a.shape) for a in inputs], [out])
                model.bind_inputs(inputs)
                y, = model.predict()
                assert list(y.shape) == out
                assert_close(y, layer_reference(case, consts, inputs),
                             f"{case}.{fmt}, {threads} threads, the kernels {kernels_hold}, M={rows}")
        finally:
            model.close()
            lite_kernels.set_threads(0)


# (2, 4096, 1030): a decode call large enough to be split across threads (kSplitWeights); M 13 and 17: on
# either side of int8's switch to dequantised tiles (kPairRowsI8), N 35 and 24: tiles of 8 rows and fewer;
# (80, 96, 50): int4 past its decode loop (dequantised panels) on an odd number of panels; (3, 160, 35) and
# (17, 96, 24): grouped int8 (rows of whole runs of 32 only) in its decode loop and in the GEMM as it reads, with
# tail rows (80 and 130 rows: its staged panels), and 160 weights in groups of 128 (the last group short)
SHAPES = [(1, 1, 1), (1, 7, 3), (2, 33, 5), (3, 100, 9), (8, 576, 64), (1, 576, 203), (70, 200, 13), (5, 31, 4),
          (130, 64, 70), (1, 4096, 9), (2, 4096, 1030), (13, 41, 35), (17, 37, 24), (80, 96, 50), (17, 96, 24),
          (3, 160, 35)]
KINDS = [("float32", 0), ("float32_p16", 0), ("int8", 0), ("int4_min", 32), ("int4_min", 64), ("int4_min", 128),
         ("int4_sym", 32), ("int4_sym", 128), ("int8_group", 32), ("int8_group", 64), ("int8_group", 128)]


def check_direct():
    """Every kind on odd shapes, 1 and 2 threads, through lk_linear (no Lite); returns the ISA used."""
    rng = np.random.default_rng(3)
    for m, k, n in SHAPES:
        x = rng.standard_normal((m, k)).astype(np.float32)
        w = rng.standard_normal((n, k)).astype(np.float32)
        for storage, group in KINDS:
            if storage == "int8_group" and k % 32:      # its rows are whole runs of 32
                continue
            consts, deq = constants(storage, w, group)
            ref = reference(x, deq)
            for threads in (1, 2):
                assert_close(lite_kernels.linear(x, storage, consts, threads), ref,
                             f"{storage} g{group} M={m} K={k} N={n} threads={threads}")
    check_attention()
    check_paged_attention()
    return lite_kernels.isa()


def attention_reference(q, k, v, k_cache, v_cache, meta, slopes, scale):
    """The packed call's attention in float64, from its rules (exporter/models/packed.py PackedBias): a token
    sees its row's cached positions before the row's past, and the call's tokens of its row at positions up to
    its own (or before its row's prefix context); ALiBi adds slope x the key's position."""
    n_tokens, kv, g, hd = q.shape
    out = np.zeros((n_tokens, kv, g, hd))
    for n, (row, position, past, context) in enumerate(meta):
        row, past = int(row), int(past)
        seen = [m for m in range(n_tokens) if meta[m, 0] == row and (meta[m, 1] <= position or meta[m, 1] < context)]
        key_positions = np.concatenate([np.arange(past), meta[seen, 1]])
        for h in range(kv):
            keys = np.concatenate([k_cache[row, h, :, :past].T, k[seen, h]]).astype(np.float64)
            values = np.concatenate([v_cache[row, h, :past], v[seen, h]]).astype(np.float64)
            for j in range(g):
                s = keys @ q[n, h, j] * scale + slopes[h * g + j] * key_positions
                e = np.exp(s - s.max())
                out[n, h, j] = e @ values / e.sum()
    return out.reshape(n_tokens, -1)


# (caches' rows B, kv heads, query heads per kv head g, head dim, cached positions P, calls' rows as (row, past,
# tokens), ALiBi, prefix context): head dims and pasts off the vectors of 8, rows in any order, a row without past;
# the last two, a token or two at long pasts, split in parts on two threads (a part past the shorter row's end)
ATTENTION_CASES = [(3, 2, 3, 16, 21, [(0, 5, 3), (2, 0, 4), (1, 17, 1)], False, False),
                   (2, 1, 1, 12, 9, [(1, 8, 1), (0, 0, 6)], True, False),
                   (4, 3, 5, 64, 40, [(3, 39, 1), (0, 12, 7), (2, 0, 9)], True, True),
                   (1, 2, 2, 7, 1, [(0, 0, 5)], False, True),
                   (8, 3, 3, 64, 256, [(r, 200 + r, 1) for r in range(7)] + [(7, 0, 19)], False, False),
                   (2, 2, 7, 64, 40, [(0, 37, 30), (1, 0, 50)], True, True),
                   (1, 1, 1, 32, 30, [(0, 3, 53)], False, False),
                   (1, 2, 3, 64, 1500, [(0, 1500, 1)], True, False),
                   (2, 1, 2, 32, 900, [(0, 900, 1), (1, 100, 1)], False, False)]


def alibi_slopes(rng, heads, positions):
    """Slopes up to 0.5, smaller past 64 positions: slope x position stays within what float32 scores hold to
    the tolerance (BLOOM's slopes shrink with the heads, not the length)."""
    return rng.random(heads, dtype=np.float32) * np.float32(0.5 * min(1.0, 64 / positions))


def check_attention():
    rng = np.random.default_rng(4)
    for b, kv, g, hd, p, rows, alibi, prefix in ATTENTION_CASES:
        meta = np.array([[row, past + t, past, past + 2 if prefix else -1] for row, past, count in rows
                         for t in range(count)], np.float32)
        meta = meta[rng.permutation(len(meta))]
        n = len(meta)
        q = rng.standard_normal((n, kv, g, hd), dtype=np.float32)
        k, v = (rng.standard_normal((n, kv, hd), dtype=np.float32) for _ in range(2))
        k_cache = rng.standard_normal((b, kv, hd, p), dtype=np.float32)
        v_cache = rng.standard_normal((b, kv, p, hd), dtype=np.float32)
        slopes = alibi_slopes(rng, kv * g, p) if alibi else np.zeros(kv * g, np.float32)
        ref = attention_reference(q, k, v, k_cache, v_cache, meta, slopes, 1 / np.sqrt(hd))
        for threads in (1, 2):
            assert_close(lite_kernels.attend(q, k, v, k_cache, v_cache, meta, slopes, 1 / np.sqrt(hd), threads), ref,
                         f"attention B={b} kv={kv} g={g} hd={hd} P={p} N={n} threads={threads}")


def as_stored(x, dtype, axis=-1):
    """K or V as the paged store gives them back: float16-rounded, or int8 by runs of 32 along the head's `axis`
    (the last run shorter), each with a float32 scale (its largest magnitude / 127, rounded to nearest even;
    llama.cpp's q8_0 blocks)."""
    if dtype == "float16":
        return x.astype(np.float16).astype(np.float32)
    if dtype == "int8":
        out = np.empty_like(x)
        for start in range(0, x.shape[axis], 32):
            run = [slice(None)] * x.ndim
            run[axis] = slice(start, start + 32)
            part = x[tuple(run)]
            scale = np.abs(part).max(axis=axis, keepdims=True) / np.float32(127)
            q = np.where(scale > 0, np.rint(part / np.where(scale > 0, scale, np.float32(1))), np.float32(0))
            out[tuple(run)] = q * scale
        return out.astype(np.float32)
    return x


def check_paged_attention():
    """ATTENTION_CASES on the paged store, float32, float16 and int8, blocks of 8 and 16 in shuffled order: each
    row's past written by a first call, then the case's call; the reference reads K/V as the store holds them.
    Blocks of 16 get the call's tokens row by row in order, as the engine feeds a prompt: the tiles' GEMMs."""
    rng = np.random.default_rng(5)
    for dtype in ("float32", "float16", "int8"):
        for block in (8, 16):
            for b, kv, g, hd, p, rows, alibi, prefix in ATTENTION_CASES:
                per_row = -(-(p + 32) // block)
                store = lite_kernels.KVStore(2, b * per_row + 3, block, kv, hd, dtype)
                tables = rng.permutation(b * per_row + 3)[:b * per_row].reshape(b, per_row).astype(np.float32)
                k_cache = as_stored(rng.standard_normal((b, kv, hd, p), dtype=np.float32), dtype, axis=2)
                v_cache = as_stored(rng.standard_normal((b, kv, p, hd), dtype=np.float32), dtype)
                seed = np.array([[row, t, 0, -1] for row, past, _ in rows for t in range(past)], np.float32).reshape(-1, 4)
                if len(seed):
                    ks = np.stack([k_cache[int(r), :, :, int(t)] for r, t, _, _ in seed])
                    vs = np.stack([v_cache[int(r), :, int(t)] for r, t, _, _ in seed])
                    lite_kernels.paged_attend(np.zeros((len(seed), kv, g, hd), np.float32), ks, vs, seed, tables, store,
                                              1, np.zeros(kv * g, np.float32), 1.0)
                meta = np.array([[row, past + t, past, past + 2 if prefix else -1] for row, past, count in rows
                                 for t in range(count)], np.float32)
                meta = meta[rng.permutation(len(meta))] if block == 8 else meta
                n = len(meta)
                q = rng.standard_normal((n, kv, g, hd), dtype=np.float32)
                k, v = (as_stored(rng.standard_normal((n, kv, hd), dtype=np.float32), dtype) for _ in range(2))
                slopes = alibi_slopes(rng, kv * g, p) if alibi else np.zeros(kv * g, np.float32)
                ref = attention_reference(q, k, v, k_cache, v_cache, meta, slopes, 1 / np.sqrt(hd))
                for threads in (1, 2):
                    got = lite_kernels.paged_attend(q, k, v, meta, tables, store, 1, slopes, 1 / np.sqrt(hd), threads)
                    assert_close(got, ref, f"paged attention {dtype} block {block} B={b} "
                                           f"kv={kv} g={g} hd={hd} P={p} N={n} threads={threads}")
                row, past, count = rows[0]
                keys, values = store.read(1, int(tables[row, 0]))
                # int8: the cases' K/V, already on the int8 grid, come back within a rounding of their scales
                exact = dict(rtol=1e-6, atol=0) if dtype == "int8" else dict(rtol=0, atol=0)
                np.testing.assert_allclose(keys[:, :, :min(block, past)], k_cache[row, :, :, :min(block, past)], **exact)
                np.testing.assert_allclose(values[:, :min(block, past)], v_cache[row, :, :min(block, past)], **exact)
                store.close()


def test_a_token_of_a_row_the_caches_lack_is_refused_in_one_line(library):
    q = np.zeros((1, 1, 1, 8), np.float32)
    k = np.zeros((1, 1, 8), np.float32)
    with pytest.raises(ValueError, match=r"token 0 is of cache row 2\.0+; the caches have 2"):
        lite_kernels.attend(q, k, k, np.zeros((2, 1, 8, 4), np.float32), np.zeros((2, 1, 4, 8), np.float32),
                            np.array([[2, 0, 0, -1]], np.float32), np.zeros(1, np.float32), 1.0)


def test_a_paged_token_past_its_rows_blocks_is_refused_in_one_line(library):
    store = lite_kernels.KVStore(1, 4, 8, 1, 8)
    q, k = np.zeros((1, 1, 1, 8), np.float32), np.zeros((1, 1, 8), np.float32)
    with pytest.raises(ValueError, match=r"row 0's block for position 9 is 7\.0+; the store has 4 blocks"):
        lite_kernels.paged_attend(q, k, k, np.array([[0, 9, 9, -1]], np.float32), np.array([[0, 7]], np.float32),
                                  store, 0, np.zeros(1, np.float32), 1.0)
    with pytest.raises(ValueError, match=r"position 16\.0+: the block tables hold 16 positions a row"):
        lite_kernels.paged_attend(q, k, k, np.array([[0, 16, 16, -1]], np.float32), np.array([[0, 1]], np.float32),
                                  store, 0, np.zeros(1, np.float32), 1.0)
    store.close()
    with pytest.raises(ValueError, match=r"no KV store of that id"):
        lite_kernels.paged_attend(q, k, k, np.array([[0, 0, 0, -1]], np.float32), np.array([[0, 1]], np.float32),
                                  store, 0, np.zeros(1, np.float32), 1.0)


def test_the_budgets_block_bytes_are_what_the_store_holds(library):
    """The server's KV budget counts blocks by paged_cache.kv_block_bytes; the store allocates its own: int8's
    scales by runs of 32 values (hd 48: two runs, the second short) must agree."""
    from lite_runtime.backends.paged_cache import kv_block_bytes
    for dtype in ("float32", "float16", "int8"):
        for hd in (64, 48):
            store = lite_kernels.KVStore(2, 5, 16, 3, hd, dtype)
            assert store.nbytes == 5 * kv_block_bytes(2, 3, hd, 16, dtype), (dtype, hd)
            store.close()


def test_the_kernels_equal_numpy_on_odd_shapes(library):
    check_direct()


@pytest.mark.parametrize("isa", ["generic", "avx2"])
def test_the_loops_of_other_cpus_equal_numpy_too(library, isa):
    """LITE_KERNELS_ISA=generic: the fallback a CPU without AVX2 + FMA gets (chosen at load); =avx2: what a CPU
    without AVX-512 gets, where this one has it (on a CPU without AVX2 it stays generic)."""
    code = ("import sys; sys.path.insert(0, 'tests'); from lite_runtime.backends import lite_kernels as k; "
            f"k.load({library!r}); import support.lite_kernel_cases as t; print(t.check_direct())")
    env = dict(os.environ, LITE_KERNELS_ISA=isa)
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True,
                            timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip().endswith(isa if isa == "generic" or "avx2" in open("/proc/cpuinfo").read()
                                          else "generic")


def w8a8_reference(x, q, scales):
    """Grouped int8 weights (q (N, K) int8, scales (N, K / 32) float32) against x quantized alike: per row and run
    of 32, d = max |x| / 127 and round(x / d) (float32 steps, ties to even), the products summed exactly."""
    m, k = x.shape
    runs = x.reshape(m, k // 32, 32)
    d = (np.abs(runs).max(axis=2) / np.float32(127)).astype(np.float32)
    inverse = np.where(d > 0, np.float32(1) / np.where(d > 0, d, 1), 0).astype(np.float32)
    qx = np.rint(runs * inverse[:, :, None]).astype(np.int64)
    sums = np.einsum("mgk,ngk->mng", qx, q.astype(np.int64).reshape(q.shape[0], k // 32, 32))
    return (sums * (scales[None] * d[:, None, :]).astype(np.float32)).sum(axis=2)


def test_int8_activations_give_the_w8a8_products_where_the_cpu_has_vnni(library):
    """Opt-in (lite_kernels.set_int8_activations): grouped int8 weights in groups of 32 against activations
    quantized alike, on AVX512-VNNI; refused (False) elsewhere, and off again the float products are back."""
    vnni = "avx512_vnni" in open("/proc/cpuinfo").read() and lite_kernels.isa() == "avx512"
    rng = np.random.default_rng(5)
    try:
        assert lite_kernels.set_int8_activations(True) == vnni
        # panel pairs, a lone panel and rows stored whole (N 35, 24), rows past a tile of 4 and a 64-row pass
        for m, k, n in ((1, 64, 32), (3, 96, 35), (5, 576, 64), (70, 160, 24), (2, 4096, 48), (13, 32, 16)):
            x = (rng.standard_normal((m, k)) * rng.uniform(0.1, 10, (m, 1))).astype(np.float32)
            x[0, :32] = 0.0          # a run of zeros: its scale 0
            w = rng.standard_normal((n, k)).astype(np.float32)
            consts, deq = constants("int8_group", w, 32)
            d = (np.abs(w.reshape(n, k // 32, 32)).max(axis=2) / np.float32(127)).astype(np.float16).astype(np.float32)
            q = np.clip(np.rint(w.reshape(n, k // 32, 32) / np.where(d != 0, d, 1)[:, :, None]), -127, 127)
            q, scales = q.reshape(n, k).astype(np.int8), d
            assert np.array_equal(q * np.repeat(scales, 32, axis=1), deq)      # the weights stored
            for threads in (1, 2):
                y = lite_kernels.linear(x, "int8_group", consts, threads)
                if vnni:
                    assert_close(y, w8a8_reference(x, q, scales), f"w8a8 M={m} K={k} N={n} threads={threads}")
                    err = np.abs(y - reference(x, deq)).max() / np.abs(reference(x, deq)).max()
                    assert 0 < err < 0.02, f"M={m} K={k} N={n}: {err:.3g} of max |y| from the float products"
                else:
                    assert_close(y, reference(x, deq), f"M={m} K={k} N={n} threads={threads}")
    finally:
        lite_kernels.set_int8_activations(False)
    x = rng.standard_normal((5, 64)).astype(np.float32)
    consts, deq = constants("int8_group", rng.standard_normal((32, 64)).astype(np.float32), 32)
    assert_close(lite_kernels.linear(x, "int8_group", consts, 2), reference(x, deq), "after int8 activations")


def test_quantizers_round_to_nearest_within_half_a_step():
    w = np.random.default_rng(0).standard_normal((5, 70)).astype(np.float32)
    q, s = quantizers.quantize_int8(w)
    assert np.abs(quant.dequantize_int8(q, s) - w).max() <= s.max() / 2 + 1e-7
    assert quantizers.quantize(w, "int8", 32)[0] == "int8"    # rows of 70: per channel, the grouped kernel's need 32s
    assert quantizers.quantize(w[:, :64], "int8", quant.PER_CHANNEL)[0] == "int8"
    w[1, :40] *= 50          # one large group beside small ones: each its own scale
    for group in (32, 64, 128):
        stored, consts = quantizers.quantize(w[:, :64], "int8", group)
        d = np.repeat(quant.unpack_halves(consts[1]), group, axis=1)[:, :64]
        assert stored == "int8_group" and consts[1].shape == (5, 2 * -(-64 // group))
        assert (np.abs(quant.dequantize(stored, consts, 64, group) - w[:, :64]) <= d / 2 * 1.001 + 1e-7).all()
        assert (np.abs(quant.unpack_int8(consts[0])).max(axis=1) == 127).all()
    blocks = on_q8_0_grid(w[:, :64])        # llama.cpp's Q8_0 blocks come back as they are in groups of 32
    assert np.array_equal(quant.dequantize(*quantizers.quantize(blocks, "int8", 32), 64, 32), blocks)
    packed, s, mins = quantizers.quantize_int4(w, 32)
    assert packed.shape == (5, 48) and s.shape == mins.shape == (5, 6) and s.dtype == np.int8   # float16 pairs
    err = np.abs(quant.dequantize_int4(packed, s, mins, 70, 32) - w)
    assert (err <= np.abs(np.repeat(quant.unpack_halves(s), 32, axis=1))[:, :70] / 2 + 1e-6).all()
    u = np.arange(37 * 64, dtype=np.uint8).reshape(37, 64) % 16     # two panels and 5 rows whole
    assert (quant.unpack_int4(quant.pack_int4(u)) == u).all()
    packed = quant.pack_int4(u).view(np.uint8)     # the layout of linear_math.h, read byte by byte
    assert packed[0, 0] == u[0, 0] | u[0, 1] << 4 and packed[0, 16 + 3] == u[3, 2] | u[3, 3] << 4
    assert packed[32, 0] == u[32, 0] | u[32, 16] << 4


@pytest.mark.parametrize("storage, group", [("int8", -1), ("float32_p16", 0), ("int8_group", 32),
                                            ("int8_group", 128)])
def test_a_lookup_gives_the_tables_rows(library, storage, group):
    """LiteGatherI8P16 reads rows of the int8 panels, each times its scale, LiteGatherF32P16 rows of the float32
    panels (a row is a column of its panel; the last N % 16 rows whole), LiteGatherI8GroupF16P16 rows of int8
    panels, each group times its scale (the last of a row may be short); an id outside the table is refused."""
    rng = np.random.default_rng(5)
    scheme = "float32" if storage == "float32_p16" else "int8"
    for v, h in ((7, 19), (12, 64), (5, 3), (37, 20), (48, 9)) if storage != "int8_group" else \
            ((7, 32), (12, 64), (37, 96), (48, 160)):
        w = rng.standard_normal((v, h)).astype(np.float32)
        stored, constants = quantizers.quantize(w, scheme, group)
        assert stored == storage
        ids = rng.integers(0, v, (3, 4)).astype(np.int32)
        ids[0, :3] = 0, v - 1, min(17, v - 1)
        rows = quant.dequantize(storage, constants, h, group)
        assert np.array_equal(lite_kernels.gather(ids, storage, constants), rows[ids])
        if storage == "float32_p16":
            assert np.array_equal(rows, w)
    with pytest.raises(ValueError, match="id 48 is outside the table's 48 rows"):
        lite_kernels.gather(np.array([1, 48]), storage, constants)


def test_a_weight_that_does_not_fit_x_is_refused_in_one_line(library):
    with pytest.raises(ValueError, match=r"x \(\.\.\., 64\) does not fit a int8 weight of shape \(3, 32\)"):
        lite_kernels.linear(np.zeros((1, 64), np.float32), "int8", [np.zeros((3, 32), np.int8),
                                                                    np.ones(3, np.float32)])
    with pytest.raises(ValueError, match="int4 scales have 5 groups per row"):
        lite_kernels.linear(np.zeros((1, 64), np.float32), "int4_min", [np.zeros((3, 32), np.int8),
                                                                        np.ones((3, 10), np.int8),
                                                                        np.zeros((3, 10), np.int8)])
