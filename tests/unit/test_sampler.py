"""Sampler: greedy, seeded reproducibility, distributions, filters, penalties, min_tokens, logprobs.

Distribution checks use Pearson's chi-square against hard-coded 0.999 critical values (no
scipy), with generators seeded deterministically so every run draws the same numbers.
"""

import math

import pytest
import torch
from hypothesis import given, settings, strategies as st

from infer_cluster.protocol.sampling_params import SamplingParams
from infer_cluster.worker.sampling.sampler import Sampler
from infer_cluster.worker.sampling.draw_io import SamplerOutput, SamplingRequestState

# chi2.ppf(0.999, df) for df = 1..7 (standard tables).
CHI2_CRIT_999 = {1: 10.828, 2: 13.816, 3: 16.266, 4: 18.467, 5: 20.515, 6: 22.458, 7: 24.322}

LOGITS8 = [0.0, 0.5, 1.0, 1.5, -1.0, 2.0, 0.3, -0.5]
NUM_DRAWS = 20000


def row(prompt=(), output=(), generator=None, eos=(), **params):
    return SamplingRequestState(params=SamplingParams(**params), prompt_token_ids=list(prompt),
                                output_token_ids=list(output), generator=generator,
                                eos_token_ids=list(eos))


def gen(seed):
    return torch.Generator().manual_seed(seed)


def softmax(xs):
    m = max(xs)
    e = [math.exp(v - m) for v in xs]
    return [v / sum(e) for v in e]


def chi_square(counts, probs):
    n = sum(counts)
    return sum((c - n * p) ** 2 / (n * p) for c, p in zip(counts, probs))


def draw_many(logits, num=NUM_DRAWS, seeded_rows=False, **params):
    """`num` independent draws from one logits vector, all in one batch."""
    batch = torch.tensor([logits] * num)
    if seeded_rows:
        rows = [row(generator=gen(1000 + i), **params) for i in range(num)]
        out = Sampler()(batch, rows)
    else:
        out = Sampler(default_generator=gen(1234))(batch, [row(**params)] * num)
    counts = [0] * len(logits)
    for t in out.token_ids:
        counts[t] += 1
    return counts


# ---------------------------------------------------------------- greedy

def test_greedy_is_argmax_in_any_dtype():
    logits = torch.randn(6, 50, generator=gen(0))
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        out = Sampler()(logits.to(dtype), [row(temperature=0.0) for _ in range(6)])
        assert out.token_ids == logits.to(dtype).argmax(-1).tolist()
        assert out.logprobs == [None] * 6
        assert all(type(t) is int for t in out.token_ids)


def test_greedy_ties_go_to_lowest_id():
    logits = torch.tensor([[1.0, 3.0, 3.0, 0.0], [5.0, 5.0, 5.0, 5.0]])
    assert Sampler()(logits, [row(temperature=0.0)] * 2).token_ids == [1, 0]


def test_top_k_1_is_greedy_at_temperature_1_in_a_mixed_batch():
    logits = torch.randn(8, 30, generator=gen(1))
    rows = [row(top_k=1) if i % 2 else row(temperature=1.0, generator=gen(i)) for i in range(8)]
    out = Sampler()(logits, rows)
    expected = logits.argmax(-1).tolist()
    assert [out.token_ids[i] for i in range(1, 8, 2)] == [expected[i] for i in range(1, 8, 2)]


def test_bad_logits_shape_is_rejected():
    with pytest.raises(ValueError, match="logits"):
        Sampler()(torch.zeros(3, 10), [row()] * 2)
    assert Sampler()(torch.zeros(0, 10), []) == SamplerOutput(token_ids=[], logprobs=[])


# ---------------------------------------------------------------- seeded reproducibility

def run_steps(seed_order, others, num_steps=12, vocab=64):
    """Decode `num_steps` steps with seeded rows in `seed_order` plus `others` unseeded rows."""
    logits_gen = gen(7)
    logits = [torch.randn(vocab, generator=logits_gen) * 0.3 for _ in range(num_steps)]
    gens = {s: gen(s) for s in seed_order}
    tokens = {s: [] for s in seed_order}
    sampler = Sampler(default_generator=gen(99))
    for step in range(num_steps):
        rows = [row(generator=gens[s], seed=s, output=tokens[s]) for s in seed_order]
        rows[others:others] = [row(top_p=0.9) for _ in range(others)]  # unseeded, mid-batch
        out = sampler(torch.stack([logits[step]] * len(rows)), rows)
        seeded_ids = out.token_ids[:others] + out.token_ids[2 * others:]
        for s, t in zip(seed_order, seeded_ids):
            tokens[s].append(t)
    return tokens


