"""`logit_bias` (OpenAI's token id -> bias in [-100, 100]): checked at the edge, carried on the
wire with string keys, refused at admission for ids past the vocabulary, and applied by the
sampler to its rows only (greedy and sampled, with async scheduling too)."""

import pytest

from infer_cluster.protocol import InvalidRequestError, SamplingParams
from infer_cluster.protocol.codec import decode, encode
from infer_cluster.protocol.messages import SubmitRequest
from infer_cluster.worker import LLM


@pytest.fixture(scope="module")
def llm():
    return LLM("tiny-random", num_kv_blocks=64, block_size=16, max_model_len=512)


def test_params_and_wire():
    p = SamplingParams(logit_bias={"7": 100, 9: -100.0})
    assert p.logit_bias == {7: 100.0, 9: -100.0}
    assert p.to_dict()["logit_bias"] == {"7": 100.0, "9": -100.0}
    assert SamplingParams.from_dict(p.to_dict()) == p
    assert SamplingParams(logit_bias={}).logit_bias is None
    big = SamplingParams(logit_bias={t: -1.0 for t in range(256)})  # the most the wire carries
    msg = SubmitRequest(request_id="r", prompt="hi", sampling_params=big.to_dict())
    assert SamplingParams.from_dict(decode(encode(msg)).sampling_params) == big
    for bad in ({"x": 1}, {-1: 1}, {5: 100.5}, {5: float("nan")}, {5: True}, [1, 2],
                {t: 1.0 for t in range(257)}):
        with pytest.raises(InvalidRequestError, match="logit_bias"):
            SamplingParams(logit_bias=bad)


def test_bias_forces_and_bans(llm):
    base = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    free = llm.generate("Hello", base, use_tqdm=False)[0].token_ids
    forced = llm.generate("Hello", SamplingParams(temperature=0, max_tokens=8, ignore_eos=True,
                                                  logit_bias={42: 100}), use_tqdm=False)[0]
    assert forced.token_ids == [42] * 8
    banned = llm.generate("Hello", SamplingParams(temperature=0, max_tokens=8, ignore_eos=True,
                                                  logit_bias={t: -100 for t in set(free)}),
                          use_tqdm=False)[0]
    assert not set(banned.token_ids) & set(free)
    sampled = llm.generate(["Hello"] * 3, [SamplingParams(temperature=1.0, seed=s, max_tokens=10,
                                                          ignore_eos=True, logit_bias={17: 100})
                                           for s in range(3)], use_tqdm=False)
    assert all(o.token_ids == [17] * 10 for o in sampled)
    # a row without a bias in the same batch is untouched
    mixed = llm.generate(["Hello", "Hello"], [base, SamplingParams(temperature=0, max_tokens=8,
                                                                   ignore_eos=True, logit_bias={42: 100})],
                         use_tqdm=False)
    assert mixed[0].token_ids == free and mixed[1].token_ids == [42] * 8


def test_ids_past_the_vocabulary_are_refused(llm):
    with pytest.raises(InvalidRequestError, match="logit_bias names token 100000"):
        llm.generate("Hello", SamplingParams(logit_bias={100000: 5}), use_tqdm=False)


def test_async_scheduling():
    fast = LLM("tiny-random", num_kv_blocks=64, block_size=16, max_model_len=512, async_scheduling=True)
    o = fast.generate("Hello", SamplingParams(temperature=0, max_tokens=6, ignore_eos=True,
                                              logit_bias={42: 100}), use_tqdm=False)[0]
    assert o.token_ids == [42] * 6
