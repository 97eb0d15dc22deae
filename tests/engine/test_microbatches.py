"""The engine's half of pipeline micro-batches, without processes: a single-process runner that
poses as a pipeline of depth P (`submit` / `collect`) gives the same outputs as the synchronous
loop for every finish rule, stop strings, seeded sampling, penalties, n-gram bans, logprobs,
prefix-cache hits, chunked prefill and preemption; groups in flight are disjoint and up to P
deep; aborts and failures with groups in flight end every request exactly once and free every
block. With async scheduling as well, the same outputs with groups continued early (pending
rows from the oldest group's queued draw). The rank-side half is tests/distributed/test_microbatches.py."""

import gc

import pytest

import infer_cluster.worker.engine.engine as engine_mod
from infer_cluster.worker import LLM
from infer_cluster.worker.engine.inflight import LaunchedStep, SubmittedStep
from infer_cluster.worker.runner.model_runner import ModelRunner

from .test_async_scheduling import (PROMPTS, SETTINGS, drain, greedy, outputs, reference_params,  # noqa: F401
                                    unresolved_params)


def pipelined_runner(depth, log):
    class Pipelined(ModelRunner):
        """Runs a step at submit and hands the logits over at collect, checking the order and
        the disjointness of the groups. With async scheduling the engine takes the oldest
        group's logits early (`collect_queued`) and submits that group's next step with
        `pending_input` rows read from its draw (on the CPU the draw is already done)."""
        pipeline_depth = depth

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.tickets = []
            self.pending_rows = self.settled = 0

        def submit(self, out, prev_ids=None, prev_rows=()):
            ids = {s.request_id for s in out.requests}
            for other in self.tickets:
                assert not ids & other["ids"], "a request is in two groups in flight"
            pending = sum(s.pending_input for s in out.requests)
            assert pending == len(prev_rows)
            self.pending_rows += pending
            result = self.execute(out, prev_ids, prev_rows) if pending else self.execute(out)
            ticket = dict(ids=ids, result=result)
            self.tickets.append(ticket)
            log.append(len(self.tickets))
            assert len(self.tickets) <= depth
            return ticket

        def collect(self, ticket):
            assert self.tickets[0] is ticket, "groups are collected in submit order"
            return self.tickets.pop(0)["result"]

        def collect_queued(self, ticket):
            return self.collect(ticket)

        def settle(self, ticket):
            assert all(t is not ticket for t in self.tickets)
            self.settled += 1

        def discard(self, ticket):
            self.tickets = [t for t in self.tickets if t is not ticket]

    return Pipelined


@pytest.fixture
def depth_llm(monkeypatch):
    def make(depth, **kw):
        log = []
        monkeypatch.setattr(engine_mod, "ModelRunner", pipelined_runner(depth, log))
        llm = LLM("tiny-random", **kw)
        monkeypatch.setattr(engine_mod, "ModelRunner", ModelRunner)
        assert llm.engine.pipeline_depth == depth
        return llm, log
    return make


@pytest.fixture(scope="module")
def sync_outputs(reference_params):  # noqa: F811
    """setting -> the synchronous loop's `outputs` of `reference_params` (what every depth, with
    and without async scheduling, must give), each made once for the module."""
    made = {}

    def get(setting):
        if setting not in made:
            kw = {**dict(block_size=8, num_kv_blocks=64), **SETTINGS[setting]}
            made[setting] = outputs(LLM("tiny-random", async_scheduling=False, **kw), reference_params)
        return made[setting]
    return get


@pytest.mark.parametrize("depth", [2, 3])
@pytest.mark.parametrize("setting", list(SETTINGS))
def test_microbatch_outputs_equal_sync(reference_params, sync_outputs, depth_llm, setting, depth):  # noqa: F811
    kw = {**dict(block_size=8, num_kv_blocks=64), **SETTINGS[setting]}
    want = sync_outputs(setting)
    llm, log = depth_llm(depth, **kw)
    got = outputs(llm, reference_params)
    for i, (a, b) in enumerate(zip(got, want)):
        assert a[:3] == b[:3], f"{setting}: request {i} differs"
        if b[3] is not None:
            # groups differ from the whole batch: float32 sums may differ in the last bits
            assert [lp[0] for lp in a[3]] == pytest.approx([lp[0] for lp in b[3]], abs=1e-4)
    assert max(log) == depth  # groups really overlapped, up to the depth
    stats = llm.stats()
    assert stats["num_free_blocks"] == stats["num_total_blocks"] and not llm.engine._inflight
    assert stats["prefix_cache_hit_tokens"] > 0
    if setting == "preemption":
        assert stats["num_preemptions"] > 0