def test_seeded_rows_reproduce_regardless_of_batch():
    alone = run_steps([1, 2, 3], others=0)
    shuffled = run_steps([3, 1, 2], others=2)
    assert alone == shuffled
    assert len(set(map(tuple, alone.values()))) == 3, "different seeds must give different tokens"


def test_default_generator_makes_unseeded_batches_reproducible():
    logits = torch.zeros(16, 100)
    a = Sampler(default_generator=gen(5))(logits, [row()] * 16).token_ids
    b = Sampler(default_generator=gen(5))(logits, [row()] * 16).token_ids
    c = Sampler(default_generator=gen(6))(logits, [row()] * 16).token_ids
    assert a == b and a != c


# ---------------------------------------------------------------- distributions

@pytest.mark.parametrize("seeded_rows", [False, True])
def test_temperature_1_matches_softmax(seeded_rows):
    counts = draw_many(LOGITS8, seeded_rows=seeded_rows)
    assert chi_square(counts, softmax(LOGITS8)) < CHI2_CRIT_999[7]


@pytest.mark.parametrize("temperature", [0.5, 2.0])
def test_temperature_scales_the_distribution(temperature):
    counts = draw_many(LOGITS8, temperature=temperature)
    scaled = softmax([v / temperature for v in LOGITS8])
    assert chi_square(counts, scaled) < CHI2_CRIT_999[7]
    # ... and it is measurably not the unscaled distribution.
    assert chi_square(counts, softmax(LOGITS8)) > 10 * CHI2_CRIT_999[7]


def kept_distribution(keep):
    probs = softmax(LOGITS8)
    mass = sum(probs[t] for t in keep)
    return [probs[t] / mass for t in keep]


def assert_only_kept(counts, keep):
    emitted = {t for t, c in enumerate(counts) if c}
    assert emitted == set(keep)
    kept_counts = [counts[t] for t in keep]
    if len(keep) > 1:
        assert chi_square(kept_counts, kept_distribution(keep)) < CHI2_CRIT_999[len(keep) - 1]


# LOGITS8 sorted by probability: 5 (0.378), 3 (0.229), 2 (0.139), 1 (0.084), 6 (0.069),
# 0 (0.051), 7 (0.031), 4 (0.019).
@pytest.mark.parametrize("params, keep", [
    (dict(top_k=3), [5, 3, 2]),
    (dict(top_k=100), list(range(8))),
    (dict(top_p=0.65), [5, 3, 2]),   # 0.378 + 0.229 = 0.607 < 0.65, so 2 is needed
    (dict(top_p=0.55), [5, 3]),
    (dict(top_p=0.01), [5]),         # the top token always stays
    (dict(min_p=0.3), [5, 3, 2]),    # threshold 0.113: drops 1 (0.084)
    (dict(min_p=1.0), [5]),
    # top_p sees the top_k survivors renormalised: 0.378 / (0.378 + 0.229) = 0.62 >= 0.6.
    (dict(top_k=2, top_p=0.6), [5]),
    (dict(top_k=4, top_p=0.8, min_p=0.5), [5, 3]),  # min_p drops 2 (0.186 < 0.5 * 0.506)
])
def test_filters_never_emit_excluded_tokens(params, keep):
    assert_only_kept(draw_many(LOGITS8, num=8000, **params), keep)


def test_top_k_keeps_ties_with_the_kth_value():
    counts = draw_many([2.0, 1.0, 1.0, 0.0], num=2000, top_k=2)
    assert counts[0] and counts[1] and counts[2] and counts[3] == 0


# ---------------------------------------------------------------- penalties

def reference_penalties(logits, prompt, output, p):
    """Plain-Python penalties, written from the definitions."""
    out = list(logits)
    for t in set(prompt) | set(output):
        out[t] = out[t] / p.repetition_penalty if out[t] > 0 else out[t] * p.repetition_penalty
    for t in set(output):
        out[t] -= p.frequency_penalty * output.count(t) + p.presence_penalty
    n = p.no_repeat_ngram_size
    if n:
        seq = list(prompt) + list(output)
        ngrams = [tuple(seq[i:i + n]) for i in range(len(seq) - n + 1)]
        last = tuple(seq[len(seq) - (n - 1):]) if n > 1 else ()
        for g in ngrams:
            if g[:-1] == last:
                out[g[-1]] = float("-inf")
    return out


def penalised_logprobs(logits, rows):
    """Full log-distribution each row's sampler saw, read back through logprobs=vocab."""
    out = Sampler()(torch.tensor(logits), rows)
    vocab = len(logits[0])
    result = []
    for entry in out.logprobs:
        alts = entry[1]
        assert len(alts) == vocab
        result.append([alts[t] for t in range(vocab)])
    return out, result


