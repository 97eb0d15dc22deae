"""A rank that dies or hangs fails the replica loudly within 10 s (every scheduled request ends
with an error naming the rank, later steps fail at once, the failure callback fires); a rank
that dies during start-up fails the constructor; rank processes exit when rank 0 dies; close()
ends every rank. Each test ends whatever it started."""

import functools
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from infer_cluster.protocol import ConfigError, SamplingParams
from infer_cluster.worker import LLM
from infer_cluster.worker.config import EngineConfig
from infer_cluster.worker.engine.engine import DynamicEngine
from infer_cluster.worker.sched.output import SchedulerOutput
from infer_cluster.worker.distributed import DistributedRunner, RankFailedError

from .conftest import ENGINE, is_running, kill_pids, wait_gone

LONG = SamplingParams(temperature=0, max_tokens=400, ignore_eos=True)
REPO = Path(__file__).resolve().parents[2]


def start_requests(llm, n=2):
    rids = [llm.add_request([5 + i, 6, 7], LONG) for i in range(n)]
    for _ in range(3):  # the group is mid-generation when the rank goes
        assert not any(d.finished for d in llm.step())
    return rids


def step_until_finished(llm, rids, limit_s):
    """Step until every request in `rids` has its final delta; returns (finals, seconds)."""
    started = time.monotonic()
    finals = {}
    while len(finals) < len(rids):
        assert time.monotonic() - started < limit_s, f"requests still running after {limit_s} s"
        for d in llm.step():
            if d.finished:
                finals[d.request_id] = d
    return finals, time.monotonic() - started


def engine_with_callback(path, calls, **options):
    """An engine whose DistributedRunner reports fatal failures to `calls`, as a server would."""
    factory = functools.partial(DistributedRunner,
                                on_fatal=lambda reason: calls.append((time.monotonic(), reason)))
    return DynamicEngine(EngineConfig(model=path, **options), runner_factory=factory)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_killed_rank_fails_replica_within_10s(started, dist_checkpoints, async_scheduling):
    calls = []
    engine = started.track(engine_with_callback(dist_checkpoints["llama"], calls, tensor_parallel_size=2,
                                                async_scheduling=async_scheduling, **ENGINE))
    assert engine.async_scheduling == async_scheduling  # async: a step is in flight at the kill
    assert engine.runner.tp_allreduce == "nccl"  # CPU ranks (gloo): no symmetric memory
    assert engine.runner.wait_gave_up is None  # so the waits on steps block (device_wait.py)
    rids = start_requests(engine)
    victim = engine.runner.rank_pids[0]
    killed_at = time.monotonic()
    os.kill(victim, signal.SIGKILL)
    finals, _ = step_until_finished(engine, rids, limit_s=10)
    assert time.monotonic() - killed_at < 10
    for d in finals.values():
        assert d.finish_reason == "error"
        assert "rank 1" in d.error["message"] and "SIGKILL" in d.error["message"], d.error
    assert len(calls) == 1 and "rank 1" in calls[0][1] and calls[0][0] - killed_at < 10
    # Every later step fails at once with the same cause instead of touching the dead group.
    rid = engine.add_request([9, 9], LONG)
    later, seconds = step_until_finished(engine, [rid], limit_s=5)
    assert later[rid].finish_reason == "error" and "rank 1" in later[rid].error["message"]
    assert seconds < 1.0
    with pytest.raises(RankFailedError, match="rank 1"):
        engine.runner.execute(SchedulerOutput())
    assert not engine.runner.device_stuck  # a device that drains is torn down as before


@pytest.mark.timeout(60)
def test_stopped_rank_counts_as_hung_within_10s(started, dist_checkpoints):
    """SIGSTOP: the process exists but answers nothing (a hang); its heartbeat stops."""
    llm = started.track(LLM(dist_checkpoints["qwen3"], tensor_parallel_size=2,
                            pipeline_parallel_size=2, pipeline_microbatches="on", **ENGINE))
    rids = start_requests(llm)
    pids = llm.engine.runner.rank_pids
    stopped_at = time.monotonic()
    os.kill(pids[-1], signal.SIGSTOP)  # rank 3: last stage, sends the logits back
    try:
        finals, _ = step_until_finished(llm, rids, limit_s=10)
    finally:
        kill_pids([pids[-1]])  # SIGKILL ends a stopped process too
    assert time.monotonic() - stopped_at < 10
    for d in finals.values():
        assert d.finish_reason == "error" and "rank 3" in d.error["message"], d.error
        assert "hung or stopped" in d.error["message"]
    assert wait_gone(pids, 5.0) == []  # the failure killed every rank, not only the stopped one


