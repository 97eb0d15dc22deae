"""Batched sampling ops against plain references: kept sets (top-k / top-p / min-p, with ties),
the inverse-CDF draw, Philox uniforms, and seeded rows independent of the batch around them.

The kept-set reference sorts nothing clever: for each token it sums the probability of every
strictly greater logit (an O(vocab^2) comparison), in float64, from the same float32
exp((x - max) / T) the sampler uses, so only float rounding at a top-p boundary can differ;
such rows are flagged and must be rare.
"""

import itertools
import random

import numpy as np
import pytest
import torch

from infer_cluster.protocol.sampling_params import SamplingParams
from infer_cluster.worker.sampling.random_stream import philox4x32, step_uniforms
from infer_cluster.worker.sampling.sampler import Sampler
from infer_cluster.worker.sampling.draw_io import SamplingRequestState
from infer_cluster.worker.sampling.ops import (BLOCK, TOP_P_CANDIDATES, RandomRows, kept_mask,
                                               sample_random_rows)

VOCAB = 2 * BLOCK + 44  # several blocks, and more than TOP_P_CANDIDATES columns
assert VOCAB > TOP_P_CANDIDATES


def random_rows(params: list[tuple], uniforms=None) -> RandomRows:
    """params: (temperature, top_k, top_p, min_p) per row."""
    n = len(params)
    u = torch.tensor(uniforms if uniforms is not None else [0.5] * n, dtype=torch.float64)
    col = lambda j, dt: torch.tensor([p[j] for p in params], dtype=dt)  # noqa: E731
    return RandomRows(temperature=col(0, torch.float32), top_k=col(1, torch.long), top_p=col(2, torch.float32),
                      min_p=col(3, torch.float32), uniform=u, host_top_k=[p[1] for p in params],
                      host_top_p=[p[2] for p in params], host_min_p=[p[3] for p in params])


def reference_kept(x: torch.Tensor, temperature: float, top_k: int, top_p: float, min_p: float):
    """(kept [vocab] bool, float32 weights, ambiguous: a top-p boundary within rounding)."""
    inv_t = 1.0 / torch.tensor(temperature, dtype=torch.float32)
    w = torch.exp((x - x.max()) * inv_t)
    keep = w > 0
    if 0 < top_k < len(x):
        keep &= x >= x.sort(descending=True).values[top_k - 1]
    ambiguous = False
    if top_p < 1.0:
        wk = torch.where(keep, w.double(), 0.0)
        before = (x.unsqueeze(0) > x.unsqueeze(1)).double() @ wk  # mass of strictly greater
        target = float(torch.tensor(top_p, dtype=torch.float32)) * wk.sum()
        ambiguous = bool(((before - target).abs() < 1e-5 * wk.sum()).any())
        keep &= before < target
    if min_p > 0:
        keep &= w >= torch.tensor(min_p, dtype=torch.float32)
    return keep, w, ambiguous


def logits_cases(seed: int):
    g = torch.Generator().manual_seed(seed)
    yield torch.randn(VOCAB, generator=g)                                  # smooth
    yield torch.randn(VOCAB, generator=g) * 6                              # peaky
    yield (torch.randn(VOCAB, generator=g) * 2).round() / 2                # many ties
    x = torch.randn(VOCAB, generator=g) * 0.1
    x[torch.randperm(VOCAB, generator=g)[:40]] = 3.0                       # 40-way tie at the top
    yield x
    x = torch.full((VOCAB,), -1.0)
    x[torch.randperm(VOCAB, generator=g)[:3]] = torch.tensor([2.0, 1.0, 1.0])
    yield x                                                                # a flat tail tied past k


PARAMS = [(t, k, p, mp) for t, k, p, mp in itertools.product(
    [0.5, 1.0, 2.0], [0, 1, 5, 50, VOCAB - 3, VOCAB], [1.0, 0.3, 0.9, 0.995], [0.0, 0.05, 0.5])]


@pytest.mark.parametrize("seed", [0, 1])
def test_kept_sets_equal_the_sorted_reference(seed):
    rows, xs = [], []
    for x in logits_cases(seed):
        for p in PARAMS:
            rows.append((p[0], p[1] if p[1] < VOCAB else 0, p[2], p[3]))
            xs.append(x)
    x = torch.stack(xs)
    got = kept_mask(x, random_rows(rows))
    ambiguous = mismatched = 0
    for i, (t, k, p, mp) in enumerate(rows):
        want, _, amb = reference_kept(x[i], t, k, p, mp)
        ambiguous += amb
        if not torch.equal(got[i], want):
            assert amb, f"row {i} (T={t}, top_k={k}, top_p={p}, min_p={mp}): kept sets differ"
            mismatched += 1
    assert ambiguous <= len(rows) // 50, "the cases should rarely sit on a rounding boundary"