def assert_logprobs_match(got, logits_ref):
    m = max(logits_ref)
    z = math.log(sum(math.exp(v - m) for v in logits_ref if v != float("-inf")))
    want = [v - m - z for v in logits_ref]
    for g, w in zip(got, want):
        if w == float("-inf"):
            assert g == float("-inf")
        else:
            assert g == pytest.approx(w, abs=1e-4)


HAND_LOGITS = [2.0, -1.0, 0.5, -0.5, 3.0, 0.0, 1.5, -2.0, 1.0, 0.25]
HAND_PROMPT = [0, 1, 2, 0]
HAND_OUTPUT = [2, 3, 3, 4, 3]


@pytest.mark.parametrize("params", [
    dict(repetition_penalty=2.0),
    dict(repetition_penalty=0.5),
    dict(frequency_penalty=0.7),
    dict(presence_penalty=1.5),
    dict(frequency_penalty=-0.5, presence_penalty=0.3, repetition_penalty=1.3),
    dict(no_repeat_ngram_size=1),
    dict(no_repeat_ngram_size=2),
])
def test_penalties_match_reference(params):
    rows = [row(HAND_PROMPT, HAND_OUTPUT, temperature=0.0, logprobs=10, **params),
            row(HAND_PROMPT, HAND_OUTPUT, temperature=0.0, logprobs=10)]  # untouched neighbour
    out, got = penalised_logprobs([HAND_LOGITS, HAND_LOGITS], rows)
    ref = reference_penalties(HAND_LOGITS, HAND_PROMPT, HAND_OUTPUT, rows[0].params)
    assert ref != HAND_LOGITS, "the case must change something"
    assert_logprobs_match(got[0], ref)
    assert_logprobs_match(got[1], HAND_LOGITS)
    assert out.token_ids[0] == max(range(10), key=lambda t: (ref[t], -t))


def test_greedy_without_logprobs_still_applies_penalties():
    # Raw argmax is token 4 (3.0); penalising it (and the prompt's token 0) leaves 6 (1.5) on top.
    rows = [row(HAND_PROMPT, HAND_OUTPUT, temperature=0.0, repetition_penalty=2.5),
            row(HAND_PROMPT, HAND_OUTPUT, temperature=0.0, no_repeat_ngram_size=1),
            row(HAND_PROMPT, HAND_OUTPUT, temperature=0.0)]
    assert Sampler()(torch.tensor([HAND_LOGITS] * 3), rows).token_ids == [6, 6, 4]


@pytest.mark.parametrize("seq, n, banned", [
    ([1, 2, 3, 1, 2], 3, {3}),
    ([1, 2, 3, 1, 2], 2, {3}),
    ([1, 2, 1, 2, 1], 2, {2}),
    ([5, 6, 5, 7, 5], 2, {6, 7}),
    ([1, 2, 3], 4, set()),
    ([4, 4, 4], 3, {4}),
])
def test_no_repeat_ngram_hand_cases(seq, n, banned):
    logits = [0.0] * 8
    _, got = penalised_logprobs([logits], [row(seq[:2], seq[2:], temperature=0.0, logprobs=8,
                                               no_repeat_ngram_size=n)])
    assert {t for t, v in enumerate(got[0]) if v == float("-inf")} == banned


@settings(max_examples=150, deadline=None)
@given(logits=st.lists(st.floats(-5, 5), min_size=12, max_size=12),
       prompt=st.lists(st.integers(0, 11), max_size=6),
       output=st.lists(st.integers(0, 11), max_size=5),  # 11 tokens can't ban all 12
       rep=st.floats(0.5, 2.0), freq=st.floats(-2, 2), pres=st.floats(-2, 2),
       n=st.integers(0, 4))
def test_penalties_property(logits, prompt, output, rep, freq, pres, n):
    r = row(prompt, output, temperature=0.0, logprobs=12, repetition_penalty=rep,
            frequency_penalty=freq, presence_penalty=pres, no_repeat_ngram_size=n)
    _, got = penalised_logprobs([logits], [r])
    assert_logprobs_match(got[0], reference_penalties(logits, prompt, output, r.params))


def test_caller_logits_are_not_modified():
    logits = torch.tensor([HAND_LOGITS])
    before = logits.clone()
    Sampler()(logits, [row(HAND_PROMPT, HAND_OUTPUT, eos=[4], min_tokens=9, repetition_penalty=2.0,
                           no_repeat_ngram_size=1, generator=gen(0))])
    assert torch.equal(logits, before)


