"""Chained verify steps (worker/spec_decode/chain.py) in the engine on tiny-random, with async
scheduling: the output equals speculation off token for token (greedy and every finish rule,
with chunked prefill, preemption, the prefix cache and the host tier), chained steps really ran,
every block comes back, a request's end leaves the chain going for the others, an abort or a
stop string mid-chain loses nothing, and a device that disagrees with the host about a request's
tokens fails that step's requests, once each."""

import pytest
import torch

from infer_cluster.protocol import SamplingParams
from infer_cluster.worker import LLM
from infer_cluster.worker.spec_decode.chain import ChainedStep, VerifyChain
from infer_cluster.worker.spec_decode.verify import VerifyStep

from tests.spec_decode.test_engine import PROMPTS, SETTINGS, SPEC, abort_mid_flight, assert_same, greedy, outputs
from tests.spec_decode.test_engine import reference_params  # noqa: F401 (a fixture)


# On a GPU (where these run with CUDA graphs and the Triton kernel): float32, so that speculation
# off and on, whose steps have different row counts, round alike (tests/spec_decode/test_gpu.py).
BASE = dict(block_size=8, **({"dtype": "float32"} if torch.cuda.is_available() else {}))


def chained(setting_kw):
    llm = LLM("tiny-random", speculative_config=SPEC, async_scheduling=True, **setting_kw)
    assert llm.engine.spec_chain is not None
    return llm


def test_the_step_that_ends_the_last_request_leaves_nothing_in_flight():
    """A chained step is launched before the step before it is collected, so the step that ends
    the last requests can leave one in flight for requests that are gone. The engine collects it
    in that same `step()`: once no request is left, no step is in flight and every block is
    free (before, it waited for a later `step()` that an idle server never makes)."""
    engine = chained({**BASE, "num_kv_blocks": 64}).engine
    chained_steps = 0
    for n in (40, 31, 40, 23):
        for p in PROMPTS[:4]:
            engine.add_request(p, greedy(n))
        while engine.scheduler.has_unfinished():
            engine.step()
            chained_steps += any(isinstance(s, ChainedStep) for s in engine._inflight.steps)
        assert not engine._inflight.steps
        stats = engine.stats()
        assert stats["num_free_blocks"] == stats["num_total_blocks"]
    assert chained_steps > 0


@pytest.mark.parametrize("setting", list(SETTINGS))
def test_greedy_outputs_equal_speculation_off(setting, monkeypatch):
    kw = {**BASE, "num_kv_blocks": 64, **SETTINGS[setting]}
    # requests end at different steps, some maybe on EOS, while the others' chain runs
    params = [greedy(40), greedy(31), greedy(40), greedy(23)] + [
        SamplingParams(temperature=0, max_tokens=n) for n in (40, 27, 35, 19)]
    want = outputs(LLM("tiny-random", **kw), params)
    llm = chained(kw)
    sizes, launch = [], VerifyChain.launch

    def spy(self, out, *args):  # (requests of the step before, requests chained)
        sizes.append((len(llm.engine._inflight.steps[0].out.requests), len(out.requests)))
        return launch(self, out, *args)
    monkeypatch.setattr(VerifyChain, "launch", spy)
    got = outputs(llm, params)
    assert_same(got, want, setting)
    stats = llm.stats()
    assert stats["num_spec_chained_steps"] == len(sizes) > 0
    if setting == "defaults":  # a request's end leaves the chain going for the others
        assert any(after < before for before, after in sizes)
    assert stats["num_spec_accepted_tokens"] > 0.2 * stats["num_spec_draft_tokens"] > 0
    assert stats["num_free_blocks"] == stats["num_total_blocks"]


@pytest.mark.parametrize("from_plain", [True, False])
def test_a_chain_starts_after_a_plain_step(from_plain, monkeypatch):
    """Where the text starts repeating after plain steps, the chain starts from the plain step
    in flight (its draws on the device, the host's lookups for the plan), not from a
    host-scheduled verify step that waited for it; the output stays speculation off's.
    `INFER_CLUSTER_SPEC_CHAIN_PLAIN=0` starts chains after verify steps only."""
    from infer_cluster.worker.engine.inflight import LaunchedStep

    monkeypatch.setenv("INFER_CLUSTER_SPEC_CHAIN_PLAIN", "1" if from_plain else "0")
    kw = {**BASE, "num_kv_blocks": 64}
    params = [greedy(40), greedy(31), greedy(40), greedy(23)] * 2
    want = outputs(LLM("tiny-random", **kw), params)
    llm = chained(kw)
    starts, begin = [], VerifyChain.begin

    def spy(self, step, requests, found=None):
        starts.append((type(step), found))
        return begin(self, step, requests, found)
    monkeypatch.setattr(VerifyChain, "begin", spy)
    assert_same(outputs(llm, params), want, f"from_plain={from_plain}")
    plain = [found for kind, found in starts if kind is LaunchedStep]
    if from_plain:  # started from plain steps, each with the host's lookup counts, some found
        assert plain and all(found is not None and any(found.values()) for found in plain)
    else:
        assert not plain and starts
    assert all(kind is LaunchedStep or issubclass(kind, VerifyStep) for kind, _ in starts)
    stats = llm.stats()
    assert stats["num_free_blocks"] == stats["num_total_blocks"]


