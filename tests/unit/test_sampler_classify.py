"""`Sampler.classify` decides whether a T > 1 step may gather argmax ids instead of logits
(`RowClasses.plain_greedy`), so it must list every row that needs the logits: penalties, an
active min_tokens, logprobs, a random draw. Plain greedy rows (temperature 0, or top_k 1) and a
min_tokens already reached do not. The draw of those ids equals the draw from the logits."""

import pytest
import torch

from infer_cluster.protocol.sampling_params import SamplingParams
from infer_cluster.worker.sampling.sampler import Sampler
from infer_cluster.worker.sampling.draw_io import SamplingRequestState

VOCAB = 16


def row(output=(), pending=0, rid=None, **params):
    params.setdefault("max_tokens", 8)
    return SamplingRequestState(SamplingParams(**params), [1, 2], list(output), None, [0], rid, pending)


GREEDY = dict(temperature=0)


@pytest.mark.parametrize("params", [GREEDY, dict(temperature=1.0, top_k=1), dict(GREEDY, min_tokens=2)],
                         ids=["temperature0", "top_k1", "min_tokens_reached"])
def test_plain_greedy_rows(params):
    rows = [row(**GREEDY), row(output=[3, 4], **params)]
    assert Sampler().classify(rows, VOCAB).plain_greedy


@pytest.mark.parametrize("params,field", [
    (dict(GREEDY, repetition_penalty=1.2), "penalty_rows"),
    (dict(GREEDY, presence_penalty=0.5), "penalty_rows"),
    (dict(GREEDY, no_repeat_ngram_size=2), "penalty_rows"),
    (dict(GREEDY, min_tokens=5), "min_tokens_rows"),
    (dict(GREEDY, logprobs=2), "logprob_rows"),
    (dict(temperature=0.7, seed=3), "random_rows"),
], ids=["repetition", "presence", "ngram", "min_tokens_active", "logprobs", "random"])
def test_rows_that_need_the_logits(params, field):
    rows = [row(**GREEDY), row(output=[3, 4], rid="r1", **params)]
    classes = Sampler().classify(rows, VOCAB)
    assert not classes.plain_greedy
    assert getattr(classes, field) == [1]


def test_pending_tokens_count_towards_min_tokens():
    # 2 tokens on the host + 3 drawn on the device, not yet collected: min_tokens 5 is reached
    assert Sampler().classify([row(output=[3, 4], pending=3, **dict(GREEDY, min_tokens=5))], VOCAB).plain_greedy
    assert not Sampler().classify([row(output=[3, 4], pending=2, **dict(GREEDY, min_tokens=5))], VOCAB).plain_greedy


def test_ids_draw_equals_logits_draw():
    logits = torch.randn(3, VOCAB, generator=torch.Generator().manual_seed(0))
    rows = [row(**GREEDY) for _ in range(3)]
    sampler = Sampler()
    from_logits = sampler.draw(logits, rows)
    from_ids = sampler.draw_greedy_ids(logits.argmax(dim=-1), rows)
    assert torch.equal(from_ids.token_ids, from_logits.token_ids)
    assert torch.equal(from_ids.transfer, from_logits.transfer)
    assert sampler.finish(from_ids, from_ids.transfer.tolist(), None).token_ids == logits.argmax(-1).tolist()
    with pytest.raises(ValueError, match="greedy ids"):
        sampler.draw_greedy_ids(logits.argmax(dim=-1)[:2], rows)