@pytest.mark.timeout(60)
def test_rank_dying_at_startup_fails_constructor(started, dist_checkpoints, tmp_path, monkeypatch,
                                                 capfd):
    """Rank 1 gets a checkpoint without weights: it exits while rank 0 waits for it, and its
    traceback reaches rank 0's stderr (the replica's log), each line marked with its rank."""
    import infer_cluster.worker.distributed.runner as runner_mod

    broken = tmp_path / "no_weights"
    broken.mkdir()
    (broken / "config.json").write_text((Path(dist_checkpoints["llama"]) / "config.json").read_text())
    spawned = []
    real_spawn = runner_mod.spawn_rank

    def spawn_with_bad_path(rank, bootstrap, options):
        proc = real_spawn(rank, dict(bootstrap, model_path=str(broken)), options)
        spawned.append(proc.pid)
        started.add_pids([proc.pid])
        return proc

    monkeypatch.setattr(runner_mod, "spawn_rank", spawn_with_bad_path)
    t = time.monotonic()
    with pytest.raises(RankFailedError, match=r"rank 1 \(pid \d+\) exited with exit code 1"):
        LLM(dist_checkpoints["llama"], tensor_parallel_size=2, **ENGINE)
    assert time.monotonic() - t < 30
    assert spawned and wait_gone(spawned, 5.0) == []
    err = capfd.readouterr().err
    cause = [line for line in err.splitlines() if "no *.safetensors weights" in line]
    assert cause and all(line.startswith("rank 1 | ") for line in cause), err[-2000:]


@pytest.mark.timeout(90)
def test_idle_replica_outlives_the_collective_timeout(started, dist_checkpoints, monkeypatch):
    """Ranks wait for the next step in the step channel's wait group, which has no practical
    timeout, not in a collective bound by INFER_CLUSTER_DIST_TIMEOUT_S: a replica left idle
    for longer than that stays healthy and gives the same tokens."""
    monkeypatch.setenv("INFER_CLUSTER_DIST_TIMEOUT_S", "8")
    llm = started.track(LLM(dist_checkpoints["qwen3"], tensor_parallel_size=2, **ENGINE))
    prompts = [[5, 6, 7], [9, 10]]
    short = SamplingParams(temperature=0, max_tokens=3, ignore_eos=True)
    first = [o.token_ids for o in llm.generate(prompts, short, use_tqdm=False)]
    time.sleep(9)
    assert llm.engine.runner.error is None
    assert [o.token_ids for o in llm.generate(prompts, short, use_tqdm=False)] == first


def test_bad_layouts_fail_before_starting_processes(dist_checkpoints):
    with pytest.raises(ConfigError, match="tensor_parallel_size 3 does not divide num_attention_heads"):
        LLM(dist_checkpoints["llama"], tensor_parallel_size=3, **ENGINE)
    with pytest.raises(ConfigError, match="pipeline_parallel_size \\(4\\) exceeds the model's 2 layers"):
        LLM(dist_checkpoints["llama"], pipeline_parallel_size=4, **ENGINE)


REPLICA = textwrap.dedent("""
    import sys, time
    from infer_cluster.worker import LLM
    llm = LLM(sys.argv[1], tensor_parallel_size=2, pipeline_parallel_size=int(sys.argv[2]),
              block_size=8, num_kv_blocks=32)
    print(" ".join(str(p) for p in llm.engine.runner.rank_pids), flush=True)
    time.sleep(120)
""")


@pytest.mark.timeout(90)
@pytest.mark.parametrize("how", ["sigkill", "close"])
@pytest.mark.parametrize("rank_start", ["fork-server", "exec"])
def test_rank_processes_end_with_rank0(started, dist_checkpoints, how, rank_start, monkeypatch):
    """A replica process that is SIGKILLed (no cleanup runs) or that closes its LLM leaves no
    rank process behind, whether its ranks were forked by the fork server (whose children are
    not rank 0's) or exec'd."""
    monkeypatch.setenv("INFER_CLUSTER_RANK_START", rank_start)
    if how == "close":
        llm = started.track(LLM(dist_checkpoints["qwen2"], tensor_parallel_size=2, **ENGINE))
        pids = llm.engine.runner.rank_pids
        assert all(is_running(p) for p in pids)
        parents = {int(Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()[1]) for p in pids}
        assert (parents == {os.getpid()}) == (rank_start == "exec"), parents  # forked: the server's
        llm.close()
        llm.close()  # idempotent
        assert wait_gone(pids, 5.0) == []
        return
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.Popen([sys.executable, "-c", REPLICA, dist_checkpoints["qwen2"], "1"],
                            stdout=subprocess.PIPE, env=env, cwd=str(REPO))
    pids = []
    try:
        line = proc.stdout.readline()
        pids = [int(p) for p in line.split()]
        started.add_pids(pids)
        assert len(pids) == 1 and all(is_running(p) for p in pids)
        proc.kill()
        proc.wait(timeout=10)
        assert wait_gone(pids, 10.0) == [], "rank processes outlived a SIGKILLed rank 0"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
        proc.stdout.close()
        kill_pids(pids)
