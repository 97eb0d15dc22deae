"""Async scheduling (step n+1 launched before step n's ids reach the host) gives the same
outputs as the synchronous loop: every finish rule, stop strings, seeded sampling, penalties,
n-gram bans, logprobs, prefix-cache hits, chunked prefill and preemption; aborts and failures
while a step is in flight end every request exactly once and free every block."""

import pytest

from infer_cluster.protocol import SamplingParams
from infer_cluster.worker import LLM
from infer_cluster.worker.runner.context import DynamicContext


def greedy(n, **kw):
    return SamplingParams(temperature=0, max_tokens=n, ignore_eos=True, **kw)


PROMPTS = [[5, 6, 7], [8, 9, 10, 11, 12] * 7, [13] * 40, [5, 6, 7, 20, 21], [30, 31], [40] * 17,
           [8, 9, 10, 11, 12] * 7 + [3, 4], [50, 51, 52, 53]]


def mixed_params(stop_tok: int, stop_text: str) -> list[SamplingParams]:
    return [
        greedy(1),
        greedy(9, stop_token_ids=[stop_tok]),                        # stop token (the EOS rule)
        SamplingParams(temperature=0, max_tokens=12, ignore_eos=False, stop=[stop_text]),
        SamplingParams(temperature=0.8, top_p=0.9, top_k=20, max_tokens=10, seed=7, ignore_eos=True),
        greedy(11, repetition_penalty=1.3, frequency_penalty=0.5, presence_penalty=0.3),
        greedy(10, no_repeat_ngram_size=2),
        greedy(8, stop_token_ids=[stop_tok], min_tokens=6),
        SamplingParams(temperature=1.0, max_tokens=7, seed=3, logprobs=3, ignore_eos=True),
    ]


SETTINGS = {
    "defaults": dict(),
    "chunked_prefill": dict(max_num_batched_tokens=24),
    "preemption": dict(num_kv_blocks=9, max_num_batched_tokens=64),
}


def outputs(llm, params):
    # twice: the second round hits the prefix cache
    return [(o.token_ids, o.finish_reason, o.text, o.logprobs)
            for _ in range(2) for o in llm.generate(PROMPTS, params, use_tqdm=False)]


@pytest.fixture(scope="module")
def reference_params():
    ref = LLM("tiny-random", block_size=16, num_kv_blocks=64).generate(
        PROMPTS[1], greedy(12), use_tqdm=False)[0]
    return mixed_params(ref.token_ids[4], ref.text[2:5] or ref.text)


def pending_rows_spy(monkeypatch) -> list[int]:
    """Records, for every step a runner prepares, how many rows took their input id from the
    previous step's draw on the device (async scheduling's pending tokens)."""
    counts = []
    real = DynamicContext.prepare

    def spy(self, out, prev_ids=None, prev_rows=(), upload=None, row_span=None):
        counts.append(len(prev_rows))
        return real(self, out, prev_ids, prev_rows, upload, row_span)

    monkeypatch.setattr(DynamicContext, "prepare", spy)
    return counts


@pytest.mark.parametrize("setting", list(SETTINGS))
def test_async_outputs_equal_sync(reference_params, setting, monkeypatch):
    kw = {**dict(block_size=8, num_kv_blocks=64), **SETTINGS[setting]}
    sync = LLM("tiny-random", async_scheduling=False, **kw)
    want = outputs(sync, reference_params)
    assert sync.stats()["num_free_blocks"] == sync.stats()["num_total_blocks"]

    filled = pending_rows_spy(monkeypatch)
    llm = LLM("tiny-random", async_scheduling=True, **kw)
    assert llm.engine.async_scheduling and not sync.engine.async_scheduling
    got = outputs(llm, reference_params)
    for i, (a, b) in enumerate(zip(got, want)):
        assert a[:3] == b[:3], f"{setting}: request {i} differs"
        if b[3] is not None:
            # Values to float32 rounding: a step whose draw waits for the step before (the
            # n-gram row) keeps the next schedule from preempting, so under preemption the two
            # engines can batch a row's forward with different rows.
            assert [lp[0] for lp in a[3]] == pytest.approx([lp[0] for lp in b[3]], abs=1e-5)
            assert a[3][0][1].keys() == b[3][0][1].keys()
    assert {o[1] for o in want} >= {"length", "stop"}
    assert sum(filled) > 0  # pending tokens really came from the previous draw on the device
    stats = llm.stats()
    assert stats["num_free_blocks"] == stats["num_total_blocks"]
    assert stats["prefix_cache_hit_tokens"] == sync.stats()["prefix_cache_hit_tokens"] > 0
    if setting == "preemption":
        assert stats["num_preemptions"] > 0


def drain(llm, rids, max_steps=300):
    finals, tokens = {rid: [] for rid in rids}, {rid: [] for rid in rids}
    for _ in range(max_steps):
        for d in llm.step():
            if d.request_id in finals:
                assert not finals[d.request_id], f"{d.request_id} got a delta after its final"
                tokens[d.request_id] += d.token_ids
                if d.finished:
                    finals[d.request_id].append(d)
        if not llm.has_unfinished_requests():
            break
    return finals, tokens


