"""The chained verify step's device inputs (kernels/spec_chain.py): the Triton kernel (under the
interpreter here) equals the plain-torch reference, and the reference equals the host's rules,
prompt lookup by `NgramIndex` and acceptance by `num_accepted`, on random repetitive texts."""

import random

import pytest
import torch

from infer_cluster.kernels.spec_chain import META_HEAD, chain_inputs, lookup
from infer_cluster.worker.spec_decode.ngram import NgramIndex
from infer_cluster.worker.spec_decode.verify import num_accepted

PAGE = 16


def text(rng, size, vocab=12):
    """Tokens that repeat themselves now and then (so lookups find occurrences)."""
    out = [rng.randrange(vocab) for _ in range(4)]
    while len(out) < size:
        if rng.random() < 0.5 and len(out) > 6:
            start = rng.randrange(len(out) - 3)
            out.extend(out[start:start + rng.randrange(2, 8)])
        else:
            out.append(rng.randrange(vocab))
    return out[:size]


def case(seed, slots=5, k_prev=4, ks=(5, 0, 3, 5, 1), kmax=8, width=64, keep=None):
    """A step before (uneven proposals a slot, some right, some wrong) over random texts, and
    a chained step giving slot i ks[i] proposal positions; `keep`: the slots the chained step
    continues, in its order (default all)."""
    rng = random.Random(seed)
    hist = torch.zeros(slots + 1, width * PAGE, dtype=torch.int32)
    meta = torch.zeros(slots + 1, META_HEAD + kmax + 1, dtype=torch.int32)
    draws, texts, props_of = [], [], []
    for i in range(slots):
        tokens = text(rng, rng.randrange(10, 300))
        k = rng.randrange(0, k_prev + 1)
        props = [rng.randrange(12) for _ in range(k)]
        kept = rng.randrange(0, k + 1)
        row_draws = props[:kept] + [rng.randrange(12) for _ in range(k + 1 - kept)]
        meta[i, :META_HEAD + k] = torch.tensor([len(tokens), len(draws), k, 0, *props])
        hist[i, :len(tokens)] = torch.tensor(tokens)
        draws += row_draws
        texts.append(tokens)
        props_of.append(props)
    keep = list(range(slots)) if keep is None else list(keep)
    ks = [ks[i] for i in keep]  # in the chained step's order
    firsts = [sum(k + 1 for k in ks[:g]) for g in range(len(keep))]
    tables = torch.zeros(sum(k + 1 for k in ks), width, dtype=torch.int32)
    for g in range(len(keep)):
        tables[firsts[g]:firsts[g] + ks[g] + 1] = torch.randperm(500)[:width].to(torch.int32)
    layout = torch.tensor([firsts, ks, keep], dtype=torch.int32)
    return torch.tensor(draws + [0] * 3), hist, meta, layout, tables, texts, props_of


def run(draws, hist, meta, layout, tables, min_n=2, max_n=4):
    rows = int(layout[1].sum()) + layout.shape[1]
    out = tuple(torch.full((rows + 2,), -7, dtype=dtype, device=hist.device)
                for dtype in (torch.int64, torch.int64, torch.int64, torch.int32))
    hist, meta = hist.clone(), meta.clone()
    chain_inputs(draws, hist, meta, layout, min_n, max_n, tables, PAGE, *out)
    return hist, meta, out


