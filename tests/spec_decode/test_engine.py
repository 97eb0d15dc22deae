"""Speculative decoding in the engine on tiny-random: outputs equal speculation off token for
token (text, finish reasons, logprobs) for greedy and seeded requests with every finish rule,
stop strings, min_tokens, ignore_eos, penalties, n-gram bans and logprobs, with chunked
prefill, prefix-cache hits and preemption; proposals are really accepted; every block comes
back; and unseeded sampling keeps its distribution (chi-square, two samples). Structured
requests: test_structured.py."""

import pytest

from infer_cluster.protocol import SamplingParams
from infer_cluster.worker import LLM
from infer_cluster.worker.spec_decode.decoder import SpecDecoder

# adaptive off: every step where proposals exist speculates, whatever this machine measures
SPEC = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1, "prompt_lookup_max": 3,
        "adaptive": False}

# Repeating prompts: tiny-random's greedy output soon cycles too, so lookups find proposals.
PROMPTS = [[5, 6, 7, 8, 9, 10, 11, 12] * 4, [13, 14, 15] * 10, [20, 21, 22, 23],
           [30, 31, 32, 33, 34] * 7 + [3, 4], [40] * 17, [50, 51, 52, 53, 54, 55] * 3,
           [8, 9, 10, 11, 12] * 7, [60, 61]]


def greedy(n, **kw):
    return SamplingParams(temperature=0, max_tokens=n, ignore_eos=True, **kw)


def repeated_text(out, tokenizer) -> str:
    """Three times the text of a token that `out` repeats 4 times in a row (after its 8th):
    a stop string that a burst of accepted proposals completes."""
    ids = out.token_ids
    for i in range(8, len(ids) - 3):
        piece = tokenizer.decode([ids[i]])
        if len(set(ids[i:i + 4])) == 1 and piece.isprintable() and piece.strip():
            return piece * 3
    raise AssertionError(f"no repeated printable token in {ids}")


def mixed_params(refs, tokenizer) -> list[SamplingParams]:
    """Request i's params; `refs[i]`: its greedy output (stop tokens and strings are taken from
    well inside it, where proposals are accepted)."""
    return [
        greedy(40),
        greedy(30, stop_token_ids=[refs[1].token_ids[9]]),
        SamplingParams(temperature=0, max_tokens=30, ignore_eos=False, stop=[repeated_text(refs[2], tokenizer)]),
        SamplingParams(temperature=0.8, top_p=0.9, top_k=20, max_tokens=25, seed=7, ignore_eos=True),
        greedy(24, repetition_penalty=1.3, frequency_penalty=0.5, presence_penalty=0.3),
        greedy(20, no_repeat_ngram_size=3),
        greedy(30, stop_token_ids=[refs[6].token_ids[3]], min_tokens=12),
        SamplingParams(temperature=1.0, max_tokens=18, seed=3, logprobs=3, ignore_eos=True),
    ]


SETTINGS = {
    "defaults": dict(),
    "chunked_prefill": dict(max_num_batched_tokens=24),
    "preemption": dict(num_kv_blocks=14, max_num_batched_tokens=64),
    "no_prefix_cache": dict(enable_prefix_caching=False),
    # preempted requests are swapped to the host tier (8 KiB blocks: about 130 host blocks)
    "host_tier": dict(num_kv_blocks=14, max_num_batched_tokens=64, kv_offload_gib=0.001),
}


def outputs(llm, params):
    # twice: the second round hits the prefix cache
    return [(o.token_ids, o.finish_reason, o.text, o.logprobs)
            for _ in range(2) for o in llm.generate(PROMPTS, params, use_tqdm=False)]


@pytest.fixture(scope="module")
def reference_params():
    llm = LLM("tiny-random", block_size=16, num_kv_blocks=64)
    return mixed_params(llm.generate(PROMPTS, greedy(40), use_tqdm=False), llm.tokenizer)


