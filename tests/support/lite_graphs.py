"""Tiny MindIR graphs for the Lite backend tests, exported with whatever MindSpore runs this script.

Run in a MindSpore environment (never in the test process: Lite and mindspore cannot share one):
    .venv-ms20/bin/python tests/support/lite_graphs.py OUT_DIR [GRAPH ...]
Writes OUT_DIR/<graph>.mindir for each graph and OUT_DIR/weights.npz with every constant, so the
tests can compute the expected outputs with numpy (`reference_*` in tests/test_lite_native.py).

Graphs:
  affine     x (2,4) f32, bias (3,) f32      -> x @ W + bias (2,3), 0.5 * sum(x, 1) (2,)
  mixed      ids (2,3) i32, scale (1,) f32   -> E[ids] * scale (2,3,4), 2 * ids + 1 (2,3) i32
  toy_prefill / toy_increment: a stand-in language model with the `io` kv-mode graph contract of
  lite_runtime/contract/families.py (batch 2, seq 8, 2 layers, 2 kv heads, head_dim 4, vocab 16).
"""
import os
import sys

import numpy as np

import mindspore as ms
from mindspore import Tensor, nn, ops

B, S, LAYERS, KV_HEADS, HEAD_DIM, VOCAB = 2, 8, 2, 2, 4, 16
HIDDEN = KV_HEADS * HEAD_DIM


def weights():
    rng = np.random.default_rng(1234)
    f32 = np.float32
    return {
        "affine_w": rng.standard_normal((4, 3)).astype(f32),
        "mixed_e": rng.standard_normal((10, 4)).astype(f32),
        "toy_embed": rng.standard_normal((VOCAB, HIDDEN)).astype(f32),
        "toy_wk": (rng.standard_normal((HIDDEN, HIDDEN)) * 0.5).astype(f32),
        "toy_wv": (rng.standard_normal((HIDDEN, HIDDEN)) * 0.5).astype(f32),
        "toy_out": rng.standard_normal((HIDDEN, VOCAB)).astype(f32),
    }


class Affine(nn.Cell):
    def __init__(self, w):
        super().__init__()
        self.w = ms.Parameter(Tensor(w), name="w")
        self.matmul = ops.MatMul()
        self.sum = ops.ReduceSum()

    def construct(self, x, bias):
        return self.matmul(x, self.w) + bias, self.sum(x, 1) * 0.5


class Mixed(nn.Cell):
    def __init__(self, e):
        super().__init__()
        self.e = ms.Parameter(Tensor(e), name="e")
        self.gather = ops.Gather()

    def construct(self, ids, scale):
        return self.gather(self.e, ids, 0) * scale, ids * 2 + 1


class ToyBase(nn.Cell):
    """Shared pieces: embedding, per-layer K/V projections (layer l uses (l+1) * W)."""

    def __init__(self, w):
        super().__init__()
        self.embed = ms.Parameter(Tensor(w["toy_embed"]), name="embed")
        self.wk = ms.Parameter(Tensor(w["toy_wk"]), name="wk")
        self.wv = ms.Parameter(Tensor(w["toy_wv"]), name="wv")
        self.out = ms.Parameter(Tensor(w["toy_out"]), name="out")
        self.positions = Tensor(np.arange(S, dtype=np.int32).reshape(1, S))
        self.gather = ops.Gather()
        self.matmul = ops.MatMul()
        self.reshape = ops.Reshape()
        self.transpose = ops.Transpose()
        self.sum = ops.ReduceSum()
        self.cast = ops.Cast()

    def rows(self, emb, w, scale, steps):
        flat = self.reshape(emb, (B * steps, HIDDEN))
        proj = self.matmul(flat, w) * scale
        return self.transpose(self.reshape(proj, (B, steps, KV_HEADS, HEAD_DIM)), (0, 2, 1, 3))


class ToyPrefill(ToyBase):
    def construct(self, input_ids, batch_valid_length):
        emb = self.gather(self.embed, input_ids, 0)                       # (B, S, H)
        last = self.reshape(batch_valid_length - 1, (B, 1))
        mask = self.cast(ops.equal(self.positions, last), ms.float32)    # (B, S)
        h = self.sum(emb * self.reshape(mask, (B, S, 1)), 1)              # (B, H)
        logits = self.matmul(h, self.out)
        return (logits,
                self.rows(emb, self.wk, 1.0, S), self.rows(emb, self.wv, 1.0, S),
                self.rows(emb, self.wk, 2.0, S), self.rows(emb, self.wv, 2.0, S))


class ToyIncrement(ToyBase):
    def construct(self, input_ids, batch_valid_length, key_cache_0, value_cache_0, key_cache_1, value_cache_1):
        emb = self.gather(self.embed, input_ids, 0)                       # (B, 1, H)
        last = self.reshape(batch_valid_length - 1, (B, 1))
        mask = self.reshape(self.cast(ops.less(self.positions, last), ms.float32), (B, 1, S, 1))
        ctx = (self.sum(key_cache_0 * mask, 2) + 0.5 * self.sum(value_cache_0 * mask, 2)
               + self.sum(key_cache_1 * mask, 2) + 0.5 * self.sum(value_cache_1 * mask, 2))  # (B, KV, D)
        h = self.reshape(emb, (B, HIDDEN)) + 0.1 * self.reshape(ctx, (B, HIDDEN))
        logits = self.matmul(h, self.out)
        return (logits,
                self.rows(emb, self.wk, 1.0, 1), self.rows(emb, self.wv, 1.0, 1),
                self.rows(emb, self.wk, 2.0, 1), self.rows(emb, self.wv, 2.0, 1))


def graphs(w):
    f32, i32 = np.float32, np.int32
    cache = np.zeros((B, KV_HEADS, S, HEAD_DIM), f32)
    ids_s, ids_1, lengths = np.zeros((B, S), i32), np.zeros((B, 1), i32), np.ones((B,), i32)
    return {
        "affine": (Affine(w["affine_w"]), [np.zeros((2, 4), f32), np.zeros((3,), f32)]),
        "mixed": (Mixed(w["mixed_e"]), [np.zeros((2, 3), i32), np.ones((1,), f32)]),
        "toy_prefill": (ToyPrefill(w), [ids_s, lengths]),
        "toy_increment": (ToyIncrement(w), [ids_1, lengths] + [cache] * (2 * LAYERS)),
    }


def main(argv):
    out_dir, names = argv[0], argv[1:]
    ms.set_context(mode=ms.GRAPH_MODE)
    if hasattr(ms, "set_device"):        # MindSpore >= 2.5; 2.0 takes device_target in set_context
        ms.set_device("CPU")
    else:
        ms.set_context(device_target="CPU")
    os.makedirs(out_dir, exist_ok=True)
    w = weights()
    np.savez(os.path.join(out_dir, "weights.npz"), **w)
    available = graphs(w)
    for name in names or sorted(available):
        net, dummies = available[name]
        ms.export(net, *[Tensor(d) for d in dummies], file_name=os.path.join(out_dir, name), file_format="MINDIR")
    print(f"exported {names or sorted(available)} with mindspore {ms.__version__} to {out_dir}")


if __name__ == "__main__":
    main(sys.argv[1:])