def test_kept_sets_of_the_previous_sort_based_sampler_without_ties():
    """With distinct logits the tie rule cannot matter: the old sort + cumsum definition
    (the smallest prefix whose mass reaches top_p, after top-k) gives the same sets."""
    g = torch.Generator().manual_seed(3)
    x = torch.randn(60, VOCAB, generator=g) * torch.linspace(0.5, 6, 60).unsqueeze(1)
    params = [(random.Random(i).choice([0.7, 1.0, 1.5]), [0, 20, 200][i % 3], [0.5, 0.9, 0.99, 1.0][i % 4],
               [0.0, 0.1][i % 2]) for i in range(60)]
    got = kept_mask(x, random_rows(params))
    for i, (t, k, p, mp) in enumerate(params):
        s, order = (x[i] / t).sort(descending=True)
        keep = torch.ones(VOCAB, dtype=torch.bool)
        if k:
            keep &= s >= s[k - 1]
        probs = torch.where(keep, s, float("-inf")).softmax(-1)
        if p < 1.0:
            keep &= (probs.cumsum(-1) - probs) < p
        probs = torch.where(keep, s, float("-inf")).softmax(-1)
        if mp:
            keep &= probs >= mp * probs.max()
        want = torch.zeros(VOCAB, dtype=torch.bool).scatter(0, order, keep)
        assert torch.equal(got[i], want), f"row {i}: {params[i]}"


def reference_draw(x, t, k, p, mp, u):
    keep, w, amb = reference_kept(x, t, k, p, mp)
    weights = torch.where(keep, w.double(), 0.0)
    cum = weights.cumsum(0)
    target = u * cum[-1]
    tok = int(torch.searchsorted(cum, target.unsqueeze(0), right=True))
    last = int(keep.nonzero().max())
    return min(tok, last), cum, target, amb


def test_draw_is_the_inverse_cdf_in_token_order_on_every_path():
    cases = [(x, p) for x in logits_cases(5) for p in PARAMS[::7]]
    rng = random.Random(0)
    us = [rng.random() for _ in cases]
    x = torch.stack([c[0] for c in cases])
    params = [(p[0], p[1] if p[1] < VOCAB else 0, p[2], p[3]) for _, p in cases]
    got = sample_random_rows(x, random_rows(params, us)).tolist()
    for i, (tok, prm, u) in enumerate(zip(got, params, us)):
        want, cum, target, amb = reference_draw(x[i], *prm, u)
        if tok != want and not amb:
            # Only a target within float rounding of the boundary between the two may differ.
            edge = cum[min(tok, want)]
            assert abs(float(edge - target)) < 1e-6 * float(cum[-1]), f"row {i} {prm}: {tok} != {want}"


def test_full_path_draw_matches_the_distribution_across_blocks():
    # Mass spread over tokens in different blocks plus a flat tail; temperature only, so the
    # two-level draw over the whole vocabulary is used.
    x = torch.full((VOCAB,), -2.0)
    heavy = [3, BLOCK + 7, 2 * BLOCK + 1, VOCAB - 1]
    x[heavy] = torch.tensor([1.0, 1.5, 0.5, 2.0])
    n = 20000
    us = step_uniforms(list(range(n)), [0] * n)[:, 0]
    got = sample_random_rows(x.expand(n, VOCAB).contiguous(), random_rows([(1.0, 0, 1.0, 0.0)] * n, us))
    probs = x.softmax(-1).double()
    counts = torch.bincount(got, minlength=VOCAB).double()
    buckets = [[t] for t in heavy] + [[t for t in range(VOCAB) if t not in heavy]]
    obs = [float(counts[b].sum()) for b in buckets]
    exp = [float(probs[b].sum()) * n for b in buckets]
    chi2 = sum((o - e) ** 2 / e for o, e in zip(obs, exp))
    assert chi2 < 18.467  # chi2.ppf(0.999, df=4)


# ---------------------------------------------------------------- random stream