def assert_same(got, want, label):
    for i, (a, b) in enumerate(zip(got, want)):
        assert a[:3] == b[:3], f"{label}: request {i} differs"
        if b[3] is None:
            assert a[3] is None
        else:
            assert [lp[0] for lp in a[3]] == pytest.approx([lp[0] for lp in b[3]], abs=1e-4)
            assert [list(lp[1]) for lp in a[3]] == [list(lp[1]) for lp in b[3]]
    assert len(got) == len(want)


@pytest.mark.parametrize("setting", list(SETTINGS))
def test_outputs_equal_speculation_off(reference_params, setting):
    kw = {**dict(block_size=8, num_kv_blocks=64), **SETTINGS[setting]}
    want = outputs(LLM("tiny-random", **kw), reference_params)
    llm = LLM("tiny-random", speculative_config=SPEC, **kw)
    assert not llm.engine.async_scheduling
    got = outputs(llm, reference_params)
    assert_same(got, want, setting)
    assert [o[1] for o in want[:8]].count("stop") == 3
    stats = llm.stats()
    assert stats["num_spec_accepted_tokens"] > 0.2 * stats["num_spec_draft_tokens"] > 0
    assert stats["num_free_blocks"] == stats["num_total_blocks"]
    if setting in ("preemption", "host_tier"):
        assert stats["num_preemptions"] > 0
        assert (stats["num_swapped_out"] > 0) == (setting == "host_tier")
    else:
        assert stats["prefix_cache_hit_tokens"] > 0 or setting == "no_prefix_cache"


@pytest.mark.parametrize("setting", list(SETTINGS))
def test_a_steps_batched_tokens_are_its_rows_tokens(reference_params, setting, monkeypatch):
    # SpecDecoder.start_step judges a step that verifies nothing decode-only from
    # num_batched_tokens == rows: every layout must count exactly the tokens of its rows
    seen = []
    real = SpecDecoder.start_step

    def counted(self, out, verify):
        seen.append((out.num_batched_tokens, sum(len(s.token_ids) for s in out.requests)))
        return real(self, out, verify)

    monkeypatch.setattr(SpecDecoder, "start_step", counted)
    kw = {**dict(block_size=8, num_kv_blocks=64), **SETTINGS[setting]}
    outputs(LLM("tiny-random", speculative_config={**SPEC, "adaptive": True}, **kw), reference_params)
    assert len(seen) > 20 and all(a == b for a, b in seen), [x for x in seen if x[0] != x[1]][:3]
    assert any(b > 8 for _, b in seen)  # prompt chunks were among them


def test_seeded_requests_reproduce_alone_or_in_a_batch(reference_params):
    seeded = reference_params[3]
    llm = LLM("tiny-random", block_size=8, num_kv_blocks=64, speculative_config=SPEC)
    alone = llm.generate([PROMPTS[3]], seeded, use_tqdm=False)[0].token_ids
    batch = llm.generate(PROMPTS, [seeded] * len(PROMPTS), use_tqdm=False)
    assert batch[3].token_ids == alone
    assert llm.generate([PROMPTS[3]], seeded, use_tqdm=False)[0].token_ids == alone
    assert llm.stats()["num_spec_accepted_tokens"] > 0


def run_steps(llm, prompt, params):
    """Drive the engine step by step (text inline, stop strings apply in the same step)."""
    llm.add_request(prompt, params)
    tokens, text, finish, sizes = [], "", None, []
    while llm.has_unfinished_requests():
        for d in llm.step():
            tokens += d.token_ids
            text += d.text
            sizes.append(len(d.token_ids))
            finish = d.finish_reason or finish
    return tokens, text, finish, sizes


def test_a_stop_string_inside_an_accepted_burst(reference_params):
    params = reference_params[2]
    off = run_steps(LLM("tiny-random", block_size=8, num_kv_blocks=64), PROMPTS[2], params)
    llm = LLM("tiny-random", block_size=8, num_kv_blocks=64, speculative_config=SPEC)
    on = run_steps(llm, PROMPTS[2], params)
    assert on[:3] == off[:3] and on[2] == "stop"
    assert max(on[3]) > 1  # tokens came in bursts
    # the burst that completed the stop string had tokens after it: the text stage dropped them
    assert llm.stats()["num_generated_tokens"] > len(on[0])


