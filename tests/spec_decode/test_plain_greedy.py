"""`_plain_greedy` (worker/spec_decode/verify.py): whether a verify step may take the argmax ids
alone. Requests whose params carry no feature bit skip the sampler's classification; the answer
must equal the classification's for every mix of params, row by row and in batches."""

from types import SimpleNamespace

import pytest

from infer_cluster.protocol import SamplingParams
from infer_cluster.protocol.structured import StructuredOutputsParams
from infer_cluster.worker.sampling.draw_io import SamplingRequestState
from infer_cluster.worker.sampling.sampler import Sampler
from infer_cluster.worker.sched.output import ScheduledRequest, SchedulerOutput
from infer_cluster.worker.spec_decode.verify import _plain_greedy

VOCAB, EOS = 64, (2,)
PARAMS = {
    "greedy": dict(temperature=0),
    "top_k_1": dict(temperature=0.8, top_k=1),
    "sampled": dict(temperature=0.7, seed=1),
    "penalty": dict(temperature=0, repetition_penalty=1.2),
    "no_repeat": dict(temperature=0, no_repeat_ngram_size=2),
    "logprobs": dict(temperature=0, logprobs=2),
    "bias": dict(temperature=0, logit_bias={3: -100.0}),
    "min_tokens_short": dict(temperature=0, min_tokens=9),
    "min_tokens_reached": dict(temperature=0, min_tokens=2),
    "schema_no_grammar": dict(temperature=0, structured_outputs=StructuredOutputsParams(regex="a+")),
}


def _request(name, params):
    return SimpleNamespace(params=SamplingParams(max_tokens=32, **params), prompt_token_ids=[5, 6, 7],
                           output_token_ids=[8, 9, 10], num_pending=1, grammar=None)


def _classified(reqs, sampler):
    rows = [SamplingRequestState(r.params, r.prompt_token_ids, r.output_token_ids, None, EOS, rid,
                                 r.num_pending - 1, r.grammar) for rid, r in reqs.items()]
    return sampler.classify(rows, VOCAB).plain_greedy


@pytest.mark.parametrize("names", [[n] for n in PARAMS] + [["greedy", "greedy"], ["greedy", "sampled"],
                                                            ["greedy", "min_tokens_reached"], ["bias", "greedy"]])
def test_the_shortcut_agrees_with_the_classification(names):
    sampler = Sampler()
    reqs = {f"r{i}": _request(n, PARAMS[n]) for i, n in enumerate(names)}
    out = SchedulerOutput([ScheduledRequest(rid, [1, 2], 13, [0], True, num_spec_tokens=1) for rid in reqs], 2 * len(reqs))
    assert _plain_greedy(out, reqs, sampler, VOCAB, EOS) == _classified(reqs, sampler)


def test_a_request_gone_since_scheduling_is_not_plain():
    out = SchedulerOutput([ScheduledRequest("gone", [1, 2], 13, [0], True, num_spec_tokens=1)], 2)
    assert _plain_greedy(out, {}, Sampler(), VOCAB, EOS) is False
