"""`ShadowAcceptance`: in plain steps, proposals kept and compared with the tokens decoded
afterwards give the tokens a row that verify steps would have given; the governor follows them
between its verify steps. Real `Request`s and the real prompt-lookup proposer."""

from infer_cluster.protocol import SamplingParams
from infer_cluster.worker import LLM
from infer_cluster.worker.sched.request import Request, RequestStatus
from infer_cluster.worker.spec_decode.governor import HYSTERESIS, SpecGovernor
from infer_cluster.worker.spec_decode.ngram import NgramProposer
from infer_cluster.worker.spec_decode.shadow import MAX_KEPT, ROWS_PER_STEP, ShadowAcceptance

from tests.spec_decode.test_engine import SPEC


def _request(rid, prompt, max_tokens=64):
    req = Request(rid, prompt, SamplingParams(temperature=0, max_tokens=max_tokens), 0)
    req.num_computed_tokens = req.num_tokens
    return req


def test_kept_proposals_count_the_leading_tokens_decoded_alike():
    proposer = NgramProposer(4, 2, 3, 1024)
    shadow = ShadowAcceptance(proposer.shadow)
    req = _request("a", [1, 2, 3, 4, 5, 9, 1, 2])   # (1, 2) was followed by 3, 4, 5, 9
    assert shadow.step([req]) is None                 # proposes [3, 4, 5, 9]; nothing resolved yet
    for t in (3, 4, 7):                               # two of them decoded alike, then a miss
        req.append_token(t)
        assert shadow.step([req]) is None             # its four tokens are not all out yet
    req.append_token(8)
    assert shadow.step([req]) == 3.0                  # 2 accepted + the token after them
    assert shadow.num_resolved == 1  # (the proposal after (4, 7) found nothing: alone, not counted)


def test_rows_with_nothing_to_propose_count_one_token_in_a_batch_and_nothing_alone():
    proposer = NgramProposer(4, 2, 3, 1024)
    never = [_request("x", [10, 11, 12, 13]), _request("y", [20, 21, 22, 23])]  # no repeats
    shadow = ShadowAcceptance(proposer.shadow)
    shadow.step(never)
    assert shadow.step(never) == 1.0                  # a verify step would carry them: 1 token
    alone = ShadowAcceptance(proposer.shadow)
    alone.step(never[:1])
    assert alone.step(never[:1]) is None              # batch 1: such a step runs as a plain one


def test_ended_requests_are_dropped_and_the_kept_proposals_stay_bounded():
    proposer = NgramProposer(4, 1, 2, 1024)
    shadow = ShadowAcceptance(proposer.shadow)
    reqs = [_request(str(i), [1, 2, 1, 2, 1]) for i in range(3 * MAX_KEPT)]
    for _ in range(3 * MAX_KEPT // ROWS_PER_STEP):
        shadow.step(reqs)                             # nobody decodes: proposals pile up
    assert len(shadow._kept) <= MAX_KEPT
    for req in reqs:
        req.status = RequestStatus.FINISHED
    assert shadow.step([]) is None and not shadow._kept


def test_the_governor_follows_shadow_acceptance_between_verify_steps():
    """Verify steps cost 2 ms, plain ones 1 ms. Measured at 1.2 tokens a row the bucket decodes
    plainly; when shadows report 4 tokens it speculates at once, without waiting for an
    exploration; near r = 1 it does not flip back and forth."""
    gov = SpecGovernor()
    t = 0.0
    for _ in range(300):
        verify = gov.decide(1)
        gov.start_step(t, 1, verify, decode_only=True)
        if verify:
            gov.verified(1.2)
        t += 2e-3 if verify else 1e-3
    assert gov.as_dict()[1]["tokens_per_row"] == 1.2
    modes = []
    for _ in range(20):
        verify = gov.decide(1)
        gov.start_step(t, 1, verify, decode_only=True)
        if verify:
            gov.verified(4.0)
        else:
            gov.shadowed(1, 4.0)
        modes.append(verify)
        t += 2e-3 if verify else 1e-3
    assert all(modes[-15:])
    # r just above 1 then just below: within the hysteresis, the mode holds
    flips = []
    for i in range(40):
        tokens = 2.0 * (1 + HYSTERESIS / 2 * (-1) ** i)
        verify = gov.decide(1)
        gov.start_step(t, 1, verify, decode_only=True)
        gov.verified(tokens) if verify else gov.shadowed(1, tokens)
        flips.append(verify)
        t += 2e-3 if verify else 1e-3
    assert sum(a != b for a, b in zip(flips, flips[1:])) <= 2 * 40 // 32 + 2  # explorations only


def test_no_shadows_where_verify_steps_could_not_pay():
    gov = SpecGovernor(max_tokens=5)
    t = 0.0
    for _ in range(200):  # verify steps 6x a plain one: no acceptance could pay
        verify = gov.decide(256)
        gov.start_step(t, 256, verify, decode_only=True)
        if verify:
            gov.verified(5.0)
        t += 6e-3 if verify else 1e-3
    assert not gov.wants_shadow(256)
    assert gov.wants_shadow(1)  # a bucket never seen


def test_an_adaptive_engine_measures_shadows_and_keeps_the_tokens():
    kw = dict(block_size=8, num_kv_blocks=256)
    prompts = [[5, 6, 7, 8, 9, 10, 11, 12] * 6, [3, 1, 4, 1, 5, 9, 2, 6] * 6]
    params = SamplingParams(temperature=0, max_tokens=60, ignore_eos=True)
    want = [o.token_ids for o in LLM("tiny-random", **kw).generate(prompts, params, use_tqdm=False)]
    llm = LLM("tiny-random", speculative_config={**SPEC, "adaptive": True}, **kw)
    assert [o.token_ids for o in llm.generate(prompts, params, use_tqdm=False)] == want
    assert llm.engine.spec_decoder.shadow.num_resolved > 0


def test_worth_waiting_reuses_the_lookups_a_chain_just_made():
    """A chain tried after a plain step looks up every request in the tokens on the host
    (`SpecDecoder.host_lookups`); where it finds nothing, the host path asks the same question
    (`worth_waiting`) of the same tokens: the answer is reused, not looked up again. A token
    appended since, or other requests, look up afresh."""
    from infer_cluster.worker.spec_decode.config import SpeculativeConfig
    from infer_cluster.worker.spec_decode.decoder import SpecDecoder

    decoder = SpecDecoder(SpeculativeConfig(**SPEC), 1024)
    calls, probe = [], decoder.proposer.shadow
    decoder.proposer.shadow = lambda req, batch: calls.append(req.request_id) or probe(req, batch)
    running = [_request("x", [10, 11, 12, 13]), _request("y", [1, 2, 3, 1, 2])]
    assert decoder.host_lookups(running) == [0, 3] and calls == ["x", "y"]
    assert decoder.worth_waiting(running[::-1]) is True and calls == ["x", "y"]  # reused
    assert decoder.worth_waiting(running) is True and len(calls) == 4  # once only
    decoder.host_lookups(running[:1])
    running[0].append_token(14)
    assert decoder.worth_waiting(running[:1]) is False and len(calls) == 6  # a token came
