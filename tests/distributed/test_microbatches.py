"""Pipeline micro-batches across real rank processes (CPU, gloo): with P = 2 (and T = 2 x P = 2)
the engine keeps two disjoint groups in flight, and greedy output is token-identical to the
single-process engine and to the one-step-at-a-time pipeline (`pipeline_microbatches="off"`)
for concurrent requests of different lengths, with chunked prefill, requests that finish or are
aborted while the other group is in flight, and preemption. A rank killed with groups in flight
fails every request with an error final within 10 s; close() with a group in flight still ends
every rank with a STOP; an idle pipeline outlives the collective timeout (later stages wait for
steps on the wait group). Each test ends whatever it started (the `started` fixture)."""

import os
import signal
import time

import pytest

from infer_cluster.protocol import SamplingParams
from infer_cluster.worker import LLM
from infer_cluster.worker.distributed.runner import DistributedRunner

from .conftest import ENGINE, make_prompts, wait_gone

LENGTHS = (8, 3, 12, 5, 9, 1, 6)


def prompts_and_params():
    base = [(7 * i + 3) % 500 + 2 for i in range(40)]
    prompts = make_prompts() + [[9, 8, 7], base[3:15], base[10:31]]
    return prompts, [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in LENGTHS]


@pytest.fixture
def submits(monkeypatch):
    """(groups in flight before the submit, request ids, pending rows) of every micro-batch
    submitted."""
    log = []
    real = DistributedRunner.submit

    def spy(self, out, prev_ids=None, prev_rows=()):
        log.append((len(self._uncollected), {s.request_id for s in out.requests}, len(prev_rows)))
        return real(self, out, prev_ids, prev_rows)

    monkeypatch.setattr(DistributedRunner, "submit", spy)
    return log


