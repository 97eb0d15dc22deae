"""Verification on the real `Sampler` with hand-made logits (one row per position): the kept
tokens and logprobs equal those of decoding one token a step, for greedy, penalties,
min_tokens, logit_bias, logprobs and seeded sampling; and for unseeded sampling the first token
follows the row's distribution whatever was proposed (chi-square, 0.999), a test that fails when
the acceptance rule is broken (checked below by breaking it)."""


import pytest
import torch

from infer_cluster.protocol import SamplingParams
from infer_cluster.worker.sampling.sampler import Sampler
from infer_cluster.worker.sampling.draw_io import SamplingRequestState
from infer_cluster.worker.sched.request import Request
from infer_cluster.worker.spec_decode import verify
from infer_cluster.worker.spec_decode.verify import SpecStats, accept, expand_rows

from tests.unit.test_sampler import chi_square, softmax

EOS = 0
CHI2_CRIT_999 = {1: 10.828, 7: 24.322}  # chi2.ppf(0.999, df), standard tables
LOGITS8 = [0.0, 0.5, 1.0, 1.5, -1.0, 2.0, 0.3, -0.5]


def scheduled(rid, params, prompt=(1, 2, 3), output=()):
    """A request as it is while its step runs: its sampled row is pending."""
    req = Request(rid, list(prompt), params, 0, eos_token_ids=(EOS,))
    for t in output:
        req.append_token(t)
    req.num_pending = 1
    return req


def run_verify(sampler, logits, reqs_and_drafts, stats=None):
    """One verify step's sampling: `reqs_and_drafts` = [(request, proposals)], `logits` their
    rows in order (k + 1 per request)."""
    row_ids, proposals, requests = [], {}, {}
    for req, drafts in reqs_and_drafts:
        row_ids += [req.request_id] * (len(drafts) + 1)
        if drafts:
            proposals[req.request_id] = list(drafts)
        requests[req.request_id] = req
    rows, groups = expand_rows(row_ids, proposals, requests, (EOS,))
    out = sampler(logits, rows)
    return accept(groups, out.token_ids, out.logprobs, stats)


def one_at_a_time(sampler_factory, position_logits, req, drafts):
    """The reference: decode one token a step (a fresh row each step, the request's tokens so
    far), taking proposals as long as the draws equal them."""
    tokens, logprobs = [], []
    for j in range(len(drafts) + 1):
        row = SamplingRequestState(req.params, req.prompt_token_ids, req.output_token_ids + tokens,
                                   None, (EOS,))
        out = sampler_factory()(position_logits[j:j + 1].clone(), [row])
        tokens.append(out.token_ids[0])
        logprobs.append(out.logprobs[0])
        if j == len(drafts) or out.token_ids[0] != drafts[j]:
            break
    return tokens, logprobs


PARAMS = {
    "greedy": dict(temperature=0),
    "penalties": dict(temperature=0, repetition_penalty=1.8, frequency_penalty=0.7, presence_penalty=0.5),
    "min_tokens": dict(temperature=0, min_tokens=4, stop_token_ids=[3]),
    "logit_bias": dict(temperature=0, logit_bias={5: -30.0}),
    "logprobs": dict(temperature=0, logprobs=3),
    "seeded": dict(temperature=0.9, top_k=6, top_p=0.9, seed=11, logprobs=2),
    "seeded_min_p": dict(temperature=1.3, min_p=0.05, seed=5, repetition_penalty=1.2),
    "no_repeat_ngram": dict(temperature=0, no_repeat_ngram_size=2),
}


@pytest.mark.parametrize("name", list(PARAMS))
def test_kept_tokens_and_logprobs_equal_one_token_a_step(name):
    g = torch.Generator().manual_seed(7)
    for trial in range(12):
        vocab = 16
        logits = torch.randn(6, vocab, generator=g) * 3
        # proposals: mostly what greedy would pick at each position, sometimes not, some EOS / 3
        drafts = [int(logits[j].argmax()) if (trial + j) % 4 else (trial + j) % vocab for j in range(5)]
        if trial % 3 == 0:
            drafts[1] = EOS
        params = SamplingParams(max_tokens=50, **PARAMS[name])
        req = scheduled("r", params, prompt=[1, 2, 3, 5, 3], output=[2, 5][:trial % 3])
        tokens, logprobs = run_verify(Sampler(), logits.clone(), [(req, drafts)])
        want_tokens, want_logprobs = one_at_a_time(Sampler, logits, req, drafts)
        assert tokens["r"] == want_tokens, (name, trial)
        if params.logprobs is None:
            assert logprobs["r"] is None
        else:
            assert [lp[0] for lp in logprobs["r"]] == pytest.approx([lp[0] for lp in want_logprobs])
            assert [list(lp[1]) for lp in logprobs["r"]] == [list(lp[1]) for lp in want_logprobs]


def test_rows_without_proposals_and_a_mixed_batch():
    logits = torch.randn(8, 10, generator=torch.Generator().manual_seed(3))
    greedy = SamplingParams(temperature=0, max_tokens=20)
    a, b, c = scheduled("a", greedy), scheduled("b", greedy), scheduled("c", greedy)
    drafts_a = [int(logits[0].argmax()), int(logits[1].argmax())]
    drafts_c = [int(logits[4].argmax()) + 1 if int(logits[4].argmax()) < 9 else 0, 1, 2]
    stats = SpecStats(4)
    tokens, _ = run_verify(Sampler(), logits, [(a, drafts_a), (b, []), (c, drafts_c)], stats)
    assert tokens == {"a": logits[:3].argmax(-1).tolist(), "b": [int(logits[3].argmax())],
                      "c": [int(logits[4].argmax())]}
    assert (stats.num_draft_tokens, stats.num_accepted_tokens) == (5, 2)
    assert stats.as_dict()["spec_acceptance_per_position"] == [0.5, 0.5, 0.0, 0.0]