def test_abort_mid_stream_and_in_flight_state():
    llm = LLM("tiny-random", block_size=8, num_kv_blocks=64, async_scheduling=True)
    ref = LLM("tiny-random", block_size=8, num_kv_blocks=64, async_scheduling=False)
    want = [o.token_ids for o in ref.generate(PROMPTS[:3], greedy(15), use_tqdm=False)]
    rids = [llm.add_request(p, greedy(15)) for p in PROMPTS[:3]]
    first = llm.step()
    assert first == []  # the first step's ids are collected by the next step
    assert llm.engine._inflight and llm.has_unfinished_requests()
    got = {rid: [] for rid in rids}
    for _ in range(3):
        for d in llm.step():
            got[d.request_id] += d.token_ids
    assert llm.abort(rids[1])  # its next token is being drawn right now
    finals, tokens = drain(llm, rids)
    assert all(len(f) == 1 for f in finals.values())
    assert finals[rids[1]][0].finish_reason == "abort"
    for i in (0, 2):
        assert got[rids[i]] + tokens[rids[i]] == want[i]
    assert len(got[rids[1]]) + len(tokens[rids[1]]) < 15
    stats = llm.stats()
    assert stats["num_free_blocks"] == stats["num_total_blocks"] and not llm.engine._inflight


@pytest.mark.parametrize("where", ["launch", "collect"])
def test_failure_with_a_step_in_flight_ends_every_request_once(monkeypatch, where):
    llm = LLM("tiny-random", block_size=8, num_kv_blocks=64, async_scheduling=True)
    rids = [llm.add_request(p, greedy(n)) for p, n in zip(PROMPTS[:4], (2, 12, 12, 3))]
    obj, name = (llm.engine.runner, "execute") if where == "launch" else (llm.engine.sampler, "finish")
    real, calls = getattr(obj, name), {"n": 0}

    def flaky(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 3:  # step 2 is in flight: both steps' requests must end
            assert llm.engine._inflight
            raise RuntimeError(f"injected failure in {name}")
        return real(*args, **kwargs)

    monkeypatch.setattr(obj, name, flaky)
    finals, _ = drain(llm, rids)
    assert {rid: len(f) for rid, f in finals.items()} == {rid: 1 for rid in rids}
    assert any(f[0].finish_reason == "error" for f in finals.values())
    stats = llm.stats()
    assert stats["num_free_blocks"] == stats["num_total_blocks"] and not llm.engine._inflight
    out = llm.generate([[1, 2, 3]], greedy(4), use_tqdm=False)[0]
    assert out.finish_reason == "length" and len(out.token_ids) == 4


def test_reset_cache_settles_the_step_in_flight():
    kw = dict(block_size=8, num_kv_blocks=64, max_model_len=128)
    llm = LLM("tiny-random", async_scheduling=True, **kw)
    ref = LLM("tiny-random", async_scheduling=False, **kw)
    want = ref.generate(PROMPTS[:2], greedy(10), use_tqdm=False)
    rids = [llm.add_request(p, greedy(10)) for p in PROMPTS[:2]]
    got = {rid: [] for rid in rids}
    for _ in range(3):
        for d in llm.step():
            got[d.request_id] += d.token_ids
    assert llm.engine._inflight
    llm.engine.reset_cache(num_kv_blocks=48)
    assert not llm.engine._inflight
    _, tokens = drain(llm, rids)
    assert [got[r] + tokens[r] for r in rids] == [o.token_ids for o in want]


def unresolved_params() -> list[SamplingParams]:
    # Hot, flat distributions: a top-p set wider than a few candidates, so the candidate path
    # flags its rows and `Sampler.finish` redoes them (changing many ids).
    base = dict(temperature=3.0, max_tokens=10, ignore_eos=True)
    return [
        SamplingParams(top_p=0.95, seed=11, **base),
        SamplingParams(top_p=0.9, seed=12, repetition_penalty=1.2, presence_penalty=0.4, **base),
        SamplingParams(top_p=0.97, seed=13, logprobs=2, **base),
        SamplingParams(top_k=20, top_p=0.99, seed=14, frequency_penalty=0.3, **base),
        SamplingParams(top_k=30, seed=15, **base),
        greedy(10),
        SamplingParams(top_p=0.9, seed=16, min_p=0.05, **base),
        SamplingParams(top_p=0.95, seed=17, **base),
    ]


@pytest.mark.parametrize("setting", list(SETTINGS))
def test_unresolved_rows_are_redone_and_rewound(monkeypatch, setting):
    """Rows the candidate path cannot settle give the same tokens (seeded) with few candidates
    (most rows redone) as with the default count, in sync and async mode; async mode rewinds
    the requests whose pending input changed and still gives every request its full output."""
    from infer_cluster.worker.sampling import ops as sampling_ops
    from infer_cluster.worker.sched.scheduler import Scheduler

    kw = {**dict(block_size=8, num_kv_blocks=64), **SETTINGS[setting]}
    params = unresolved_params()
    want = outputs(LLM("tiny-random", async_scheduling=False, **kw), params)
    monkeypatch.setattr(sampling_ops, "TOP_P_CANDIDATES", 2)
    monkeypatch.setattr(sampling_ops, "TOP_K_TIE_MARGIN", 0)  # every top-k row is flagged
    rewinds = []
    real_rewind = Scheduler.rewind
    monkeypatch.setattr(Scheduler, "rewind", lambda self, rid: (rewinds.append(rid), real_rewind(self, rid)))
    sync = outputs(LLM("tiny-random", async_scheduling=False, **kw), params)
    llm = LLM("tiny-random", async_scheduling=True, **kw)
    got = outputs(llm, params)
    for i, (a, b, c) in enumerate(zip(got, sync, want)):
        assert a[:3] == b[:3] == c[:3], f"request {i % len(params)} differs"
        assert len(a[0]) == 10
        if c[3] is not None:  # a rewound position is recomputed in another batch: last bits
            assert b[3] == c[3]
            assert [lp[0] for lp in a[3]] == pytest.approx([lp[0] for lp in c[3]], abs=1e-5)
            assert [lp[1].keys() for lp in a[3]] == [lp[1].keys() for lp in c[3]]
    assert rewinds  # the rare path really ran
    stats = llm.stats()
    assert stats["num_free_blocks"] == stats["num_total_blocks"] and not llm.engine._inflight