# chi2.ppf(0.999, df) for df = 1..30 (standard tables)
CHI2_CRIT_999 = [None, 10.828, 13.816, 16.266, 18.467, 20.515, 22.458, 24.322, 26.124, 27.877,
                 29.588, 31.264, 32.909, 34.528, 36.123, 37.697, 39.252, 40.790, 42.312, 43.820,
                 45.315, 46.797, 48.268, 49.728, 51.179, 52.620, 54.052, 55.476, 56.892, 58.301,
                 59.703]
NUM_DRAWS = 512
SAMPLED = SamplingParams(temperature=0.6, top_k=4, max_tokens=4, ignore_eos=True)
# PROMPTS[0] and the start of its greedy output: proposals (172 ...) are kept about half the time
CHI2_PROMPT = PROMPTS[0] + [56, 172, 172, 172, 172]


def two_sample_chi_square(a: list[int], b: list[int]) -> tuple[float, int]:
    """Pearson's statistic that samples `a` and `b` come from one distribution, and its degrees
    of freedom; values with fewer than 20 draws together are pooled."""
    from collections import Counter
    ca, cb = Counter(a), Counter(b)
    cells, rest = [], [0, 0]
    for v in set(ca) | set(cb):
        if ca[v] + cb[v] >= 20:
            cells.append([ca[v], cb[v]])
        else:
            rest[0] += ca[v]
            rest[1] += cb[v]
    if sum(rest):
        cells.append(rest)
    na, nb = len(a), len(b)
    stat = 0.0
    for x, y in cells:
        total = x + y
        for observed, n in ((x, na), (y, nb)):
            expected = total * n / (na + nb)
            stat += (observed - expected) ** 2 / expected
    return stat, len(cells) - 1


@pytest.fixture(scope="module")
def unseeded_off():
    """Token t of NUM_DRAWS unseeded requests, speculation off (t = 1..3: verified positions)."""
    llm = LLM("tiny-random", block_size=8, num_kv_blocks=512)
    outs = llm.generate([CHI2_PROMPT] * NUM_DRAWS, SAMPLED, use_tqdm=False)
    return [[o.token_ids[t] for o in outs] for t in range(1, 4)]


def unseeded_on(spec=SPEC):
    llm = LLM("tiny-random", block_size=8, num_kv_blocks=512, speculative_config=spec)
    outs = llm.generate([CHI2_PROMPT] * NUM_DRAWS, SAMPLED, use_tqdm=False)
    stats = llm.stats()
    return [[o.token_ids[t] for o in outs] for t in range(1, 4)], stats


def test_unseeded_sampling_keeps_its_distribution(unseeded_off):
    on, stats = unseeded_on()
    assert stats["num_spec_accepted_tokens"] > NUM_DRAWS // 5  # many draws went through bursts
    assert stats["num_spec_accepted_tokens"] < 0.8 * stats["num_spec_draft_tokens"]  # many rejected
    for t, (a, b) in enumerate(zip(on, unseeded_off), start=1):
        stat, df = two_sample_chi_square(a, b)
        assert 1 <= df <= 30 and stat < CHI2_CRIT_999[df], f"token {t}: chi2 {stat:.1f}, df {df}"


def test_the_distribution_test_catches_a_broken_acceptance_rule(unseeded_off, monkeypatch):
    """Keep every proposal: the test above must fail."""
    from infer_cluster.worker.spec_decode import verify
    monkeypatch.setattr(verify, "num_accepted", lambda proposals, draws: len(proposals))
    on, _ = unseeded_on()
    worst = max(stat / CHI2_CRIT_999[df] for stat, df in
                (two_sample_chi_square(a, b) for a, b in zip(on, unseeded_off)))
    assert worst > 1


