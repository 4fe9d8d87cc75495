"""Family-declared graph inputs (FamilySpec.row_inputs) and their feed builders: where they sit in
every graph kind, and GLM's (ChatGLM-6B) context_length / mask_position found in each row's prompt."""
from types import SimpleNamespace

import numpy as np
import pytest

from lite_runtime.contract.errors import ValidationError
from lite_runtime.contract.families import GLM, GraphDims
from lite_runtime.decode.inputs import GlmInputsOfInfer

pytestmark = pytest.mark.fast      # no export, no graph, no Lite, no model process: `make test-fast`

MASK, GMASK, SOP = 300, 301, 304


def test_row_inputs_follow_the_lengths_in_every_graph_kind():
    dims = GraphDims(batch_size=3, seq_length=16, num_layers=1, kv_heads_per_rank=2, head_dim=8, vocab_size=320,
                     adapter_slots=2)
    rows = ["context_length", "mask_position"]
    assert [s.name for s in GLM.inputs("prefill", "io", dims)] == ["input_ids", "batch_valid_length"] + rows + \
        ["adapter_ids"]
    assert [s.name for s in GLM.inputs("increment", "io", dims)][:5] == ["input_ids", "batch_valid_length"] + rows + \
        ["adapter_ids"]
    assert [s.name for s in GLM.inputs("step", "packed", dims)][:8] == \
        ["input_ids", "token_rows", "token_positions", "past_length", "last_token"] + rows + ["adapter_ids"]
    assert all(s.shape == (3,) and s.dtype == "int32" for s in GLM.inputs("increment", "in_graph", dims)[2:4])
    assert GLM.input_names("prefill") == ("input_ids", "batch_valid_length", "context_length", "mask_position")


def test_glm_feed_builder_positions_from_the_prompts():
    """context_length = index of <sop>; mask_position = index of [gMASK], else [MASK]; rows without
    them: all context, mask_position = context_length. The builder keeps no state: decode feeds take
    the row inputs computed once from the prompts, and refuse to go without them."""
    manifest = SimpleNamespace(model_config={"mask_token_id": MASK, "gmask_token_id": GMASK}, bos_token_id=SOP)
    builder = GlmInputsOfInfer(manifest)
    with pytest.raises(ValidationError, match="take 2 row inputs after the lengths .context_length, mask_position., "
                                              "got 0"):
        builder.decode_inputs(np.zeros((4, 1), np.int32), np.ones(4, np.int32))
    prompts = [[5, 6, 7, GMASK, SOP], [5, MASK, 7, SOP], [9, MASK, GMASK, 8, SOP, 3], [5, 6]]
    ids = np.zeros((4, 12), np.int32)
    for i, p in enumerate(prompts):
        ids[i, :len(p)] = p
    ids[3, 2:4] = [GMASK, SOP]           # past the row's valid length: not its prompt
    lengths = np.array([len(p) for p in prompts], np.int32)
    feeds = builder.prefill_inputs(ids, lengths)
    assert len(feeds) == 4 and feeds[0] is ids and feeds[1] is lengths
    np.testing.assert_array_equal(feeds[2], [4, 3, 4, 2])          # context_length
    np.testing.assert_array_equal(feeds[3], [3, 1, 2, 2])          # mask_position
    assert all(f.dtype == np.int32 for f in feeds[2:])
    rows = builder.row_inputs(ids, lengths)
    assert all((a == b).all() for a, b in zip(rows, feeds[2:]))
    assert builder.prefill_inputs(ids, lengths, rows)[2:] == rows
    step = builder.decode_inputs(np.zeros((4, 1), np.int32), lengths + 1, rows)
    assert step[2] is rows[0] and step[3] is rows[1]


def test_prepare_batch_computes_the_row_inputs_once():
    """The decode loop's batch state holds the rows' own inputs, made from the prompts (inert padding
    rows included) when the batch is prepared; families without row inputs get none."""
    from lite_runtime.decode.generation import prepare_batch
    from lite_runtime.decode.inputs import CommonInputsOfInfer
    builder = GlmInputsOfInfer(SimpleNamespace(model_config={"mask_token_id": MASK, "gmask_token_id": GMASK},
                                               bos_token_id=SOP))
    state = prepare_batch([[5, GMASK, SOP], [7, 8, MASK, 9, SOP]], 3, 8, [2, 2], [], 0, inputs=builder)
    np.testing.assert_array_equal(state.row_inputs[0], [2, 4, 1])      # context_length; the padding row: its length
    np.testing.assert_array_equal(state.row_inputs[1], [1, 2, 1])      # mask_position
    assert prepare_batch([[5, 6]], 2, 8, [2], [], 0, inputs=CommonInputsOfInfer()).row_inputs == []


def test_glm_feed_builder_defaults_are_chatglm_6b_ids():
    builder = GlmInputsOfInfer()
    assert (builder.sop, builder.mask, builder.gmask) == (130004, 130000, 130001)
    ids = np.array([[20005, 130001, 130004]], np.int32)
    context, mask_position = builder.row_inputs(ids, np.array([3], np.int32))
    assert (context[0], mask_position[0]) == (2, 1)
