"""`SpecGovernor` (speculative_config.adaptive): each step speculates only where this engine
measured verify steps to give more tokens a second than plain decode steps, per batch-size
bucket, re-measuring the other mode now and then; driven here by a simulated clock. And on the
engine: adaptive speculation leaves the tokens as they are and measures both modes."""

import pytest

from infer_cluster.worker import LLM
from infer_cluster.worker.spec_decode.governor import (EXPLORE_BUDGET, EXPLORE_EVERY, EXPLORE_MAX, EXPLORE_STEPS, SETTLE,
                                                       SpecGovernor, bucket)

from tests.spec_decode.test_engine import PROMPTS, SPEC, greedy


def simulate(gov: SpecGovernor, steps: int, batch: int, plain_s: float, verify_s: float,
             tokens: float, t: float = 0.0) -> tuple[list[bool], float]:
    """Run `steps` decode steps of `batch` rows; a plain step takes `plain_s`, a verify step
    `verify_s` and gives each row `tokens`. Returns the decisions and the clock."""
    modes = []
    for _ in range(steps):
        verify = gov.decide(batch)
        gov.start_step(t, batch, verify, decode_only=True)
        if verify:
            gov.verified(tokens)
        modes.append(verify)
        t += verify_s if verify else plain_s
    return modes, t


def test_bucket_is_a_power_of_two_range():
    assert [bucket(b) for b in (1, 2, 3, 4, 7, 8, 255, 256)] == [0, 1, 1, 2, 2, 3, 7, 8]


@pytest.mark.parametrize("tokens,pays", [(3.0, True), (1.5, False)])
def test_takes_the_faster_mode_and_still_measures_the_other(tokens, pays):
    """A verify step costs 2 ms and a plain one 1 ms: with 3 tokens a row speculating pays
    (1.5 tokens a ms against 1), with 1.5 it does not (0.75)."""
    gov = SpecGovernor()
    modes, _ = simulate(gov, 400, 1, plain_s=1e-3, verify_s=2e-3, tokens=tokens)
    late = modes[100:]
    share = sum(late) / len(late)
    if pays:
        assert share > 0.8
    else:
        assert share < 0.2
    assert 0 < share < 1  # the other mode is re-measured now and then
    est = gov.as_dict()[1]
    assert est["plain_s"] == pytest.approx(1e-3) and est["verify_s"] == pytest.approx(2e-3)
    assert est["tokens_per_row"] == pytest.approx(tokens)


def test_follows_a_change_in_acceptance():
    gov = SpecGovernor()
    modes, t = simulate(gov, 200, 1, plain_s=1e-3, verify_s=2e-3, tokens=3.0)
    assert sum(modes[-50:]) > 40
    modes, _ = simulate(gov, 30 * EXPLORE_EVERY, 1, plain_s=1e-3, verify_s=2e-3, tokens=1.2, t=t)
    assert sum(modes[-50:]) < 10