@pytest.mark.parametrize("obj,name", [("scheduler", "update_verified"), ("runner", "execute")])
def test_a_failed_verify_step_ends_every_request_once(monkeypatch, obj, name):
    llm = LLM("tiny-random", block_size=8, num_kv_blocks=64, speculative_config=SPEC)
    rids = [llm.add_request(p, greedy(30)) for p in PROMPTS[:3]]
    finals = {rid: 0 for rid in rids}

    def step():
        for d in llm.step():
            finals[d.request_id] += d.finish_reason is not None

    while llm.stats()["num_spec_draft_tokens"] == 0:  # until verify steps carry proposals
        step()
    target = getattr(llm.engine, obj)
    real = getattr(target, name)
    calls = []

    def fail_once(*args, **kwargs):
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError(f"injected failure in {name}")
        return real(*args, **kwargs)

    monkeypatch.setattr(target, name, fail_once)
    while llm.has_unfinished_requests():
        step()
    assert finals == {rid: 1 for rid in rids} and calls
    stats = llm.stats()
    assert stats["num_free_blocks"] == stats["num_total_blocks"]
    out = llm.generate([PROMPTS[1]], greedy(12), use_tqdm=False)[0]  # it keeps serving
    assert out.finish_reason == "length" and len(out.token_ids) == 12


def test_a_resumed_request_continues_as_without_speculation(reference_params):
    """Failover: a request resumed from the tokens a lost replica delivered (greedy and seeded)
    continues with the same tokens as the full run without speculation."""
    off = LLM("tiny-random", block_size=8, num_kv_blocks=64)
    llm = LLM("tiny-random", block_size=8, num_kv_blocks=64, speculative_config=SPEC)
    for prompt, params in ((PROMPTS[0], greedy(30)), (PROMPTS[3], reference_params[3])):
        full = off.generate([prompt], params, use_tqdm=False)[0].token_ids
        rid = llm.engine.add_request(prompt, params, resume_token_ids=full[:7])
        tokens = []
        while llm.has_unfinished_requests():
            for d in llm.step():
                tokens += d.token_ids if d.request_id == rid else []
        assert tokens == full[7:]
    assert llm.stats()["num_spec_accepted_tokens"] > 0


def test_a_kv_pool_resize_while_speculating():
    params = greedy(30)
    kw = dict(block_size=8, num_kv_blocks=64, max_model_len=128)  # a pool of 16 blocks is legal
    want = [o.token_ids for o in LLM("tiny-random", **kw).generate(PROMPTS, params, use_tqdm=False)]
    llm = LLM("tiny-random", speculative_config=SPEC, **kw)
    ids = [llm.add_request(p, params, request_id=f"r{i}") for i, p in enumerate(PROMPTS)]
    tokens = {rid: [] for rid in ids}
    for n in range(400):
        if not llm.has_unfinished_requests():
            break
        for d in llm.step():
            tokens[d.request_id] += d.token_ids
        if n == 6:
            llm.reset_cache(num_kv_blocks=24)  # some keep their KV, the rest are recomputed
            llm.engine.allocator.check_invariants()
        if n == 12:
            llm.reset_cache(num_kv_blocks=96)
    assert [tokens[rid] for rid in ids] == want
    stats = llm.stats()
    assert stats["num_preemptions"] > 0 and stats["num_spec_accepted_tokens"] > 0
    assert stats["num_free_blocks"] == stats["num_total_blocks"] == 96


def test_disable_by_batch_size_turns_proposals_off_while_the_batch_is_large():
    """`disable_by_batch_size` N: no proposals in a step where N or more requests run. With N
    above the batch every step proposes, with N = 1 none does; at N = 4 the 8 requests (of
    different lengths) run without proposals until fewer than 4 remain. The tokens never change."""
    kw = dict(block_size=8, num_kv_blocks=128)
    params = [greedy(12 + 6 * i) for i in range(len(PROMPTS))]
    want = [o.token_ids for o in LLM("tiny-random", **kw).generate(PROMPTS, params, use_tqdm=False)]
    drafted = {}
    for limit in (None, 64, 4, 1):
        llm = LLM("tiny-random", speculative_config={**SPEC, "disable_by_batch_size": limit}, **kw)
        assert [o.token_ids for o in llm.generate(PROMPTS, params, use_tqdm=False)] == want, limit
        drafted[limit] = llm.stats()["num_spec_draft_tokens"]
    assert drafted[None] == drafted[64] > drafted[4] > drafted[1] == 0, drafted



