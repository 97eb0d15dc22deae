"""`GraphInputs.stage` writes a decode step straight into the decode graphs' static inputs: what
the graph reads (the first `bs` rows) must equal what `DynamicContext.prepare` builds followed
by `DecodeGraphs.run`'s copies and padding, for steady async steps (ids from the previous draw,
rows in order), reordered pending rows, rows with their ids on the host, ragged block tables,
and a ring that wraps. Runs the CPU layout (a plain copy in place of the transfer)."""

import random

import pytest
import torch

from infer_cluster.worker.kv.block_table import BlockTableMirror
from infer_cluster.worker.runner.context import DynamicContext
from infer_cluster.worker.runner import graph_inputs
from infer_cluster.worker.runner.graph_inputs import RING, GraphInputs
from infer_cluster.worker.runner.step_rows import row_spans
from infer_cluster.worker.sched.output import ScheduledRequest, SchedulerOutput

BLOCK = 4
MAX_BATCH, MAX_BLOCKS = 16, 12


def _static(inputs: GraphInputs, bs: int) -> dict:
    return {"ids": inputs.input_ids[:bs].tolist(), "pos": inputs.positions[:bs].tolist(),
            "slots": inputs.slot_mapping[:bs].tolist(), "lens": inputs.seq_lens[:bs].tolist(),
            "qsl": inputs.query_start_loc[:bs + 1].tolist()}


def _expected(out: SchedulerOutput, bs: int, prev_ids, prev_rows, ctx: DynamicContext) -> tuple[dict, list]:
    """What `prepare` + `DecodeGraphs.run` put in the first bs rows, and each row's blocks."""
    step = ctx.prepare(out, prev_ids, prev_rows)
    n = len(out.requests)
    meta = step.meta
    pad = bs - n
    exp = {"ids": step.input_ids.tolist() + [None] * pad, "pos": step.positions.tolist() + [None] * pad,
           "slots": meta.slot_mapping.tolist() + [-1] * pad, "lens": meta.seq_lens.tolist() + [1] * pad,
           "qsl": list(range(bs + 1))}
    tables = [row[:len(r.block_ids)] for row, r in zip(meta.block_tables.tolist(), out.requests)]
    return exp, tables


def _check(inputs: GraphInputs, out: SchedulerOutput, bs: int, prev_ids, prev_rows, ctx) -> None:
    exp, tables = _expected(out, bs, prev_ids, prev_rows, ctx)
    got = _static(inputs, bs)
    n = len(out.requests)
    for key in ("slots", "lens", "qsl"):
        assert got[key] == exp[key], key
    for key in ("ids", "pos"):  # padding rows' ids and positions are whatever they were
        assert got[key][:n] == exp[key][:n], key
    for i, r in enumerate(out.requests):  # entries past a row's blocks are never read
        assert inputs.block_tables[i, :len(r.block_ids)].tolist() == tables[i]


@pytest.mark.parametrize("small_step", [0, 4, 16], ids=["numpy", "mixed", "python"])
def test_steps_match_prepare_and_the_graph_copies(small_step, monkeypatch):
    # steps of at most SMALL_STEP rows compute positions and slots in Python, longer ones in numpy
    monkeypatch.setattr(graph_inputs, "SMALL_STEP", small_step)
    rng = random.Random(small_step)
    inputs = GraphInputs(MAX_BATCH, MAX_BLOCKS, torch.device("cpu"))
    mirror = BlockTableMirror(rows=4, width=2)  # grows as the steps need
    ctx = DynamicContext(1, 64, BLOCK, 1, 2, torch.float32, torch.device("cpu"))
    blocks = {f"r{i}": [rng.randrange(64) for _ in range(1 + i % 5)] for i in range(12)}
    positions = {rid: len(b) * BLOCK - 1 - rng.randrange(BLOCK) for rid, b in blocks.items()}
    for step in range(6 * RING):
        rids = rng.sample(sorted(blocks), rng.randrange(1, 12))
        kind = step % 3  # 0: steady (ids from the draw, in order), 1: reordered draw rows, 2: host ids
        reqs = [ScheduledRequest(rid, [100 + j], positions[rid], blocks[rid], True, pending_input=kind != 2,
                                 block_epoch=0) for j, rid in enumerate(rids)]
        out = SchedulerOutput(reqs, len(reqs))
        n = len(reqs)
        prev_ids = torch.arange(1000, 1000 + MAX_BATCH, dtype=torch.int64)
        if kind == 0 and step % 2:  # the previous draw had exactly these rows
            prev_ids = prev_ids[:n]
        prev_rows = list(range(n)) if kind == 0 else rng.sample(range(MAX_BATCH), n) if kind == 1 else []
        bs = min(b for b in (1, 2, 4, 8, 16) if b >= n)
        inputs.stage(out, mirror, BLOCK, bs, prev_ids if prev_rows else None, prev_rows)
        _check(inputs, out, bs, prev_ids if prev_rows else None, prev_rows, ctx)
    assert inputs.staged == 6 * RING