def test_explorations_cost_about_their_budget():
    """Batch 256: a verify step costs three plain ones and gives 1.5 tokens a row (r = 0.5).
    Exploring every 32 decisions would cost ~25% (4 steps of 3x in 32); explorations come every
    EXPLORE_STEPS * (2 - 1) / EXPLORE_BUDGET = 400 decisions instead, so speculation costs about
    EXPLORE_BUDGET against never speculating; a rise in acceptance still shows at the next one."""
    gov = SpecGovernor()
    assert gov.interval(0.5) == gov.interval(2.0) == round(EXPLORE_STEPS / EXPLORE_BUDGET)
    assert gov.interval(1.05) == EXPLORE_EVERY and gov.interval(0.01) == EXPLORE_MAX
    steps, plain_s = 4000, 5e-3
    modes, t = simulate(gov, steps, 256, plain_s=plain_s, verify_s=15e-3, tokens=1.5)
    late = modes[-2000:]
    assert 0 < sum(late) <= EXPLORE_STEPS * (2000 // gov.interval(0.5) + 1)
    tokens = sum(1.5 if m else 1.0 for m in modes)
    assert tokens / t >= (1 - 2 * EXPLORE_BUDGET) * (1.0 / plain_s)
    # acceptance rises (4.5 tokens a row: r = 1.5): the next exploration switches to verify
    modes, _ = simulate(gov, 1500, 256, plain_s=plain_s, verify_s=15e-3, tokens=4.5, t=t)
    assert sum(modes[-1000:]) > 0.95 * 1000


def test_a_bucket_next_to_one_that_could_not_win_does_not_try():
    """Workload A's batch falls through every bucket as requests end. Where the bucket above
    measured verify steps that lose even with every proposal accepted (H200: 43.8 ms against
    6.3 ms at batch 256, k + 1 = 5), the next one starts from its ratio: plain steps, no verify
    steps until its first exploration comes. Where it could win, the next one tries."""
    gov = SpecGovernor(max_tokens=5)
    t = simulate(gov, 200, 256, plain_s=6.3e-3, verify_s=43.8e-3, tokens=1.5)[1]
    r = gov.buckets[bucket(256)].ratio
    modes, t = simulate(gov, 150, 130, plain_s=5.7e-3, verify_s=27.7e-3, tokens=1.5, t=t)
    assert sum(modes) == 0 and gov.as_dict()[128]["plain_s"] == pytest.approx(5.7e-3)
    modes, t = simulate(gov, 100, 64, plain_s=4.4e-3, verify_s=36.7e-3, tokens=1.5, t=t)
    assert sum(modes) == 0  # the prior carries on down
    modes, _ = simulate(gov, gov.interval(r) + 10, 130, plain_s=5.7e-3, verify_s=27.7e-3, tokens=1.5, t=t)
    assert 0 < sum(modes) <= EXPLORE_STEPS  # the exploration measured it
    winner = SpecGovernor()
    t = simulate(winner, 200, 1, plain_s=1e-3, verify_s=1.5e-3, tokens=3.0)[1]
    modes, _ = simulate(winner, 10, 2, plain_s=1e-3, verify_s=1.5e-3, tokens=3.0, t=t)
    assert modes[0]  # tried at once


def test_a_few_unlucky_verify_steps_do_not_prime_a_neighbour():
    """SmolLM2 at batch 8-15 (H200, 41ff583): four verify steps gave 1.0 token a row (r = 0.37)
    though a verify step costs only 2.7 plain ones; the bucket below, primed by that, decoded
    plainly for 544 of 608 decisions while its own verify steps gave 4.3 tokens. Acceptance
    never primes a neighbour: only step times that could not pay at full acceptance do."""
    gov = SpecGovernor(max_tokens=5)
    t = simulate(gov, 60, 8, plain_s=1.06e-3, verify_s=2.83e-3, tokens=1.0)[1]
    modes, _ = simulate(gov, 300, 5, plain_s=1.14e-3, verify_s=2.73e-3, tokens=4.26, t=t)
    assert modes[0]  # tried at once
    assert sum(modes[50:]) > 0.9 * 250


def test_a_falling_batch_loses_little_where_speculation_never_pays():
    """Workload A's shape: 256 requests end one by one, so the batch spends ~100 steps in each
    bucket on its way down; a verify step costs 6 plain ones for 1.6 tokens a row everywhere
    (7 at batch 256 on the H200).
    One bucket tries, the rest start from their neighbour's ratio: >= 0.97 of never speculating."""
    gov = SpecGovernor(max_tokens=5)
    t, tokens, plain_t = 0.0, 0.0, 0.0
    for batch in (256, 200, 130, 100, 64, 40, 20, 10, 5, 3, 1):
        plain_s = 1e-3 + batch * 2e-5
        modes, t2 = simulate(gov, 100, batch, plain_s=plain_s, verify_s=6 * plain_s, tokens=1.6, t=t)
        tokens += sum(1.6 if m else 1.0 for m in modes) * batch
        plain_t, t = plain_t + 100 * plain_s, t2
    never = sum(100 * batch for batch in (256, 200, 130, 100, 64, 40, 20, 10, 5, 3, 1)) / plain_t
    assert tokens / t >= 0.97 * never
    assert sum(v["verify_steps"] for v in gov.as_dict().values()) <= 2 * EXPLORE_STEPS


def test_one_slow_step_does_not_decide():
    """Batch 64: plain steps take 5 ms, verify steps 15 ms for 2 tokens a row (plain pays). One
    plain step that stalled 30 ms (a moving average kept it: the H200 then speculated at every
    step of that bucket) leaves the choice as it was."""
    gov = SpecGovernor()
    simulate(gov, 100, 64, plain_s=5e-3, verify_s=15e-3, tokens=2.0)
    t = 10.0
    for gap in (5e-3, 5e-3, 5e-3, 30e-3, 5e-3):  # plain steps, the fourth one stalled
        gov.start_step(t, 64, False, decode_only=True)
        t += gap
    gov.start_step(t, 64, False, decode_only=True)
    assert gov.as_dict()[64]["plain_s"] == pytest.approx(5e-3)
    modes, _ = simulate(gov, 200, 64, plain_s=5e-3, verify_s=15e-3, tokens=2.0, t=t + 5e-3)
    assert sum(modes) <= 8


def test_a_single_slow_plain_step_does_not_decide_a_bucket():
    """Batch 1: plain steps take 0.8 ms, verify steps 2 ms for 2 tokens a row (plain pays). The
    bucket's first timed plain step stalled (1.83 ms, as on the H200 at 8867c1f, where 220
    verify steps followed that one figure): the bucket waits for more plain steps and decodes
    plainly."""
    gov = SpecGovernor()
    t, modes, plain_run, stalled = 0.0, [], 0, False
    for _ in range(300):
        verify = gov.decide(1)
        gov.start_step(t, 1, verify, decode_only=True)
        if verify:
            gov.verified(2.0)
        modes.append(verify)
        plain_run = 0 if verify else plain_run + 1
        stall = not verify and not stalled and plain_run == SETTLE + 1  # the first plain step timed
        stalled = stalled or stall
        t += 2e-3 if verify else (1.83e-3 if stall else 0.8e-3)
    assert stalled and sum(modes[100:]) < 20


def test_batch_sizes_are_judged_apart():
    """Small batches gain from speculation and large ones lose: each bucket decides alone."""
    gov = SpecGovernor()
    t = 0.0
    for _ in range(20):  # interleaved, as a load that comes and goes
        small, t = simulate(gov, 20, 2, plain_s=1e-3, verify_s=1.5e-3, tokens=3.0, t=t)
        large, t = simulate(gov, 20, 200, plain_s=5e-3, verify_s=12e-3, tokens=2.0, t=t)
    assert sum(small) > 15 and sum(large) < 5


def test_idle_gaps_and_prompt_steps_do_not_count():
    gov = SpecGovernor()
    for t in (-0.003, -0.002, -0.001, 0.0):  # settled
        gov.start_step(t, 1, False, decode_only=True)
    gov.start_step(0.001, 1, False, decode_only=True)
    gov.start_step(0.002, 1, False, decode_only=False)  # a prompt chunk: its time is not counted
    gov.start_step(0.5, 1, False, decode_only=True)
    gov.idle()  # nothing ran
    gov.start_step(5.0, 1, False, decode_only=True)
    gov.start_step(7.0, 1, False, decode_only=True)  # 2 s later: idle time, not a step
    assert gov.as_dict()[1]["plain_s"] == pytest.approx(0.001)


def test_a_step_before_a_prompt_does_not_count():
    """Offline, the caller's time between two `generate` calls lands in the gap after a
    request's last step; the next step holds the new prompt, so that gap is dropped."""
    gov = SpecGovernor()
    for t in (0.0, 0.001, 0.002, 0.003, 0.004):
        gov.start_step(t, 1, False, decode_only=True)
    gov.start_step(0.014, 1, False, decode_only=False)  # 10 ms later: the next request's prompt
    gov.start_step(0.016, 1, False, decode_only=True)
    gov.start_step(0.017, 1, False, decode_only=True)
    assert gov.as_dict()[1]["plain_s"] == pytest.approx(0.001)


def test_prompt_phases_neither_try_nor_explore():
    """A step that will not be decode-only (a prompt being computed) cannot be measured: it
    takes the mode that looks better (plain while nothing is known) and leaves explorations
    to the steps that can be measured."""
    gov = SpecGovernor()
    assert [gov.decide(256, measurable=False) for _ in range(100)] == [False] * 100
    simulate(gov, 200, 256, plain_s=5e-3, verify_s=15e-3, tokens=1.5)
    assert not any(gov.decide(256, measurable=False) for _ in range(4 * EXPLORE_MAX))
    simulate(gov, 200, 1, plain_s=1e-3, verify_s=1.5e-3, tokens=3.0)
    assert all(gov.decide(1, measurable=False) for _ in range(4 * EXPLORE_MAX))


def test_steps_right_after_a_change_of_mode_do_not_count():
    """They refill an async pipeline (two plain steps) or let a draft catch up (one verify
    step): their time is not the mode's."""
    gov = SpecGovernor()
    for t in (0.012, 0.013, 0.014):                       # settling, then 1 ms apart
        gov.start_step(t, 1, False, decode_only=True)
    gov.start_step(0.015, 1, False, decode_only=True)   # a plain step: 1 ms
    gov.start_step(0.016, 1, True, decode_only=True)    # the first verify step: 10 ms, dropped
    gov.verified(2.0)
    gov.start_step(0.026, 1, True, decode_only=True)    # the second: 2 ms
    gov.verified(2.0)
    gov.start_step(0.028, 1, False, decode_only=True)   # plain again: 9 ms and 5 ms, dropped
    gov.start_step(0.037, 1, False, decode_only=True)
    gov.start_step(0.042, 1, False, decode_only=True)   # the third: 1 ms
    gov.start_step(0.043, 1, False, decode_only=True)
    est = gov.as_dict()[1]
    assert est["plain_s"] == pytest.approx(0.001) and est["verify_s"] == pytest.approx(0.002)


def test_a_plain_step_before_a_verify_step_does_not_count():
    """Its gap holds the drain of the steps in flight and the next step's proposals. Where
    verify steps dominate, plain steps come in explorations of 4 and each last one carries that
    drain: counted, they would double the plain median and keep verify steps that lose."""
    gov = SpecGovernor()
    t = 0.0
    for _ in range(40):                                     # explorations: 4 plain steps...
        for i in range(EXPLORE_STEPS):
            gov.start_step(t, 128, False, decode_only=True)
            t += 0.012 if i == EXPLORE_STEPS - 1 else 0.006  # the last waits for a drain
        for _ in range(6):                                   # ... between verify steps
            gov.start_step(t, 128, True, decode_only=True)
            gov.verified(1.6)
            t += 0.009
    est = gov.as_dict()[128]
    assert est["plain_s"] == pytest.approx(0.006)
    assert gov.buckets[bucket(128)].ratio == pytest.approx(1.6 * 0.006 / 0.009)  # < 1: plain wins


def test_adaptive_engine_keeps_the_tokens_and_measures_both_modes():
    kw = dict(block_size=8, num_kv_blocks=128)
    params = [greedy(80) for _ in range(2)]
    want = [o.token_ids for o in LLM("tiny-random", **kw).generate(PROMPTS[:2], params, use_tqdm=False)]
    llm = LLM("tiny-random", speculative_config={**SPEC, "adaptive": True}, **kw)
    assert [o.token_ids for o in llm.generate(PROMPTS[:2], params, use_tqdm=False)] == want
    est = llm.engine.spec_decoder.governor.as_dict()[2]  # two rows: the bucket of 2-3
    assert est["plain_s"] is not None and est["verify_s"] is not None and est["tokens_per_row"] >= 1
    assert llm.stats()["num_spec_draft_tokens"] > 0


def test_a_try_that_never_measures_pauses():
    """Verify decisions whose steps never count (here: never decode-only) pause after
    TRY_STEPS; the bucket decodes plainly and tries again after EXPLORE_EVERY plain steps."""
    from infer_cluster.worker.spec_decode.governor import TRY_STEPS
    gov = SpecGovernor()
    t, modes = 0.0, []
    for _ in range(200):
        verify = gov.decide(1)
        gov.start_step(t, 1, verify, decode_only=False)
        modes.append(verify)
        t += 1e-3
    burst = [True] * TRY_STEPS + [False] * EXPLORE_EVERY  # tries together, so they can settle
    assert modes[:2 * len(burst)] == 2 * burst
    assert sum(modes) == TRY_STEPS * -(-200 // len(burst))


def test_full_acceptance_counts_the_proposals_a_row_gets_at_that_batch():
    """Rows get fewer proposals as the batch grows (`row_limit`: k = 8 gives one a row from
    batch 24). At batch 256 a verify step of 4.2 plain ones could pay with 9 tokens a row but
    not with the 2 a row can get there: it could not win, so the next bucket starts from its
    ratio and never tries. With the k + 1 = 9 of small batches, workload A (H200, k = 8,
    2026-11-29) tried every bucket and ran at 0.73 of off."""
    from infer_cluster.worker.spec_decode.ngram import row_limit
    gov = SpecGovernor(lambda batch: row_limit(8, batch) + 1)
    t = simulate(gov, 200, 256, plain_s=6.2e-3, verify_s=26e-3, tokens=1.5)[1]
    modes, _ = simulate(gov, 150, 130, plain_s=5.7e-3, verify_s=41e-3, tokens=1.6, t=t)
    assert sum(modes) == 0
    assert not gov.wants_shadow(256)
    flat = SpecGovernor(max_tokens=9)
    t = simulate(flat, 200, 256, plain_s=6.2e-3, verify_s=26e-3, tokens=1.5)[1]
    modes, _ = simulate(flat, 150, 130, plain_s=5.7e-3, verify_s=41e-3, tokens=1.6, t=t)
    assert modes[0]  # the flat bound tried the next bucket
