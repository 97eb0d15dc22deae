"""Async scheduling on a rank group (CPU, gloo): step n+1 is packed and broadcast before step
n's ids reach rank 0's host, its pending input ids written into rank 0's device copy of the
payload (`StepChannel`'s `PendingIds`); with pipeline micro-batches, a group's next step is
submitted, its pending ids filled from the group's queued draw, before the group is collected.
Outputs equal the synchronous loop of the same layout
for greedy, seeded sampling, penalties, logprobs, n-gram bans and min_tokens, with chunked
prefill, a second round on the prefix cache, and preemption; greedy also equals T=1. (A killed
rank with a step in flight: test_failures.py, async parametrization; a stopped one: below.)"""

import os
import signal
import time

import pytest

from infer_cluster.protocol import SamplingParams
from infer_cluster.worker import LLM
import infer_cluster.worker.distributed.channel as channel_mod
import infer_cluster.worker.distributed.shard as shard_mod

from .conftest import ENGINE, GREEDY, kill_pids, make_prompts, wait_gone

PROMPTS = [[5, 6, 7], [8, 9, 10, 11, 12] * 7, [13] * 40, [5, 6, 7, 20, 21], [30, 31], [40] * 17]


def greedy(n, **kw):
    return SamplingParams(temperature=0, max_tokens=n, ignore_eos=True, **kw)


PARAMS = [
    greedy(1),
    SamplingParams(temperature=0.8, top_p=0.9, top_k=20, max_tokens=10, seed=7, ignore_eos=True),
    greedy(11, repetition_penalty=1.3, frequency_penalty=0.5, presence_penalty=0.3),
    greedy(10, no_repeat_ngram_size=2),  # needs its last id on the host: that step runs synchronously
    SamplingParams(temperature=1.0, max_tokens=7, seed=3, logprobs=3, ignore_eos=True),
    greedy(12, min_tokens=6),
]
# (T, P, micro-batches): with micro-batches a group's next step is submitted (pending rows)
# before the group is collected.
LAYOUTS = {"tp2": (2, 1, "auto"), "pp2_one_step": (1, 2, "off"), "pp2_microbatches": (1, 2, "on")}
SETTINGS = {"chunked": dict(ENGINE), "preemption": dict(ENGINE, num_kv_blocks=12, max_num_batched_tokens=64)}


def outputs(llm):
    return [(o.token_ids, o.finish_reason, [lp[0] for lp in o.logprobs or []])
            for _ in range(2) for o in llm.generate(PROMPTS, PARAMS, use_tqdm=False)]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("setting", list(SETTINGS))
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_async_outputs_equal_sync(started, dist_checkpoints, monkeypatch, layout, setting):
    tp, pp, microbatches = LAYOUTS[layout]
    kw = dict(SETTINGS[setting], tensor_parallel_size=tp, pipeline_parallel_size=pp,
              pipeline_microbatches=microbatches)
    path = dist_checkpoints["qwen3"]
    with LLM(path, async_scheduling=False, **kw) as sync:  # one rank group per process at a time
        started.track(sync)
        want = outputs(sync)
        preemptions = sync.stats()["num_preemptions"]

    filled = []
    real = channel_mod.payload_on_device

    def spy(payload, pending, device):
        filled.append(0 if pending is None else len(pending.offsets))
        return real(payload, pending, device)

    monkeypatch.setattr(channel_mod, "payload_on_device", spy)  # the stage-0 broadcast (T > 1)
    monkeypatch.setattr(shard_mod, "payload_on_device", spy)  # micro-batches at T = 1
    llm = started.track(LLM(path, async_scheduling=True, **kw))
    assert llm.engine.async_scheduling
    got = outputs(llm)
    for i, (a, b) in enumerate(zip(got, want)):
        assert a[:2] == b[:2], f"{layout}/{setting}: request {i} differs"
        # the same tokens; a step's batch may differ (float32 sums in another order)
        assert a[2] == pytest.approx(b[2], abs=1e-4), f"{layout}/{setting}: request {i}'s logprobs"
    assert sum(filled) > 0  # pending ids really were written in on rank 0's side
    stats = llm.stats()
    assert stats["num_free_blocks"] == stats["num_total_blocks"]
    if setting == "preemption":  # both loops preempted (not always equally often)
        assert preemptions > 0 and stats["num_preemptions"] > 0


@pytest.mark.timeout(90)
def test_async_tp2_greedy_equals_one_rank(started, dist_checkpoints):
    path = dist_checkpoints["llama"]
    with LLM(path, **ENGINE) as one:
        want = [o.token_ids for o in one.generate(make_prompts(), GREEDY, use_tqdm=False)]
    llm = started.track(LLM(path, tensor_parallel_size=2, async_scheduling=True, **ENGINE))
    assert [o.token_ids for o in llm.generate(make_prompts(), GREEDY, use_tqdm=False)] == want


@pytest.mark.timeout(60)
def test_async_stopped_rank_fails_every_request_within_10s(started, dist_checkpoints):
    """SIGSTOP (a hang, not an exit) while async steps are in flight: the heartbeat monitor
    fails the group, every request ends with an error naming the rank, nothing hangs."""
    llm = started.track(LLM(dist_checkpoints["qwen3"], tensor_parallel_size=2, async_scheduling=True,
                            **ENGINE))
    long = SamplingParams(temperature=0, max_tokens=400, ignore_eos=True)
    rids = {llm.add_request([5 + i, 6, 7], long) for i in range(3)}
    for _ in range(4):
        assert not any(d.finished for d in llm.step())
    pid = llm.engine.runner.rank_pids[0]
    stopped_at = time.monotonic()
    os.kill(pid, signal.SIGSTOP)
    try:
        finals = {}
        while len(finals) < len(rids):
            assert time.monotonic() - stopped_at < 10, "requests still running 10 s after the stop"
            finals.update({d.request_id: d for d in llm.step() if d.finished})
    finally:
        kill_pids([pid])
    assert set(finals) == rids
    for d in finals.values():
        assert d.finish_reason == "error" and "rank 1" in d.error["message"], d.error
    assert wait_gone([pid], 5.0) == []