def test_every_finish_rule_and_request_kind_equals_speculation_off(reference_params):
    """Stop tokens and strings, min_tokens, penalties, bans, seeds and logprobs beside plain
    greedy requests: a step holding any of them is not chained; the chain runs once they end."""
    kw = dict(BASE, num_kv_blocks=64)
    want = outputs(LLM("tiny-random", **kw), reference_params)
    llm = chained(kw)
    assert_same(outputs(llm, reference_params), want, "mixed")
    stats = llm.stats()
    assert stats["num_free_blocks"] == stats["num_total_blocks"]


def run_until_chained(engine, take, limit=200):
    for _ in range(limit):
        take(engine.step())
        if any(isinstance(s, ChainedStep) for s in engine._inflight.steps):
            return
    raise AssertionError("no chained verify step ran")


def collector():
    tokens, finals = {}, {}

    def take(deltas):
        for d in deltas:
            tokens.setdefault(d.request_id, []).extend(d.token_ids)
            if d.finish_reason is not None:
                assert d.request_id not in finals  # exactly one final delta
                finals[d.request_id] = d.finish_reason
    return tokens, finals, take


def test_an_abort_while_a_chained_step_is_in_flight_loses_nothing():
    abort_mid_flight(dict(BASE, num_kv_blocks=128), greedy(60),
                     lambda engine: any(isinstance(s, ChainedStep) for s in engine._inflight.steps))


def test_a_device_out_of_step_with_the_host_fails_its_requests_once():
    """The host checks each chained step's token counts against its own: a device state that
    lost a token (here: its count moved by hand) fails the step's requests with an error
    final, and every block comes back; nothing continues from wrong positions."""
    kw = dict(BASE, num_kv_blocks=128)
    engine = chained(kw).engine
    ids = [engine.add_request(p, greedy(60)) for p in PROMPTS[:3]]
    tokens, finals, take = collector()
    run_until_chained(engine, take)
    engine.spec_chain.meta[:3, 0] += 1  # the in-flight step already read it: the next one reads this
    while engine.has_unfinished_requests():
        take(engine.step())
    assert set(finals.values()) == {"error"} and set(finals) == set(ids)
    stats = engine.stats()
    assert stats["num_free_blocks"] == stats["num_total_blocks"]


def test_the_switch_turns_it_off(monkeypatch):
    monkeypatch.setenv("INFER_CLUSTER_SPEC_CHAIN", "0")
    llm = LLM("tiny-random", speculative_config=SPEC, async_scheduling=True, **BASE, num_kv_blocks=64)
    assert llm.engine.spec_chain is None


def test_the_plan_gives_cold_requests_one_row_and_shares_the_rest():
    from infer_cluster.worker.sched.output import ScheduledRequest, SchedulerOutput

    class Step(ChainedStep):  # a chained step in flight: only its requests matter to the plan
        def __init__(self, ids, ks=None):
            ks = ks or [5] * len(ids)
            self.out = SchedulerOutput([ScheduledRequest(r, [0] * (k + 1), 9, [], True, num_spec_tokens=k)
                                        for r, k in zip(ids, ks)])

    chain = VerifyChain(15, 3, 4, 24, 64, 8, torch.device("cpu"))
    ids = [f"r{i}" for i in range(8)]
    assert chain.plan(Step(ids), ids, 48) == [5] * 8  # nothing known yet: 48 rows shared evenly
    chain.found = dict.fromkeys(ids[:3], 0)  # three stopped repeating: one row each
    assert chain.plan(Step(ids), ids, 48) == [0, 0, 0, 8, 8, 8, 8, 8]
    chain.found.update(r3=2, r4=16)  # a short continuation keeps 2; its rows go to the others
    ks = chain.plan(Step(ids), ids, 48)
    assert ks == [0, 0, 0, 2, 10, 9, 9, 10] and sum(k + 1 for k in ks) == 48
    assert chain.plan(Step(["a"]), ["a"], 48) == [15]  # at most k
    chain.found = dict.fromkeys(ids, 0)
    assert chain.plan(Step(ids), ids, 48) is None  # no text repeats: no chained step
    # at a chain's start the host's proposals count, whatever the last chain's lookups found
    host = type("HostStep", (), {})()  # a verify step the host proposed (not a chained one)
    host.out = Step(ids, [3, 0, 3, 3, 3, 3, 3, 3]).out
    assert chain.plan(host, ids, 48) == [3, 0, 3, 3, 3, 3, 3, 3]
    assert chain.plan(host, ids[1:], 48) == [0, 3, 3, 3, 3, 3, 3]  # r0 ended: the others go on