# ---------------------------------------------------------------- min_tokens

def test_min_tokens_suppresses_eos_and_stop_ids():
    logits = torch.tensor([[0.0, 1.0, 9.0, 0.5, 8.0]] * 2)
    early = row(output=[1], eos=[2], min_tokens=3, stop_token_ids=[4], temperature=0.0, logprobs=5)
    done = row(output=[1, 1, 1], eos=[2], min_tokens=3, stop_token_ids=[4], temperature=0.0)
    out = Sampler()(logits, [early, done])
    assert out.token_ids == [1, 2]
    alts = out.logprobs[0][1]
    assert alts[2] == alts[4] == float("-inf")


def test_min_tokens_holds_for_random_rows():
    counts = draw_many([3.0, 0.0, 3.0, 0.0], num=4000, eos=[0], stop_token_ids=[2], min_tokens=1)
    assert counts[0] == counts[2] == 0 and counts[1] and counts[3]


# ---------------------------------------------------------------- logprobs

def test_logprobs_are_the_model_distribution():
    logits = torch.randn(4, 40, generator=gen(3))
    rows = [row(temperature=0.0, logprobs=5),
            row(temperature=0.7, top_k=10, logprobs=3, generator=gen(1)),
            row(temperature=1.3, logprobs=0, generator=gen(2)),
            row(temperature=0.0)]
    out = Sampler()(logits.to(torch.bfloat16), rows)
    reference = torch.log_softmax(logits.to(torch.bfloat16).float(), dim=-1)  # HF: on raw logits
    for i, n in enumerate([5, 3, 0]):
        sampled_lp, alts = out.logprobs[i]
        assert sampled_lp == pytest.approx(reference[i, out.token_ids[i]].item(), abs=1e-6)
        top = reference[i].topk(n) if n else None
        assert list(alts) == (top.indices.tolist() if n else [])
        assert list(alts.values()) == pytest.approx(top.values.tolist() if n else [], abs=1e-6)
    assert out.logprobs[2][1] == {}
    assert out.logprobs[3] is None


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_random_rows_on_cuda_logits_use_the_engines_cpu_generators():
    # The engine seeds CPU generators; CUDA's exponential_ refuses a CPU generator, which used
    # to fail every step that held a random row (and the greedy rows batched with it).
    logits = torch.tensor([LOGITS8] * 3, device="cuda")
    rows = [row(temperature=1.0), row(temperature=1.0, generator=gen(7)), row(temperature=0)]
    out = Sampler(default_generator=gen(1))(logits, rows)
    again = Sampler(default_generator=gen(1))(logits, [rows[0], row(temperature=1.0, generator=gen(7)),
                                                       rows[2]])
    assert out.token_ids[1] == again.token_ids[1]
    assert out.token_ids[2] == 5


# ---------------------------------------------------------------- rows the candidate path flags

def test_flagged_rows_are_redone_in_finish_and_reported(monkeypatch):
    """With 2 candidates, flat top-p rows are flagged by the draw and redone by `finish`: the
    ids (seeded), sampled logprobs and the next step's penalties equal the default path's; the
    rows whose id changed are reported and their penalty state is rebuilt from the lists."""
    from infer_cluster.worker.sampling import ops as sampling_ops

    vocab, n = 64, 12
    logits = [torch.randn(n, vocab, generator=gen(s)) * 0.2 for s in (1, 2)]

    def run():
        sampler = Sampler(gen(5))
        rows = [SamplingRequestState(SamplingParams(temperature=2.0, top_p=0.95, seed=30 + i, logprobs=1,
                                                    repetition_penalty=1.5, presence_penalty=0.5),
                                     [1, 2, 3], [], None, (), f"r{i}") for i in range(n)]
        first = sampler(logits[0].clone(), rows)
        for r, t in zip(rows, first.token_ids):
            r.output_token_ids.append(t)
        return first, sampler(logits[1].clone(), rows), sampler

    want_first, want_second, _ = run()
    assert want_first.redrawn == []  # 256 candidates: nothing to redo at this vocabulary
    monkeypatch.setattr(sampling_ops, "TOP_P_CANDIDATES", 2)
    first, second, sampler = run()
    assert first.token_ids == want_first.token_ids and second.token_ids == want_second.token_ids
    assert first.redrawn and set(first.redrawn) <= set(range(n))
    for a, b in zip(first.logprobs + second.logprobs, want_first.logprobs + want_second.logprobs):
        assert a[0] == pytest.approx(b[0], abs=1e-9) and a[1].keys() == b[1].keys()
