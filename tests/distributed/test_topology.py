"""Rank layout (stage, TP rank, layer ranges, neighbours) and timeout options from the
environment: plain Python, no processes. The step tensor is tested in test_step_codec.py."""

import pytest

from infer_cluster.protocol import ConfigError
from infer_cluster.worker.distributed.topology import DistributedOptions, RankLayout


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
    monkeypatch.setenv("INFER_CLUSTER_RANK_START", "exec")
    opts = DistributedOptions.from_env()
    assert opts.master_port == 29511 and opts.heartbeat_timeout_s == 3.0 and opts.rank_start == "exec"
    auto = DistributedOptions()
    assert auto.rank_start == "auto" and auto.start_for("cpu") == "fork-server" and auto.start_for("cuda") == "exec"
    assert opts.start_for("cpu") == "exec"
    assert DistributedOptions(**opts.to_dict()) == opts  # how rank processes receive them
    monkeypatch.setenv("INFER_CLUSTER_DIST_TIMEOUT_S", "soon")
    with pytest.raises(ConfigError, match="INFER_CLUSTER_DIST_TIMEOUT_S must be a number"):
        DistributedOptions.from_env()
    with pytest.raises(ConfigError, match="heartbeat timeout"):
        DistributedOptions(heartbeat_timeout_s=0.6, heartbeat_interval_s=0.5)
    with pytest.raises(ConfigError, match="rank start must be one of auto, fork-server, exec, got 'fork'"):
        DistributedOptions(rank_start="fork")
