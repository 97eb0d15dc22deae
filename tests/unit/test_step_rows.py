"""`step_rows` (worker/runner/step_rows.py): the decode-only path and the general loop give the same
rows as a plain per-token reference, on random batches with ragged block tables, pending inputs
and unsampled rows; the tensor-parallel step codec carries the same values."""

import random

import numpy as np
import pytest
import torch

from infer_cluster.worker.distributed.step_codec import pack_step, unpack_step
from infer_cluster.worker.sched.output import ScheduledRequest, SchedulerOutput
from infer_cluster.worker.runner.step_rows import row_spans, step_rows

BS = 4


def _reference(out):
    ids, pos, slots, lens, qsl, sample_rows, sample_ids, pending = [], [], [], [], [0], [], [], []
    width = max(len(r.block_ids) for r in out.requests)
    tables = []
    for r in out.requests:
        for j, t in enumerate(r.token_ids):
            p = r.start_position + j
            ids.append(t)
            pos.append(p)
            slots.append(r.block_ids[p // BS] * BS + p % BS)
        lens.append(r.start_position + len(r.token_ids))
        qsl.append(len(ids))
        tables.append(r.block_ids + [0] * (width - len(r.block_ids)))
        if r.needs_sample:
            sample_rows.append(len(ids) - 1)
            sample_ids.append(r.request_id)
        if r.pending_input:
            pending.append(len(ids) - 1)
    return ids, pos, slots, lens, qsl, tables, sample_rows, sample_ids, pending


def _batch(rng, decode_only):
    reqs = []
    for i in range(rng.randint(1, 9)):
        n = 1 if decode_only or rng.random() < 0.5 else rng.randint(2, 9)
        start = rng.randint(0, 30)
        blocks = rng.sample(range(100), -(-(start + n) // BS) + rng.randint(0, 2))
        pending = n == 1 and rng.random() < 0.5
        reqs.append(ScheduledRequest(f"r{i}", [rng.randint(3, 999) for _ in range(n)], start, blocks,
                                     pending or rng.random() < 0.7, pending))
    return SchedulerOutput(reqs, sum(len(r.token_ids) for r in reqs))


@pytest.mark.parametrize("decode_only", [True, False])
def test_rows_match_the_per_token_reference(decode_only):
    rng = random.Random(7 + decode_only)
    for _ in range(50):
        out = _batch(rng, decode_only)
        rows = step_rows(out, BS)
        ids, pos, slots, lens, qsl, tables, sample_rows, sample_ids, pending = _reference(out)
        assert (rows.input_ids, rows.positions, rows.slots) == (ids, pos, slots)
        assert rows.seq_lens.tolist() == lens and rows.query_start.tolist() == qsl
        assert rows.block_tables.tolist() == tables
        assert rows.max_query_len == max(len(r.token_ids) for r in out.requests)
        assert (rows.sample_rows, rows.sample_ids, rows.pending_rows) == (sample_rows, sample_ids, pending)
        # the tensor-parallel codec packs the same rows
        header, payload = pack_step(out, BS)
        got = unpack_step(header, torch.from_numpy(payload))
        assert got.input_ids.tolist() == ids and got.positions.tolist() == pos
        assert got.meta.slot_mapping.tolist() == slots and got.sample_indices.tolist() == sample_rows
        assert got.meta.block_tables.tolist() == tables and got.meta.seq_lens.tolist() == lens
        assert np.array_equal(got.meta.query_start_loc.numpy(), np.asarray(qsl))


def test_row_spans_encode_runs_of_one_request():
    assert row_spans(["a", "b", "c"]) is None  # a plain decode step: no runs
    assert row_spans(["a", "a", "a", "b", "c", "c"]).tolist() == [3, -1, -2, 1, 2, -1]
    assert row_spans(["a", "b", "b", "b", "b"]).tolist() == [1, 4, -1, -2, -3]
    # a verify step as decode rows has runs; a step with a prompt chunk (one row a request) has none
    reqs = [ScheduledRequest("x", [5], 8, [1, 2, 3], True), ScheduledRequest("x", [6], 9, [1, 2, 3], True),
            ScheduledRequest("y", [7], 3, [4], True)]
    assert row_spans([r.request_id for r in reqs]).tolist() == [2, -1, 1]
    chunk = [ScheduledRequest("x", [5, 6], 8, [1, 2, 3], True)]
    assert row_spans([r.request_id for r in chunk]) is None