@pytest.fixture(scope="module")
def single_process(dist_checkpoints):
    """family -> T=1 greedy tokens of `prompts_and_params()` (what every layout must give)."""
    prompts, params = prompts_and_params()
    ref = {}
    for family, path in dist_checkpoints.items():
        with LLM(path, **ENGINE) as llm:
            ref[family] = [o.token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
    return ref


def check_overlap(submits):
    """Two groups were in flight at once, and they were disjoint."""
    assert any(before >= 1 for before, _, _ in submits), "no micro-batch overlapped another"
    assert len({frozenset(ids) for _, ids, _ in submits}) > 2  # the groups changed as requests ended


@pytest.mark.timeout(120)
@pytest.mark.parametrize("family,tp,async_", [("llama", 1, False), ("qwen2", 1, False), ("qwen3", 1, False),
                                             ("qwen3", 2, False), ("qwen3", 2, True)])
def test_microbatch_greedy_matches(started, dist_checkpoints, single_process, submits, family, tp, async_):
    """Async at T=2 x P=2: a group's next step gets its pending ids filled on rank 0 before the
    stage-0 TP broadcast, and the relay carries the filled payload on."""
    prompts, params = prompts_and_params()
    llm = started.track(LLM(dist_checkpoints[family], tensor_parallel_size=tp, async_scheduling=async_,
                            pipeline_parallel_size=2, pipeline_microbatches="on", **ENGINE))
    assert llm.engine.pipeline_depth == 2
    tokens = [o.token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
    assert tokens == single_process[family]
    check_overlap(submits)
    assert any(pending for _, _, pending in submits) == async_
    stats = llm.stats()
    assert stats["num_free_blocks"] == stats["num_total_blocks"]


@pytest.mark.timeout(120)
def test_microbatches_off_is_the_one_step_pipeline(started, dist_checkpoints, single_process, submits):
    prompts, params = prompts_and_params()
    llm = started.track(LLM(dist_checkpoints["llama"], pipeline_parallel_size=2,
                            pipeline_microbatches="off", **ENGINE))
    assert llm.engine.pipeline_depth == 1 and llm.engine.runner.pipeline_depth == 1
    assert [o.token_ids for o in llm.generate(prompts, params, use_tqdm=False)] == single_process["llama"]
    assert submits == []  # every step went through execute(): one at a time


@pytest.mark.timeout(120)
def test_finish_and_abort_while_the_other_group_is_in_flight(started, dist_checkpoints, single_process):
    prompts, params = prompts_and_params()
    llm = started.track(LLM(dist_checkpoints["qwen2"], pipeline_parallel_size=2, pipeline_microbatches="on", **ENGINE))
    rids = [llm.add_request(p, sp) for p, sp in zip(prompts, params)]
    tokens, finals = {rid: [] for rid in rids}, {}
    victim = None
    for _ in range(400):
        for d in llm.step():
            assert d.request_id not in finals, "a delta after the final"
            tokens[d.request_id] += d.token_ids
            if d.finished:
                finals[d.request_id] = d
        steps = llm.engine._inflight.steps
        if victim is None and finals and steps:
            # a request of the group in flight that has not ended: abort it now
            live = [s.request_id for s in steps[0].out.requests if s.request_id not in finals
                    and params[rids.index(s.request_id)].max_tokens >= 8]
            if live:
                victim = live[0]
                assert llm.abort(victim)
        if not llm.has_unfinished_requests():
            break
    assert victim is not None and set(finals) == set(rids)
    assert finals[victim].finish_reason == "abort"
    want = single_process["qwen2"]
    for i, rid in enumerate(rids):
        if rid != victim:
            assert finals[rid].finish_reason == "length" and tokens[rid] == want[i], i
    assert tokens[victim] == want[rids.index(victim)][:len(tokens[victim])]
    stats = llm.stats()
    assert stats["num_free_blocks"] == stats["num_total_blocks"] and not llm.engine._inflight


@pytest.mark.timeout(120)
def test_preemption_with_microbatches(started, dist_checkpoints, submits):
    prompts, params = prompts_and_params()
    tight = dict(ENGINE, num_kv_blocks=8, max_num_batched_tokens=64)
    with LLM(dist_checkpoints["llama"], **tight) as ref:
        want = [o.token_ids for o in ref.generate(prompts, params, use_tqdm=False)]
    llm = started.track(LLM(dist_checkpoints["llama"], pipeline_parallel_size=2, pipeline_microbatches="on", **tight))
    assert [o.token_ids for o in llm.generate(prompts, params, use_tqdm=False)] == want
    stats = llm.stats()
    assert stats["num_preemptions"] > 0
    assert stats["num_free_blocks"] == stats["num_total_blocks"]
    check_overlap(submits)


LONG = SamplingParams(temperature=0, max_tokens=400, ignore_eos=True)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("tp,victim_rank,async_", [(1, 1, False), (2, 1, False), (2, 2, False), (1, 1, True)])
def test_killed_rank_with_groups_in_flight(started, dist_checkpoints, tp, victim_rank, async_):
    """Rank 1 of P=2 is the last stage; of T=2 x P=2 a stage-0 TP rank (fed by rank 0's stage
    broadcast); rank 2 is a later-stage rank fed by the relay. Async: a group's next step and
    its queued draw are in flight too."""
    llm = started.track(LLM(dist_checkpoints["llama"], tensor_parallel_size=tp, async_scheduling=async_,
                            pipeline_parallel_size=2, pipeline_microbatches="on", **ENGINE))
    rids = [llm.add_request([5 + i, 6, 7], LONG) for i in range(4)]
    for _ in range(6):
        assert not any(d.finished for d in llm.step())
    assert llm.engine._inflight  # a group is in flight when the rank goes
    killed_at = time.monotonic()
    os.kill(llm.engine.runner.rank_pids[victim_rank - 1], signal.SIGKILL)
    finals = {}
    while len(finals) < len(rids):
        assert time.monotonic() - killed_at < 10, "requests still running 10 s after the kill"
        for d in llm.step():
            assert d.request_id not in finals
            if d.finished:
                finals[d.request_id] = d
    for d in finals.values():
        assert d.finish_reason == "error", d
        assert f"rank {victim_rank}" in d.error["message"] and "SIGKILL" in d.error["message"], d.error
    assert not llm.engine._inflight and not llm.has_unfinished_requests()
    rid = llm.add_request([9, 9], LONG)  # later steps fail at once
    t = time.monotonic()
    later = [d for _ in range(3) for d in llm.step() if d.finished]
    assert later and later[0].request_id == rid and later[0].finish_reason == "error"
    assert time.monotonic() - t < 1.0
    assert wait_gone(llm.engine.runner.rank_pids, 5.0) == []


@pytest.mark.timeout(60)
@pytest.mark.parametrize("tp,async_", [(2, False), (1, True)])
def test_close_with_a_group_in_flight_stops_every_rank(started, dist_checkpoints, tp, async_):
    llm = started.track(LLM(dist_checkpoints["qwen3"], tensor_parallel_size=tp, async_scheduling=async_,
                            pipeline_parallel_size=2, pipeline_microbatches="on", **ENGINE))
    for i in range(3):
        llm.add_request([5 + i, 6, 7], LONG)
    for _ in range(5):
        llm.step()
    assert llm.engine._inflight
    ranks = llm.engine.runner._ranks
    llm.close()
    assert wait_gone([r.pid for r in ranks], 5.0) == []
    assert [r.popen.returncode for r in ranks] == [0] * (2 * tp - 1)  # each took the STOP step


@pytest.mark.timeout(90)
def test_idle_pipeline_outlives_the_collective_timeout(started, dist_checkpoints, monkeypatch):
    # The timeout also bounds the ranks' rendezvous at start: 6 s failed once on a loaded 2-core
    # machine (rank 1 joined late), so 12, and the idle wait outlasts it.
    monkeypatch.setenv("INFER_CLUSTER_DIST_TIMEOUT_S", "12")
    llm = started.track(LLM(dist_checkpoints["qwen3"], pipeline_parallel_size=2, pipeline_microbatches="on", **ENGINE))
    prompts = [[5, 6, 7], [9, 10], [11, 12, 13, 14]]
    short = SamplingParams(temperature=0, max_tokens=3, ignore_eos=True)
    first = [o.token_ids for o in llm.generate(prompts, short, use_tqdm=False)]
    time.sleep(13)
    assert llm.engine.runner.error is None
    assert [o.token_ids for o in llm.generate(prompts, short, use_tqdm=False)] == first