@pytest.mark.parametrize("depth", [2, 3])
@pytest.mark.parametrize("setting", list(SETTINGS))
def test_async_microbatch_outputs_equal_sync(reference_params, sync_outputs, depth_llm, setting, depth):  # noqa: F811
    """Async scheduling with micro-batches: once P groups are in flight, the oldest group's
    draw is queued and its next step submitted (pending rows) before it is collected."""
    kw = {**dict(block_size=8, num_kv_blocks=64), **SETTINGS[setting]}
    want = sync_outputs(setting)
    llm, log = depth_llm(depth, async_scheduling=True, **kw)
    assert llm.engine.async_scheduling
    got = outputs(llm, reference_params)
    for i, (a, b) in enumerate(zip(got, want)):
        assert a[:3] == b[:3], f"{setting}: request {i} differs"
        if b[3] is not None:
            assert [lp[0] for lp in a[3]] == pytest.approx([lp[0] for lp in b[3]], abs=1e-4)
    runner = llm.engine.runner
    assert runner.pending_rows > 0 and runner.settled > 0  # groups really continued early
    assert max(log) == depth
    stats = llm.stats()
    assert stats["num_free_blocks"] == stats["num_total_blocks"] and not llm.engine._inflight
    assert not runner.tickets
    if setting == "preemption":
        assert stats["num_preemptions"] > 0


@pytest.mark.parametrize("depth", [2, 3])
def test_async_microbatch_redone_rows_rewind_the_next_step_of_their_group(depth_llm, monkeypatch, depth):
    """The sampler's redo (rows the candidate path could not settle) changes ids that the
    group's next step, submitted before the collect, already used as pending inputs: those
    requests are rewound and still get the synchronous loop's tokens."""
    from infer_cluster.worker.sampling import ops as sampling_ops
    from infer_cluster.worker.sched.scheduler import Scheduler

    kw = dict(block_size=8, num_kv_blocks=64)
    params = unresolved_params()
    monkeypatch.setattr(sampling_ops, "TOP_P_CANDIDATES", 2)
    monkeypatch.setattr(sampling_ops, "TOP_K_TIE_MARGIN", 0)  # every top-k row is flagged
    want = outputs(LLM("tiny-random", async_scheduling=False, **kw), params)
    rewinds = []
    real_rewind = Scheduler.rewind
    monkeypatch.setattr(Scheduler, "rewind", lambda self, rid: (rewinds.append(rid), real_rewind(self, rid)))
    llm, _ = depth_llm(depth, async_scheduling=True, **kw)
    got = outputs(llm, params)
    for i, (a, b) in enumerate(zip(got, want)):
        assert a[:3] == b[:3], f"request {i % len(params)} differs"
        assert len(a[0]) == 10
    assert rewinds and llm.engine.runner.pending_rows > 0  # the rare path really ran
    stats = llm.stats()
    assert stats["num_free_blocks"] == stats["num_total_blocks"] and not llm.engine._inflight


def test_async_microbatch_steps_are_freed_without_a_gc_pass(depth_llm):
    """A collected step (its logits and draw on the device) must go when the engine drops it:
    a reference cycle would keep device memory until the cyclic GC runs (an OOM on GPUs)."""
    llm, _ = depth_llm(2, async_scheduling=True, block_size=8, num_kv_blocks=64)
    gc.collect()
    gc.disable()
    try:
        # Steps alive before this engine ran are other engines' (a parallel test worker keeps
        # earlier tests' session engines, and an idle engine holds its last step): held here,
        # so that no step made below can take one's id.
        others = [o for o in gc.get_objects() if type(o) in (LaunchedStep, SubmittedStep)]
        llm.generate(PROMPTS, greedy(12), use_tqdm=False)
        assert llm.engine.runner.pending_rows > 0
        left = [o for o in gc.get_objects() if type(o) in (LaunchedStep, SubmittedStep)
                and not any(o is other for other in others)]
    finally:
        gc.enable()
    assert left == []


