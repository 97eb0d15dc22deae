"""The TP all-reduce switch (worker/distributed/symm_allreduce.py) on the CPU: the mode comes
from INFER_CLUSTER_TP_ALLREDUCE with a clear error for a bad value, and nothing is set up where
it cannot run (no TP group, a CPU device, `nccl`), so ParallelState keeps the group's own
all-reduce. The sums themselves are checked on 2 GPUs (tests/distributed/test_gpu_allreduce.py)."""

import pytest
import torch

from infer_cluster.protocol.errors import ConfigError
from infer_cluster.worker.distributed.symm_allreduce import (ENV, SymmAllReduce, name_already_bound,
                                                             tp_allreduce_mode)
from infer_cluster.worker.models.parallel import ParallelState


@pytest.mark.parametrize("value,mode", [(None, "nccl"), ("", "nccl"), ("AUTO", "auto"), (" one_shot ", "one_shot"),
                                        ("two_shot", "two_shot")])
def test_mode_from_environment(monkeypatch, value, mode):
    if value is None:
        monkeypatch.delenv(ENV, raising=False)
    else:
        monkeypatch.setenv(ENV, value)
    assert tp_allreduce_mode() == mode


def test_bad_mode_is_a_config_error(monkeypatch):
    monkeypatch.setenv(ENV, "ring")
    with pytest.raises(ConfigError, match="INFER_CLUSTER_TP_ALLREDUCE='ring' is not one of nccl, auto"):
        tp_allreduce_mode()


@pytest.mark.parametrize("group,device,mode", [(None, "cuda", "auto"), (object(), "cpu", "auto"),
                                               (object(), "cuda", "nccl")])
def test_nothing_set_up_where_it_cannot_run(group, device, mode):
    # Returns before touching the group or the device (no collective is issued either).
    assert SymmAllReduce.create(group, torch.device(device), control_group=None, mode=mode) is None


def test_parallel_state_without_fast_path_is_unchanged():
    ps = ParallelState()
    x = torch.ones(3)
    assert ps.all_reduce(x) is x


def test_a_group_name_torch_already_bound_is_seen():
    """A second engine in one process gets its TP group's name again (the group counter resets
    with the process group); torch's symmetric memory would keep the first engine's store for
    it, so `create` must see the name and fall back to NCCL."""
    class FakeSymmMem:
        _group_name_to_store = {"1": object()}

    assert name_already_bound(FakeSymmMem, "1")
    assert not name_already_bound(FakeSymmMem, "2")
    assert not name_already_bound(object(), "1")  # a torch without the table