@pytest.mark.parametrize("method", ["ngram", "draft_model"])
def test_async_scheduling_runs_the_steps_that_do_not_speculate(method, monkeypatch, caplog):
    """With async scheduling, a step where `disable_by_batch_size` turns speculation off is an
    ordinary async step (its inputs read from the step before, on the device), and one with
    proposals is a verify step, collected before anything is scheduled after it; the tokens
    never change. The 8 requests (of
    different lengths) start without proposals (limit 4) and speculate once fewer than 4 run;
    the draft model catches up on the tokens the async steps made. The longest request bans
    repeated n-grams (a row whose draw needs its last id on the host): in an async step its draw
    is deferred, in a verify step it is not."""
    from tests.engine.test_async_scheduling import pending_rows_spy
    kw = dict(block_size=8, num_kv_blocks=128)
    params = [greedy(12 + 6 * i) for i in range(len(PROMPTS) - 1)] + [greedy(60, no_repeat_ngram_size=3)]
    want = [o.token_ids for o in LLM("tiny-random", **kw).generate(PROMPTS, params, use_tqdm=False)]
    pending = pending_rows_spy(monkeypatch)
    spec = ({**SPEC, "disable_by_batch_size": 4} if method == "ngram" else
            {"method": "draft_model", "model": "tiny-random", "num_speculative_tokens": 4,
             "disable_by_batch_size": 4, "adaptive": False})
    llm = LLM("tiny-random", speculative_config=spec, async_scheduling=True, **kw)
    assert llm.engine.async_scheduling
    with caplog.at_level("ERROR"):
        assert [o.token_ids for o in llm.generate(PROMPTS, params, use_tqdm=False)] == want
    assert "engine step failed" not in caplog.text
    stats = llm.stats()
    assert sum(pending) > 0  # async steps: pending inputs from the device
    assert stats["num_spec_accepted_tokens"] > 0 and stats["num_spec_draft_tokens"] > 0
    if method == "draft_model":  # the draft has the target's weights and caught up exactly; it
        # only misses where the n-gram ban moves the target off its argmax
        assert stats["num_spec_accepted_tokens"] >= 0.9 * stats["num_spec_draft_tokens"]
    assert stats["num_free_blocks"] == stats["num_total_blocks"]


def test_an_abort_while_a_verify_step_is_in_flight_loses_nothing():
    """With async scheduling a verify step stays in flight between `step()` calls. A request
    aborted then ends with one final "abort" delta; the others keep their tokens, and every
    block comes back."""
    abort_mid_flight(dict(block_size=8, num_kv_blocks=128), greedy(40), lambda engine: engine._inflight.holds_verify)


def abort_mid_flight(kw: dict, params, ready) -> None:
    """Three requests on a speculating async engine (`kw`); once `ready(engine)` after a step,
    the first is aborted: it ends with one "abort" final and a prefix of its tokens, the others
    with speculation off's tokens, and every block comes back."""
    want = [o.token_ids for o in LLM("tiny-random", **kw).generate(PROMPTS[:3], params, use_tqdm=False)]
    engine = LLM("tiny-random", speculative_config=SPEC, async_scheduling=True, **kw).engine
    ids = [engine.add_request(p, params) for p in PROMPTS[:3]]
    tokens = {rid: [] for rid in ids}
    finals = {}

    def take(deltas):
        for d in deltas:
            tokens[d.request_id] += d.token_ids
            if d.finish_reason is not None:
                assert d.request_id not in finals  # exactly one final delta
                finals[d.request_id] = d.finish_reason

    for _ in range(200):
        take(engine.step())
        if ready(engine):
            break
    assert ready(engine)
    assert engine.abort(ids[0])
    while engine.has_unfinished_requests():
        take(engine.step())
    assert finals == {ids[0]: "abort", ids[1]: "length", ids[2]: "length"}
    assert [tokens[rid] for rid in ids[1:]] == want[1:]
    assert tokens[ids[0]] == want[0][:len(tokens[ids[0]])]
    stats = engine.stats()
    assert stats["num_free_blocks"] == stats["num_total_blocks"]