def test_philox_known_answers():
    # Random123's known-answer vectors for philox4x32-10.
    cases = [((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
             ((0xFFFFFFFF,) * 4, (0xFFFFFFFF,) * 2, (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
             ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
              (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1))]
    for ctr, key, want in cases:
        got = philox4x32([np.array([c], dtype=np.uint64) for c in ctr],
                         [np.array([k], dtype=np.uint64) for k in key])
        assert tuple(int(w[0]) for w in got) == want


def test_step_uniforms_depend_only_on_seed_and_step():
    seeds, steps = [7, 7, 8, 2**63 - 1, 0], [0, 1, 0, 2**40, 3]
    u = step_uniforms(seeds, steps)
    assert u.shape == (5, 2) and (u >= 0).all() and (u < 1).all()
    alone = np.stack([step_uniforms([s], [t])[0] for s, t in zip(seeds, steps)])
    assert np.array_equal(u, alone)
    assert len({tuple(r) for r in u}) == 5
    many = step_uniforms([1] * 100000, range(100000))[:, 0]
    assert abs(many.mean() - 0.5) < 0.005 and abs((many < 0.1).mean() - 0.1) < 0.005


# ---------------------------------------------------------------- seeded rows in any batch

def test_seeded_rows_do_not_depend_on_the_batch_around_them():
    g = torch.Generator().manual_seed(11)
    steps = [torch.randn(VOCAB, generator=g) * 2 for _ in range(8)]
    seeded = [SamplingParams(temperature=0.9, top_p=0.9, top_k=40, seed=1),
              SamplingParams(temperature=1.1, seed=2),
              SamplingParams(temperature=0.8, top_p=0.5, seed=3, repetition_penalty=1.3),
              SamplingParams(temperature=1.0, min_p=0.2, top_k=VOCAB - 2, seed=4)]
    others = [SamplingParams(top_k=200), SamplingParams(top_p=0.95), SamplingParams(temperature=0.0),
              SamplingParams(frequency_penalty=0.5, logprobs=3), SamplingParams(top_k=3, min_p=0.1)]

    def run(with_others: bool, order: list[int]):
        sampler = Sampler(default_generator=torch.Generator().manual_seed(0))
        outs = {i: [] for i in order}
        for logits in steps:
            rows = [SamplingRequestState(seeded[i], [1, 2, 3], list(outs[i]), None, [], f"s{i}") for i in order]
            if with_others:
                for j, p in enumerate(others):
                    rows.insert(j % (len(rows) + 1), SamplingRequestState(p, [4], [], None, [], None))
            res = sampler(torch.stack([logits] * len(rows)), rows)
            for r, t in zip(rows, res.token_ids):
                if r.request_id is not None:
                    outs[int(r.request_id[1:])].append(t)
        return outs

    alone = run(False, [0, 1, 2, 3])
    assert run(True, [3, 1, 0, 2]) == alone
    assert len({tuple(v) for v in alone.values()}) == 4


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_draws_the_same_tokens_as_the_cpu():
    cases = [(x, p) for x in logits_cases(9) for p in PARAMS]
    us = step_uniforms(list(range(len(cases))), [3] * len(cases))[:, 0]
    x = torch.stack([c[0] for c in cases])
    params = [(p[0], p[1] if p[1] < VOCAB else 0, p[2], p[3]) for _, p in cases]
    cpu = sample_random_rows(x, random_rows(params, us))
    rows = random_rows(params, us)
    for name in ("temperature", "top_k", "top_p", "min_p", "uniform"):
        setattr(rows, name, getattr(rows, name).cuda())
    cuda = sample_random_rows(x.cuda(), rows).cpu()
    # Integer-keyed uniforms are identical; only float rounding at a CDF boundary may differ.
    assert (cpu != cuda).sum() <= len(cases) // 200


@pytest.mark.parametrize("seed", range(6))
def test_topk_by_blocks_equals_torch_topk(seed):
    """Same values as torch.topk (ties included: bf16-rounded logits), ids that hold them,
    winners in the ragged tail block too (and a vocabulary of whole blocks, with no tail)."""
    from infer_cluster.worker.sampling.ops import TOPK_BLOCK, topk_by_blocks
    g = torch.Generator().manual_seed(seed)
    vocab = 9000 + 1237 * seed if seed < 5 else 80 * TOPK_BLOCK
    x = torch.randn(5, vocab, generator=g).to(torch.bfloat16).float()
    if seed % 2:
        x[:, -3:] += 8.0
    for k in (1, 5, 50, 58, 300):
        vals, ids = topk_by_blocks(x, k)
        assert torch.equal(vals, x.topk(k, dim=-1).values)
        assert torch.equal(x.gather(1, ids), vals)
        assert all(len(set(r)) == k for r in ids.tolist())


def _philox_word_by_word(counter, key, rounds=10):
    """Philox4x32 written out one 32-bit word at a time (the paper's round), for comparison."""
    m = np.uint64(0xFFFFFFFF)
    c0, c1, c2, c3 = (np.asarray(c, dtype=np.uint64) & m for c in counter)
    k0, k1 = (np.asarray(k, dtype=np.uint64) & m for k in key)
    for _ in range(rounds):
        p0, p2 = np.uint64(0xD2511F53) * c0, np.uint64(0xCD9E8D57) * c2
        c0, c1, c2, c3 = ((p2 >> np.uint64(32)) ^ c1 ^ k0, p2 & m, (p0 >> np.uint64(32)) ^ c3 ^ k1, p0 & m)
        k0, k1 = (k0 + np.uint64(0x9E3779B9)) & m, (k1 + np.uint64(0xBB67AE85)) & m
    return [c0, c1, c2, c3]


def test_philox_equals_the_word_by_word_round_on_random_words():
    rng = np.random.default_rng(0)
    words = [rng.integers(0, 2**32, 500, dtype=np.uint64) for _ in range(6)]
    for rounds in (1, 7, 10):
        got = philox4x32(words[:4], words[4:], rounds)
        want = _philox_word_by_word(words[:4], words[4:], rounds)
        for g, w in zip(got, want):
            assert np.array_equal(g, w)
    # scalar key words broadcast against array counters (one seed, many offsets)
    got = philox4x32(words[:4], [np.uint64(5), np.uint64(2**32 - 1)])
    want = _philox_word_by_word(words[:4], [np.uint64(5), np.uint64(2**32 - 1)])
    assert all(np.array_equal(g, w) for g, w in zip(got, want))
