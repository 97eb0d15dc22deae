"""Start-up waits for a slow rank up to the join timeout (`DistributedOptions.join_timeout_s`:
the longer of the collective and start-up timeouts), and the collectives after it are bounded
by the collective timeout: a replica whose collective timeout is shorter than a rank's start-up
still starts (real rank processes), and two processes of real gloo groups (`RankGroups`), rank
1 joining 4 s late with a 2 s collective timeout, time out after about 2 s once settled."""

import subprocess
import sys
import time

import pytest

from infer_cluster.protocol import SamplingParams
from infer_cluster.worker import LLM

from .conftest import ENGINE

RANK = """
import datetime, sys, time
import torch, torch.distributed as dist
from infer_cluster.worker.distributed.shard import RankGroups
from infer_cluster.worker.distributed.topology import DistributedOptions, RankLayout

rank, port = int(sys.argv[1]), int(sys.argv[2])
opts = DistributedOptions(collective_timeout_s=2.0, startup_timeout_s=30.0)
join = datetime.timedelta(seconds=opts.join_timeout_s)
if rank == 0:  # the store picks its own free port (as DistributedRunner's does) and says which
    store = dist.TCPStore("127.0.0.1", 0, 2, is_master=True, wait_for_workers=False, timeout=join)
    print("port", store.port, flush=True)
else:
    time.sleep(4.0)  # a rank still importing on a busy host
    store = dist.TCPStore("127.0.0.1", port, 2, is_master=False, timeout=join)
groups = RankGroups(RankLayout(rank, 2, 1, 2), torch.device("cpu"), opts, store)
groups.settle_timeouts()  # what RankShard does once its start-up is over
x = torch.ones(1)
dist.all_reduce(x, group=groups.tp_group)
print("joined", x.item(), flush=True)
if rank == 1:
    time.sleep(10.0)  # alive, but never joins the next collective
    sys.exit(0)
started = time.monotonic()
try:
    dist.all_reduce(torch.ones(1), group=groups.control)
    print("no timeout", flush=True)
except Exception as exc:
    print(f"timed out after {time.monotonic() - started:.1f} s: {type(exc).__name__}", flush=True)
"""


@pytest.mark.timeout(90)
def test_a_late_rank_joins_and_collectives_keep_their_timeout():
    def start(rank: int, port: int) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-c", RANK, str(rank), str(port)], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)

    # Rank 0's store binds a port of its choosing and prints it: a port picked here and bound
    # later could be taken meanwhile by another test's connection (seen once under a loaded
    # 2-core CI run: a rank that printed nothing for 60 s).
    procs = [start(0, 0)]
    try:
        first = procs[0].stdout.readline().split()
        assert first[:1] == ["port"], (first, procs[0].stderr.read()[-2000:] if procs[0].poll() is not None else "")
        procs.append(start(1, int(first[1])))
        outs = [p.communicate(timeout=60) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    rank0, rank1 = (out.strip().splitlines() for out, _ in outs)
    assert rank0[:1] == ["joined 2.0"] and rank1[:1] == ["joined 2.0"], [err[-2000:] for _, err in outs]
    assert rank0[1].startswith("timed out after "), rank0
    waited = float(rank0[1].split()[3])
    assert 1.5 <= waited < 8.0  # the 2 s collective timeout, not the 30 s join timeout


@pytest.mark.timeout(120)
def test_a_collective_timeout_shorter_than_start_up_still_starts(started, dist_checkpoints, monkeypatch):
    """1 s: less than a rank takes to import torch and load its shard. Before the join timeout
    the store and the start-up collectives used it, and the replica failed to start."""
    monkeypatch.setenv("INFER_CLUSTER_DIST_TIMEOUT_S", "1")
    llm = started.track(LLM(dist_checkpoints["qwen3"], tensor_parallel_size=2, **ENGINE))
    out = llm.generate([[5, 6, 7]], SamplingParams(temperature=0, max_tokens=4, ignore_eos=True), use_tqdm=False)
    assert len(out[0].token_ids) == 4 and llm.engine.runner.error is None