@pytest.mark.parametrize("seed", range(6))
def test_the_reference_follows_the_host_rules(seed, monkeypatch):
    monkeypatch.setenv("INFER_CLUSTER_KERNELS", "torch")
    slots = 5
    keep = None if seed % 2 else [0, 2, 3, 4]  # slot 1's request ended: the step skips it
    draws, hist, meta, layout, tables, texts, props_of = case(seed, slots, keep=keep)
    width = meta.shape[1] - META_HEAD
    new_hist, new_meta, (ids, pos, slot, lens) = run(draws, hist, meta, layout, tables)
    drawn, first, group = draws.tolist(), 0, {i: g for g, i in enumerate(layout[2].tolist())}
    for i, (tokens, props) in enumerate(zip(texts, props_of)):
        a = num_accepted(props, drawn[first:first + len(props) + 1])
        grown = tokens + props[:a] + [drawn[first + a]]
        first += len(props) + 1
        if i not in group:  # left out: its state stays as it was
            assert torch.equal(new_meta[i], meta[i]) and torch.equal(new_hist[i], hist[i])
            continue
        row0, k_new = layout[0, group[i]].item(), layout[1, group[i]].item()
        found = NgramIndex(2, 4).propose(grown, width)
        assert lookup(grown, width, 2, 4) == found
        want = found[:k_new]
        length, off, num, avail, *proposals = new_meta[i].tolist()
        assert (length, off, num, avail) == (len(grown), row0, len(want), len(found))
        assert proposals[:num] == want
        assert new_hist[i, :length].tolist() == grown
        r = slice(row0, row0 + k_new + 1)
        assert ids[r].tolist() == [grown[-1], *proposals[:k_new]]
        assert pos[r].tolist() == list(range(len(grown) - 1, len(grown) + k_new))
        table = tables[row0].tolist()
        assert slot[r].tolist() == [table[p // PAGE] * PAGE + p % PAGE for p in pos[r].tolist()]
        assert lens[r].tolist() == [p + 1 for p in pos[r].tolist()]
    rows = int(layout[1].sum()) + layout.shape[1]
    assert ids[rows:].tolist() == [-7, -7]  # rows past the step untouched


@pytest.mark.parametrize("seed", range(4))
def test_triton_equals_the_reference(seed, device, monkeypatch):
    draws, hist, meta, layout, tables, _, _ = case(100 + seed, 4, ks=(3, 0, 7, 2), keep=[3, 0, 2][:3 - seed % 2])
    monkeypatch.setenv("INFER_CLUSTER_KERNELS", "torch")
    want = run(draws, hist, meta, layout, tables, 3, 4)
    monkeypatch.setenv("INFER_CLUSTER_KERNELS", "triton")
    got = run(*(t.to(device) for t in (draws, hist, meta, layout, tables)), 3, 4)
    assert torch.equal(got[0].cpu(), want[0]) and torch.equal(got[1].cpu(), want[1])
    for g, w in zip(got[2], want[2]):
        assert torch.equal(g.cpu(), w)


def test_a_chained_step_reads_the_last_one():
    """Two chained launches: the second verifies the first's proposals against its draws."""
    draws, hist, meta, layout, tables, _, _ = case(7, 3, ks=(2, 2, 2))
    hist, meta, (ids, *_rest) = run(draws, hist, meta, layout, tables)
    # the draws of the chained step: slot 0 keeps its first proposal, the others none
    step = ids.tolist()[:9]
    new_draws = [step[1], 99, 99, 98, 98, 98, 97, 97, 97]
    before = meta[:3, 0].tolist()
    num0 = meta[0, 2].item()
    hist, meta, _ = run(torch.tensor(new_draws), hist, meta, layout, tables)
    kept0 = 2 if num0 >= 1 else 1  # a real proposal kept, then the draw after it
    assert meta[0, 0].item() == before[0] + kept0
    assert meta[1:3, 0].tolist() == [before[1] + 1, before[2] + 1]
    assert hist[1, before[1]].item() == 98 and hist[2, before[2]].item() == 97


def test_a_layout_outside_the_state_is_refused(monkeypatch):
    monkeypatch.setenv("INFER_CLUSTER_KERNELS", "torch")
    draws, hist, meta, layout, tables, _, _ = case(1, 2, ks=(1, 1))
    with pytest.raises(ValueError, match="proposals must be"):
        run(draws, hist, meta, torch.tensor([[0, 2], [1, meta.shape[1]], [0, 1]], dtype=torch.int32), tables)
    with pytest.raises(ValueError, match="state slots must be"):
        run(draws, hist, meta, torch.tensor([[0, 2], [1, 1], [0, meta.shape[0]]], dtype=torch.int32), tables)
    with pytest.raises(ValueError, match="layout must be"):
        run(draws, hist, meta, layout[:2], tables)
