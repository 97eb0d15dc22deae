"""The TP all-reduce switch (worker/distributed/symm_allreduce.py) on the CPU: the mode comes
from INFER_CLUSTER_TP_ALLREDUCE with a clear error for a bad value, and nothing is set up where
it cannot run (no TP group, a CPU device, `nccl`), so ParallelState keeps the group's own
all-reduce. The sums themselves are checked on 2 GPUs (tests/distributed/test_gpu_allreduce.py)."""

import subprocess
import sys
import types

import pytest
import torch

from infer_cluster.protocol.errors import ConfigError
from infer_cluster.worker.distributed.symm_allreduce import (ENV, SymmAllReduce, bound_to_another_group,
                                                             tp_allreduce_mode)
from infer_cluster.worker.models.parallel import ParallelState
from tests.conftest import free_port


@pytest.mark.parametrize("value,mode", [(None, "auto"), ("", "auto"), ("NCCL", "nccl"), (" one_shot ", "one_shot"),
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


def test_a_group_name_bound_to_another_group_is_seen():
    """Without torch's table, or with the name unbound, nothing is in the way; a store torch
    holds under the name that cannot be matched to this group's counts as another group's."""
    group = types.SimpleNamespace(group_name="1")

    class Bound:
        _group_name_to_store = {"1": object()}

    assert not bound_to_another_group(object(), group)  # a torch without the table
    assert not bound_to_another_group(Bound, types.SimpleNamespace(group_name="2"))
    assert bound_to_another_group(Bound, group)  # not a real group: cannot tell, so yes


# Two engines' worth of process groups in one process, as the GPU tests build them: the second
# TP group gets the first one's name, and torch keeps the first group's store under it.
TWO_ROUNDS = """
import datetime, sys, warnings
import torch.distributed as dist
import torch.distributed._symmetric_memory as symm_mem
from infer_cluster.worker.distributed.symm_allreduce import bound_to_another_group
for port in (int(sys.argv[1]), int(sys.argv[2])):
    store = dist.TCPStore("127.0.0.1", port, 1, is_master=True, timeout=datetime.timedelta(seconds=20))
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    group = dist.new_group([0])
    before = bound_to_another_group(symm_mem, group)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        symm_mem.enable_symm_mem_for_group(group.group_name)
    print(group.group_name, before, bound_to_another_group(symm_mem, group))
    dist.destroy_process_group()
"""


def test_a_closed_engines_group_name_is_seen_with_real_groups():
    ports = [str(free_port()) for _ in range(2)]
    run = subprocess.run([sys.executable, "-c", TWO_ROUNDS, *ports], capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    first, second = (line.split() for line in run.stdout.split("\n") if line.strip())
    assert first[0] == second[0], "torch no longer reuses group names: the guard may be moot"
    assert first[1:] == ["False", "False"]  # a fresh name; then its own store (a second create)
    assert second[1:] == ["True", "True"]  # the first round's store is still bound to the name


