"""The packed step tensor: `unpack_step(pack_step(out))` rebuilds exactly the tensors and
metadata `DynamicContext.prepare(out)` builds (values and dtypes), for prefill chunks, decodes,
rows that sample nothing and ragged block tables; headers round-trip and refuse what they do
not understand; and a real two-process gloo `StepChannel` delivers steps inline and through
the second broadcast."""

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from infer_cluster.worker.runner.context import DynamicContext
from infer_cluster.worker.distributed.step_codec import (HEADER_LEN, STOP_HEADER, Op, StepFormatError,
                                                         StepHeader, is_decode_only, pack_step,
                                                         unpack_step)
from infer_cluster.worker.sched.output import ScheduledRequest, SchedulerOutput
from tests.conftest import free_port

REPO = Path(__file__).resolve().parents[2]
BLOCK = 8

STEPS = {
    "prefill_chunk_no_sample": SchedulerOutput(
        [ScheduledRequest("a", list(range(2, 26)), 16, [3, 9, 4, 1, 5], False)], 24),
    "mixed": SchedulerOutput([ScheduledRequest("a", [1, 2, 3], 0, [4], True),
                              ScheduledRequest("b", [9], 17, [0, 7, 3], False),
                              ScheduledRequest("c", [44], 8, [6, 2], True)], 5),
    "decode_only": SchedulerOutput(
        [ScheduledRequest(f"r{i}", [100 + i], 5 * i + 3, list(range(i, 2 * i + 1)), True) for i in range(7)], 7),
    "one_token": SchedulerOutput([ScheduledRequest("x", [5], 0, [0], True)], 1),
}


def prepared(out):
    ctx = DynamicContext(num_layers=1, num_blocks=32, block_size=BLOCK, num_kv_heads=1, head_dim=4,
                         dtype=torch.float32, device=torch.device("cpu"))
    return ctx.prepare(out)


def assert_same_inputs(a, b):
    for name in ("input_ids", "positions", "sample_indices"):
        x, y = getattr(a, name), getattr(b, name)
        assert x.dtype == y.dtype and torch.equal(x, y), name
    for name in ("slot_mapping", "block_tables", "seq_lens", "query_start_loc"):
        x, y = getattr(a.meta, name), getattr(b.meta, name)
        assert x.dtype == y.dtype and x.shape == y.shape and torch.equal(x, y), name
    assert a.meta.max_query_len == b.meta.max_query_len


@pytest.mark.parametrize("name", list(STEPS))
def test_unpacked_step_equals_prepare(name):
    out = STEPS[name]
    header, payload = pack_step(out, BLOCK)
    assert payload.dtype == np.int32 and len(payload) == header.payload_len
    rebuilt = unpack_step(header, torch.from_numpy(payload))
    reference = prepared(out)
    assert_same_inputs(rebuilt, reference)
    assert out.sampled_request_ids() == reference.sample_request_ids
    assert rebuilt.sample_request_ids == []  # request ids never travel


def test_narrow_views_hold_the_same_values():
    out = STEPS["decode_only"]
    header, payload = pack_step(out, BLOCK)
    narrow = unpack_step(header, torch.from_numpy(payload), widen=False)
    wide = prepared(out)
    assert narrow.input_ids.dtype == torch.int32
    assert torch.equal(narrow.input_ids.long(), wide.input_ids)
    assert torch.equal(narrow.meta.slot_mapping.long(), wide.meta.slot_mapping)


def test_sections_are_16_byte_aligned():
    header, payload = pack_step(STEPS["mixed"], BLOCK)
    rebuilt = unpack_step(header, torch.from_numpy(payload))
    base = torch.from_numpy(payload).data_ptr()
    for t in (rebuilt.meta.seq_lens, rebuilt.meta.query_start_loc, rebuilt.meta.block_tables):
        assert (t.data_ptr() - base) % 16 == 0


def test_header_round_trip_and_errors():
    header, _ = pack_step(STEPS["mixed"], BLOCK)
    assert (header.op, header.num_tokens, header.num_seqs, header.num_sampled, header.table_width,
            header.max_query_len) == (Op.RUN, 5, 3, 2, 3, 3)
    assert StepHeader.from_values(header.to_array().tolist()) == header
    assert len(header.to_array()) == HEADER_LEN
    assert STOP_HEADER.payload_len == 0
    bad_format = header.to_array()
    bad_format[0] = 99
    with pytest.raises(StepFormatError, match="step format 99"):
        StepHeader.from_values(bad_format)
    bad_op = header.to_array()
    bad_op[1] = 42
    with pytest.raises(StepFormatError, match="unknown step op 42"):
        StepHeader.from_values(bad_op)
    with pytest.raises(StepFormatError, match="3 values"):
        StepHeader.from_values([2, 1, 0])


def test_decode_only_detection():
    assert is_decode_only(pack_step(STEPS["decode_only"], BLOCK)[0])
    assert is_decode_only(pack_step(STEPS["one_token"], BLOCK)[0])
    assert not is_decode_only(pack_step(STEPS["mixed"], BLOCK)[0])  # a prefill row, an unsampled row
    assert not is_decode_only(pack_step(STEPS["prefill_chunk_no_sample"], BLOCK)[0])


@pytest.mark.timeout(60)
def test_channel_over_gloo_inline_and_second_broadcast():
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)
    env = dict(os.environ, PYTHONPATH=path, OMP_NUM_THREADS="1")
    port = str(free_port())
    procs = [subprocess.Popen([sys.executable, "-m", "tests.distributed.channel_peer", str(rank), port],
                              cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for rank in (0, 1)]
    try:
        outputs = [p.communicate(timeout=45)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert [p.returncode for p in procs] == [0, 0], outputs
    assert "rank 1: 3 steps matched, 1 inline" in outputs[1]
