"""MindSpore `.ckpt` files read tensor by tensor (exporter/weights/ckpt_io.py) against MindSpore's own
`load_checkpoint`: tensors sliced by MindSpore (its slice size lowered here so small tensors are sliced
too), the crc trailer of `crc_check=True`, bfloat16 against MindSpore's own widening, counters and strings
left out; a damaged file is one error naming it. Exact equality: both read the same bytes."""
import os

import numpy as np
import pytest

from support.tiny_models import run_cli

SAVE = """
import sys, numpy as np, mindspore as ms
import mindspore.train.serialization as serialization
serialization.SLICE_SIZE = 16       # KiB (MindSpore's default 512 MiB): tensors above it are written in slices
folder = sys.argv[1]
rng = np.random.default_rng(0)
weights = {"layers.0.w": rng.standard_normal((300, 7)).astype(np.float32),
           "layers.0.b": rng.standard_normal(5).astype(np.float16), "ids": np.arange(6, dtype=np.int32).reshape(2, 3),
           "big": rng.standard_normal((1000, 33)).astype(np.float32), "scalar": np.array(2.5, np.float32)}
items = [{"name": n, "data": ms.Tensor(v)} for n, v in weights.items()]
ms.save_checkpoint(items, folder + "/plain.ckpt", append_dict={"global_step": 7, "note": "text"})
ms.save_checkpoint(items, folder + "/crc.ckpt", crc_check=True)
ms.save_checkpoint([{"name": "bf", "data": ms.Tensor(weights["big"], ms.bfloat16)}], folder + "/bf16.ckpt")
np.savez(folder + "/expected.npz", **weights)
bf = ms.load_checkpoint(folder + "/bf16.ckpt")["bf"]
np.save(folder + "/bf16_as_float32.npy", bf.float().asnumpy())
"""


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    folder = tmp_path_factory.mktemp("ckpts")
    result = run_cli(["-c", SAVE, str(folder)])
    assert result.returncode == 0, result.stderr[-2000:]
    return folder


@pytest.mark.parametrize("name", ["plain.ckpt", "crc.ckpt"])
def test_every_tensor_equals_what_mindspore_saved(saved, name):
    from exporter.weights.checkpoints import read_ckpt
    expected = dict(np.load(saved / "expected.npz"))
    got = read_ckpt(str(saved / name))
    assert sorted(got) == sorted(expected)          # global_step (a counter) and the string left out
    for key, value in expected.items():
        assert got[key].dtype == value.dtype and got[key].shape == value.shape, key
        np.testing.assert_array_equal(got[key], value)


def test_bfloat16_is_widened_as_mindspore_widens_it(saved):
    from exporter.weights.ckpt_io import read_ckpt_file
    got = read_ckpt_file(str(saved / "bf16.ckpt"))["bf"]
    np.testing.assert_array_equal(got, np.load(saved / "bf16_as_float32.npy"))
    half = read_ckpt_file(str(saved / "bf16.ckpt"), float_dtype=np.float16)["bf"]
    assert half.dtype == np.float16


@pytest.mark.parametrize("damage", ["truncated", "random"])
def test_a_damaged_checkpoint_is_one_error_naming_it(saved, tmp_path, damage):
    from lite_runtime.contract.errors import WeightError
    from exporter.weights.ckpt_io import read_ckpt_file
    data = (saved / "plain.ckpt").read_bytes()
    bad = tmp_path / "bad.ckpt"
    bad.write_bytes(data[:len(data) // 2] if damage == "truncated" else os.urandom(4096))
    with pytest.raises(WeightError) as e:
        read_ckpt_file(str(bad))
    assert str(bad) in str(e.value) and "\n" not in str(e.value)
