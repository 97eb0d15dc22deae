"""Rank layout (stage, TP rank, layer ranges, neighbours), timeout options from the
environment, and the per-step bytes rank 0 sends: plain Python, no processes."""

import pytest

from infer_cluster.protocol import ConfigError
from infer_cluster.worker.distributed.step_codec import (DOORBELL_SIZE, Command, StepFormatError, decode_step,
                                           encode_step, pack_doorbell, unpack_doorbell)
from infer_cluster.worker.distributed.topology import DistributedOptions, RankLayout
from infer_cluster.worker.scheduler import ScheduledRequest, SchedulerOutput


def test_layout_of_tp2_pp2():
    layouts = [RankLayout(r, 2, 2, num_layers=5) for r in range(4)]
    assert [(l.stage, l.tp_rank) for l in layouts] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert [l.layer_range for l in layouts] == [(0, 2), (0, 2), (2, 5), (2, 5)]
    assert layouts[0].tp_group_ranks(1) == [2, 3]
    assert layouts[1].next_rank == 3 and layouts[3].prev_rank == 1
    assert all(l.last_stage_leader == 2 for l in layouts)
    assert layouts[0].is_first_stage and not layouts[0].is_last_stage and layouts[3].is_last_stage


@pytest.mark.parametrize("num_layers,num_stages", [(2, 2), (7, 3), (28, 4), (32, 3), (3, 1)])
def test_stage_layers_are_contiguous_and_balanced(num_layers, num_stages):
    lay = RankLayout(0, 1, num_stages, num_layers)
    ranges = [lay.stage_layers(s) for s in range(num_stages)]
    assert ranges[0][0] == 0 and ranges[-1][1] == num_layers
    assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:]))
    sizes = [e - s for s, e in ranges]
    assert min(sizes) >= 1 and max(sizes) - min(sizes) <= 1


def test_layout_rejects_more_stages_than_layers():
    with pytest.raises(ConfigError, match="pipeline_parallel_size \\(3\\) exceeds the model's 2 layers"):
        RankLayout(0, 1, 3, num_layers=2)


def test_options_from_env(monkeypatch):
    monkeypatch.setenv("INFER_CLUSTER_MASTER_PORT", "29511")
    monkeypatch.setenv("INFER_CLUSTER_HEARTBEAT_TIMEOUT_S", "3")
    opts = DistributedOptions.from_env()
    assert opts.master_port == 29511 and opts.heartbeat_timeout_s == 3.0
    assert DistributedOptions(**opts.to_dict()) == opts  # how rank processes receive them
    monkeypatch.setenv("INFER_CLUSTER_DIST_TIMEOUT_S", "soon")
    with pytest.raises(ConfigError, match="INFER_CLUSTER_DIST_TIMEOUT_S must be a number"):
        DistributedOptions.from_env()
    with pytest.raises(ConfigError, match="heartbeat timeout"):
        DistributedOptions(heartbeat_timeout_s=0.6, heartbeat_interval_s=0.5)


def test_step_round_trip_drops_request_ids():
    out = SchedulerOutput([ScheduledRequest("a", [1, 2, 3], 0, [4, 5], True),
                           ScheduledRequest("b", [9], 17, [0, 7, 3], False)], num_batched_tokens=4)
    back = decode_step(encode_step(out))
    assert back.num_batched_tokens == 4
    assert [(r.token_ids, r.start_position, r.block_ids, r.needs_sample) for r in back.requests] == \
           [([1, 2, 3], 0, [4, 5], True), ([9], 17, [0, 7, 3], False)]
    with pytest.raises(StepFormatError, match="cannot decode"):
        decode_step(b"\xc1garbage")


def test_doorbell_frames():
    frame = pack_doorbell(Command.STEP, 123456)
    assert len(frame) == DOORBELL_SIZE and unpack_doorbell(frame) == (Command.STEP, 123456)
    assert unpack_doorbell(pack_doorbell(Command.SHUTDOWN)) == (Command.SHUTDOWN, 0)
    with pytest.raises(StepFormatError, match="unknown doorbell command 9"):
        unpack_doorbell(bytes([9]) + bytes(8))
