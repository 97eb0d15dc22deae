"""`DynamicContext.prepare` packs a step's host lists into one buffer: every view it hands out
holds its own values and starts 16 bytes aligned whatever the token and sequence counts (Triton
specializes kernels on pointer alignment; an odd offset would compile a new variant mid-run),
and the attention metadata comes as int32 views of it (no cast kernels per step)."""

import torch

from infer_cluster.worker.runner.context import DynamicContext
from infer_cluster.worker.sched.output import ScheduledRequest, SchedulerOutput


def test_views_are_aligned_and_hold_their_values():
    ctx = DynamicContext(num_layers=1, num_blocks=32, block_size=8, num_kv_heads=1, head_dim=4,
                         dtype=torch.float32, device=torch.device("cpu"))
    # 3 + 1 + 1 = 5 tokens (odd), 3 sequences (odd), two sampled rows, ragged tables
    out = SchedulerOutput([ScheduledRequest("a", [5, 6, 7], 0, [4], True),
                           ScheduledRequest("b", [9], 17, [0, 7, 3], False),
                           ScheduledRequest("c", [11], 8, [2, 6], True)], 5)
    inputs = ctx.prepare(out)
    meta = inputs.meta
    for t in (inputs.input_ids, inputs.positions, meta.slot_mapping, inputs.sample_indices,
              meta.seq_lens, meta.query_start_loc, meta.block_tables):
        assert t.data_ptr() % 16 == 0
    # What the kernels read as int32 arrives as int32 (no cast launches), ids as int64
    assert [t.dtype for t in (meta.block_tables, meta.seq_lens, meta.query_start_loc)] == [torch.int32] * 3
    assert [t.dtype for t in (inputs.input_ids, inputs.positions, meta.slot_mapping)] == [torch.int64] * 3
    assert meta.block_tables.is_contiguous()
    assert inputs.input_ids.tolist() == [5, 6, 7, 9, 11]
    assert inputs.positions.tolist() == [0, 1, 2, 17, 8]
    assert meta.slot_mapping.tolist() == [32, 33, 34, 3 * 8 + 1, 6 * 8 + 0]
    assert inputs.sample_indices.tolist() == [2, 4]
    assert meta.seq_lens.tolist() == [3, 18, 9]
    assert meta.query_start_loc.tolist() == [0, 3, 4, 5]
    assert meta.block_tables.tolist() == [[4, 0, 0], [0, 7, 3], [2, 6, 0]]
    assert inputs.sample_request_ids == ["a", "c"]


def _decode_out(positions: dict) -> SchedulerOutput:
    """One pending-input decode row per request (async scheduling's steady steps); request
    "a" owns block 0, "b" block 1, "c" block 2."""
    reqs = [ScheduledRequest(rid, [0], pos, ["abc".index(rid)], True, pending_input=True)
            for rid, pos in positions.items()]
    return SchedulerOutput(reqs, len(reqs))


def test_pending_inputs_come_from_the_previous_draw():
    ctx = DynamicContext(num_layers=1, num_blocks=32, block_size=8, num_kv_heads=1, head_dim=4,
                         dtype=torch.float32, device=torch.device("cpu"))
    draw = torch.tensor([71, 72, 73], dtype=torch.int64)
    # A steady batch (row i continues row i): the draw is the input, read as it is
    steady = ctx.prepare(_decode_out({"a": 3, "b": 5, "c": 6}), draw, [0, 1, 2])
    assert steady.input_ids.tolist() == [71, 72, 73]
    assert steady.input_ids.data_ptr() == draw.data_ptr()
    assert steady.meta.slot_mapping.tolist() == [3, 8 + 5, 16 + 6]
    # The batch changed order / lost a row: gathered from the draw's rows
    moved = ctx.prepare(_decode_out({"c": 7, "a": 4}), draw, [2, 0])
    assert moved.input_ids.tolist() == [73, 71]
    assert moved.input_ids.data_ptr() != draw.data_ptr()
    fewer = ctx.prepare(_decode_out({"a": 5}), draw, [0])  # row 0 of three: still row 0
    assert fewer.input_ids.tolist() == [71]