def first_token_counts(num, draft):
    """First kept token of `num` unseeded requests that all proposed `draft` at a row whose
    logits are LOGITS8, drawn in one batch."""
    params = SamplingParams(temperature=1.0, max_tokens=10)
    reqs = [(scheduled(f"r{i}", params), [draft]) for i in range(num)]
    second = [3.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]
    logits = torch.tensor([LOGITS8, second] * num)
    tokens, _ = run_verify(Sampler(torch.Generator().manual_seed(1234)), logits, reqs)
    counts = [0] * 8
    for t in tokens.values():
        counts[t[0]] += 1
    return counts, tokens


@pytest.mark.parametrize("draft", [5, 4])  # the likeliest token, and an unlikely one
def test_first_token_follows_the_rows_distribution(draft):
    counts, tokens = first_token_counts(20000, draft)
    assert chi_square(counts, softmax(LOGITS8)) < CHI2_CRIT_999[7]
    # when the proposal was kept, the next token came from the next position's row
    after = [t[1] for t in tokens.values() if t[0] == draft]
    p_zero = softmax([3.0] + [0.0] * 7)[0]
    hits = sum(1 for t in after if t == 0)
    assert chi_square([hits, len(after) - hits], [p_zero, 1 - p_zero]) < CHI2_CRIT_999[1]
    assert all(len(t) == 1 for t in tokens.values() if t[0] != draft)


def test_the_chi_square_catches_a_broken_acceptance_rule(monkeypatch):
    """Keep every proposal (no rejection): the test above must fail."""
    monkeypatch.setattr(verify, "num_accepted", lambda proposals, draws: len(proposals))
    counts, _ = first_token_counts(20000, 4)
    assert chi_square(counts, softmax(LOGITS8)) > CHI2_CRIT_999[7]


def test_a_verify_step_runs_as_a_decode_step_with_the_same_logits():
    """`decode_shaped`: each position of a row with proposals becomes a one-token row with its
    context up to that position; the logits equal the mixed step's (prefill attention over the
    positions), and a prompt chunk or too many positions keep the mixed step."""
    from infer_cluster.worker import LLM
    from infer_cluster.worker.sched.output import ScheduledRequest, SchedulerOutput
    from infer_cluster.worker.spec_decode.verify import decode_shaped

    llm = LLM("tiny-random", block_size=8, num_kv_blocks=64)
    runner = llm.engine.runner
    prompts = [[5, 6, 7, 8, 9, 10, 11, 12, 13, 14], [20, 21, 22]]
    blocks = [[1, 2], [3]]
    prefill = SchedulerOutput([ScheduledRequest(f"r{i}", p[:-1], 0, b, False)
                               for i, (p, b) in enumerate(zip(prompts, blocks))])
    runner.execute(prefill)  # the prompts' KV but their last token
    verify_out = SchedulerOutput([
        ScheduledRequest("r0", [14, 30, 31, 32], 9, [1, 2], True, num_spec_tokens=3),
        ScheduledRequest("r1", [22], 2, [3], True)], 5)
    shaped = decode_shaped(verify_out)
    assert [(s.request_id, s.token_ids, s.start_position) for s in shaped.requests] == [
        ("r0", [14], 9), ("r0", [30], 10), ("r0", [31], 11), ("r0", [32], 12), ("r1", [22], 2)]
    want, want_ids = runner.execute(verify_out)
    got, got_ids = runner.execute(shaped)
    assert got_ids == want_ids == ["r0"] * 4 + ["r1"]
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    # a prompt chunk beside it, or more positions than allowed: the mixed step stays
    chunk = SchedulerOutput(verify_out.requests + [ScheduledRequest("r2", [1, 2, 3], 0, [4], True)], 8)
    assert decode_shaped(chunk) is None
    assert decode_shaped(verify_out, max_rows=4) is None
    assert decode_shaped(SchedulerOutput([verify_out.requests[1]], 1)) is None  # no proposals
    llm.close()


@pytest.mark.parametrize("extra,fast", [({}, True), ({"logprobs": 2}, False),
                                        ({"repetition_penalty": 1.3}, False)])
def test_plain_greedy_verify_steps_take_argmax_ids_without_sampler_rows(monkeypatch, extra, fast):
    """A verify step whose requests are all plain greedy draws each position's argmax and
    builds no per-position sampler rows; one with logprobs or penalties takes the sampler. The
    tokens equal speculation off either way."""
    from infer_cluster.worker import LLM
    from tests.spec_decode.test_engine import PROMPTS, SPEC, greedy
    kw = dict(block_size=8, num_kv_blocks=256)
    params = greedy(40, **extra)
    want = [o.token_ids for o in LLM("tiny-random", **kw).generate(PROMPTS[:3], params, use_tqdm=False)]
    calls = []
    real = verify.expand_rows
    monkeypatch.setattr(verify, "expand_rows", lambda *a: calls.append(1) or real(*a))
    llm = LLM("tiny-random", speculative_config=SPEC, **kw)
    assert [o.token_ids for o in llm.generate(PROMPTS[:3], params, use_tqdm=False)] == want
    assert llm.stats()["num_spec_accepted_tokens"] > 0
    assert (not calls) == fast