def test_async_microbatch_abort_and_failure_end_every_request_once(depth_llm, monkeypatch):
    llm, _ = depth_llm(2, async_scheduling=True, block_size=8, num_kv_blocks=64)
    runner = llm.engine.runner
    rids = [llm.add_request(p, greedy(n)) for p, n in zip(PROMPTS[:4], (2, 12, 12, 3))]
    for _ in range(4):
        llm.step()
    assert runner.pending_rows > 0
    in_flight = [s.request_id for st in llm.engine._inflight.steps for s in st.out.requests]
    victim = next(r for r in rids if r in in_flight)
    assert llm.abort(victim)
    real, calls = runner.collect_queued, {"n": 0}

    def flaky(ticket):
        calls["n"] += 1
        if calls["n"] == 2:
            raise RuntimeError("injected failure in collect_queued")
        return real(ticket)

    monkeypatch.setattr(runner, "collect_queued", flaky)
    finals, _ = drain(llm, [r for r in rids if r != victim])
    assert calls["n"] >= 2  # the failure was injected with groups in flight
    assert {rid: len(f) for rid, f in finals.items()} == {r: 1 for r in rids if r != victim}
    assert any(f[0].finish_reason == "error" for f in finals.values())
    stats = llm.stats()
    assert stats["num_free_blocks"] == stats["num_total_blocks"] and not llm.engine._inflight
    assert not runner.tickets


def test_finish_and_abort_while_other_groups_are_in_flight(depth_llm):
    kw = dict(block_size=8, num_kv_blocks=64)
    ref = LLM("tiny-random", **kw)
    lengths = (3, 15, 15, 6)
    want = [o.token_ids for o in ref.generate(PROMPTS[:4], [greedy(n) for n in lengths], use_tqdm=False)]
    llm, log = depth_llm(2, **kw)
    rids = [llm.add_request(p, greedy(n)) for p, n in zip(PROMPTS[:4], lengths)]
    got, early = {rid: [] for rid in rids}, {}
    for _ in range(7):
        for d in llm.step():
            got[d.request_id] += d.token_ids
            if d.finished:
                early[d.request_id] = d
    assert rids[0] in early and rids[1] not in early  # one ended while others were in flight
    assert len(llm.engine._inflight) == 1 and max(log) == 2
    in_flight = {s.request_id for s in llm.engine._inflight.steps[0].out.requests}
    assert rids[1] in in_flight  # aborted while its group is in flight
    assert llm.abort(rids[1])
    finals, tokens = drain(llm, [r for r in rids if r not in early])
    assert all(len(f) == 1 for f in finals.values())
    finals.update({rid: [d] for rid, d in early.items()})
    assert finals[rids[1]][0].finish_reason == "abort"
    for i in (0, 2, 3):
        assert got[rids[i]] + tokens.get(rids[i], []) == want[i]
        assert finals[rids[i]][0].finish_reason == "length"
    assert in_flight and in_flight != set(rids) - set(early)  # the batch really was split
    stats = llm.stats()
    assert stats["num_free_blocks"] == stats["num_total_blocks"] and not llm.engine._inflight


@pytest.mark.parametrize("where", ["submit", "collect"])
def test_failure_with_groups_in_flight_ends_every_request_once(depth_llm, monkeypatch, where):
    llm, _ = depth_llm(2, block_size=8, num_kv_blocks=64)
    runner = llm.engine.runner
    rids = [llm.add_request(p, greedy(n)) for p, n in zip(PROMPTS[:4], (2, 12, 12, 3))]
    real, calls = getattr(runner, where), {"n": 0}

    def flaky(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 4:
            assert llm.engine._inflight  # another group is in flight: its requests end too
            raise RuntimeError(f"injected failure in {where}")
        return real(*args, **kwargs)

    monkeypatch.setattr(runner, where, flaky)
    finals, _ = drain(llm, rids)
    assert {rid: len(f) for rid, f in finals.items()} == {rid: 1 for rid in rids}
    assert any(f[0].finish_reason == "error" for f in finals.values())
    assert not runner.tickets  # the abandoned group's logits were taken (discard)
    stats = llm.stats()
    assert stats["num_free_blocks"] == stats["num_total_blocks"] and not llm.engine._inflight
    out = llm.generate([[1, 2, 3]], greedy(4), use_tqdm=False)[0]
    assert out.finish_reason == "length" and len(out.token_ids) == 4