def verify_steps_spy(monkeypatch, measure) -> list:
    """`measure(out)` of every verify step the engine launches (`SpecDecoder.launch`)."""
    from infer_cluster.worker.spec_decode.decoder import SpecDecoder
    seen, real = [], SpecDecoder.launch

    def spy(self, out, *a, **kw):
        seen.append(measure(out))
        return real(self, out, *a, **kw)
    monkeypatch.setattr(SpecDecoder, "launch", spy)
    return seen


def test_a_step_without_proposals_is_an_ordinary_step(monkeypatch):
    """Prompt lookup finds nothing in text that never repeats: the step then runs as an
    ordinary (async) decode step, not as a verify step of one position a row."""
    launched = verify_steps_spy(monkeypatch, lambda out: sum(s.num_spec_tokens for s in out.requests))
    llm = LLM("tiny-random", speculative_config={**SPEC, "prompt_lookup_min": 3}, block_size=8,
              num_kv_blocks=64)
    # distinct ids, and few new tokens: no trigram recurs, so nothing is ever proposed
    out = llm.generate([list(range(40, 80))], greedy(3), use_tqdm=False)[0]
    assert len(out.token_ids) == 3
    assert all(n > 0 for n in launched)
    assert llm.stats()["num_spec_draft_tokens"] == sum(launched)


def test_a_speculating_step_whose_host_tokens_propose_nothing_keeps_the_pipeline(monkeypatch):
    """With async scheduling, a step that would speculate asks prompt lookup about the tokens
    already on the host before waiting for the step in flight. Text that never repeats proposes
    nothing, so its steps stay async (their inputs come from the step before, on the device);
    repeating text still waits, proposes and verifies; the tokens never change."""
    from tests.engine.test_async_scheduling import pending_rows_spy
    kw = dict(block_size=8, num_kv_blocks=64)
    cases = [([list(range(40, 80))], {**SPEC, "prompt_lookup_min": 3}, 3), (PROMPTS[:2], SPEC, 24)]
    for prompts, spec, n in cases:
        want = [o.token_ids for o in LLM("tiny-random", **kw).generate(prompts, greedy(n), use_tqdm=False)]
        pending = pending_rows_spy(monkeypatch)
        llm = LLM("tiny-random", speculative_config=spec, async_scheduling=True, **kw)
        assert [o.token_ids for o in llm.generate(prompts, greedy(n), use_tqdm=False)] == want
        stats = llm.stats()
        if n == 3:  # no trigram recurs: no wait, so the second and third steps read pending inputs
            assert stats["num_spec_draft_tokens"] == 0 and pending == [0, 1, 1], pending
        else:
            assert stats["num_spec_accepted_tokens"] > 0, stats
        monkeypatch.undo()


def test_the_largest_k_verifies_exactly(monkeypatch):
    """k = 32 (the most `speculative_config` takes) at batch 1: the prompt holds every id from 3
    to 399 once, so an output token below 368 finds 32 tokens after it and the verify step has
    33 positions (decode-shaped); the output equals speculation off."""
    proposed = verify_steps_spy(monkeypatch, lambda out: max(s.num_spec_tokens for s in out.requests))
    kw = dict(block_size=8, num_kv_blocks=128)
    prompts = [list(range(3, 400))]
    want = [o.token_ids for o in LLM("tiny-random", **kw).generate(prompts, greedy(48), use_tqdm=False)]
    llm = LLM("tiny-random", speculative_config={**SPEC, "num_speculative_tokens": 32}, **kw)
    assert [o.token_ids for o in llm.generate(prompts, greedy(48), use_tqdm=False)] == want
    assert max(proposed) == 32, proposed
    assert len(llm.stats()["spec_acceptance_per_position"]) == 32
    stats = llm.stats()
    assert stats["num_free_blocks"] == stats["num_total_blocks"]