def test_a_mixed_set_of_pending_and_host_rows():
    inputs = GraphInputs(8, 4, torch.device("cpu"))
    mirror = BlockTableMirror()
    ctx = DynamicContext(1, 16, BLOCK, 1, 2, torch.float32, torch.device("cpu"))
    reqs = [ScheduledRequest("a", [7], 5, [3, 9], True, pending_input=True),
            ScheduledRequest("b", [8], 2, [4], True),
            ScheduledRequest("c", [0], 9, [1, 2, 5], True, pending_input=True)]
    out = SchedulerOutput(reqs, 3)
    prev_ids = torch.tensor([50, 51, 52], dtype=torch.int64)
    inputs.stage(out, mirror, BLOCK, 4, prev_ids, [2, 0])
    _check(inputs, out, 4, prev_ids, [2, 0], ctx)
    assert inputs.input_ids[:3].tolist() == [52, 8, 50]


def test_bad_steps_are_refused():
    inputs = GraphInputs(4, 2, torch.device("cpu"))
    mirror = BlockTableMirror()
    one = SchedulerOutput([ScheduledRequest("a", [7], 1, [0], True, pending_input=True)], 1)
    with pytest.raises(ValueError, match="pending token"):
        inputs.stage(one, mirror, BLOCK, 1, None, [])
    with pytest.raises(ValueError, match="cannot run as"):
        inputs.stage(one, mirror, BLOCK, 8, torch.zeros(1, dtype=torch.int64), [0])
    wide = SchedulerOutput([ScheduledRequest("w", [7], 9, [0, 1, 2], True)], 1)
    with pytest.raises(ValueError, match="exceeds"):
        inputs.stage(wide, mirror, BLOCK, 1)


def test_runs_are_staged_and_prepared():
    # A verify step laid out as decode rows (worker/spec_decode/verify.py `decode_shaped`): the
    # graphs' `row_span` section and the eager step's metadata carry its runs; the next plain
    # step sets every row, padding included, back to a run of one. Inputs without a span
    # section refuse runs.
    inputs = GraphInputs(8, 4, torch.device("cpu"), runs=True)
    mirror = BlockTableMirror()
    ctx = DynamicContext(1, 16, BLOCK, 1, 2, torch.float32, torch.device("cpu"))
    verify = [ScheduledRequest("a", [7 + j], 5 + j, [3, 9], True) for j in range(3)] + [
        ScheduledRequest("b", [8], 2, [4], True)]
    out = SchedulerOutput(verify, 4)
    spans = row_spans([r.request_id for r in verify])
    inputs.stage(out, mirror, BLOCK, 8, row_span=spans)
    assert inputs.row_span.tolist() == [3, -1, -2, 1, 1, 1, 1, 1]
    assert ctx.prepare(out, row_span=spans).meta.row_span.tolist() == [3, -1, -2, 1]
    _check(inputs, out, 8, None, [], ctx)
    plain = SchedulerOutput([ScheduledRequest("a", [1], 8, [3, 9, 2], True)], 1)
    inputs.stage(plain, mirror, BLOCK, 2)
    assert inputs.row_span[:8].tolist() == [1] * 8
    assert ctx.prepare(plain).meta.row_span is None
    assert GraphInputs(8, 4, torch.device("cpu")).row_span is None  # only where asked for
    with pytest.raises(ValueError, match="span section"):
        GraphInputs(8, 4, torch.device("cpu")).stage(out, mirror, BLOCK, 8, row_span=spans)
