"""Batched random sampling: temperature, top-k, top-p, min-p and the draw, with no vocabulary sort.

Owns: `draw_random_rows`, which turns float32 logits of the random rows into token ids given
per-row parameters and one uniform per row (from `random_stream.step_uniforms`) without a host
sync, and `sample_random_rows`, the same draw made exact at once. The paths below are plain
torch and run on the CPU; where `kernels.sample.use_sample_kernels` holds (CUDA, unless
`INFER_CLUSTER_SAMPLER_KERNELS=0`), the candidate rows' filters and draw are one Triton launch and
the full rows' draw two (kernels/sample_triton.py), with these torch paths as their references.

The kept set of a row (all thresholds on the row's logits, so it is always a set of the highest
values, ties kept together):
  * top_k: values >= the k-th largest value (ties with it stay);
  * top_p: over the top-k survivors with probabilities softmax(x / T), token i stays when the
    mass of tokens with a strictly greater value is < top_p (the smallest set of whole tie
    groups reaching top_p; the top token always stays);
  * min_p: exp((x_i - max) / T) >= min_p, i.e. prob_i >= min_p * prob_max.
The draw is the inverse CDF of the kept probabilities in token-id order at the row's uniform, so
it depends only on the row (its logits, parameters and uniform), never on the rest of the batch.

How, without sorting the vocabulary:
  * rows with top_k, and rows with top_p whose kept set turns out to lie within their first
    `TOP_P_CANDIDATES` values: `topk` candidates, filters and draw on those few columns;
  * the others ("full" rows): thresholds in logit space (top-p by an exact 32-step bisection over
    the float32 bit order, batched), then one pass that writes exp((x - max) / T) block sums and a
    second level that draws inside the chosen block. On the CPU that pass runs over column chunks
    that stay in cache; on CUDA it is one chunk.
Which candidate rows did not fit (ties past k + margin, a top-p set wider than its candidates)
only the device knows: `draw_random_rows` returns their flags in an `Unresolved`, and whoever
copies the ids to the host copies the flags with them and redoes the flagged rows on the full
path (`Unresolved.apply`; the sampler does it in `Sampler.finish`), with the same uniform. On the
kernel path, top-p rows without top-k that did not fit are finished on the device in the draw
(the full path for those rows only), so only top-k rows with ties past their margin are flagged.

Must never: read or write state outside its arguments, mutate `x`, or sync to the host (except
`sample_random_rows` / `kept_mask`, which read the flags: tests and diagnostics).
To extend: a new filter is one more threshold; apply it in `_candidate_keep` and `_full_weights`
in the same way, so both paths keep the same set.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch

from infer_cluster.kernels.row_stats import BLOCK as ROW_STATS_BLOCK
from infer_cluster.kernels.row_stats import block_maxima
from infer_cluster.kernels.sample import (MAX_CANDIDATES, candidate_draw, copy_flagged_rows, full_draw, topk_select,
                                          topk_select_fits, use_sample_kernels)

from infer_cluster.worker.sampling.top_p_cut import top_p_threshold, top_p_threshold_kernel  # noqa: F401 (the draw's and tests' names)

TOP_K_TIE_MARGIN = 64     # extra candidates past k to see ties with the k-th value (bf16 logits tie often)
TOP_P_CANDIDATES = 256    # candidates tried first for rows with top_p but no top_k
BLOCK = 128               # columns per block of the two-level draw
CPU_CHUNK = 32768         # columns per cache-sized chunk of the full pass on the CPU


@dataclass
class RandomRows:
    """Parameters of the random rows, on the logits' device, plus host copies used for planning."""

    temperature: torch.Tensor  # [n] float32, > 0
    top_k: torch.Tensor        # [n] int64, 0 = none (already 0 when >= vocab)
    top_p: torch.Tensor        # [n] float32 in (0, 1]
    min_p: torch.Tensor        # [n] float32 in [0, 1]
    uniform: torch.Tensor      # [n] float64 in [0, 1)
    host_top_k: list[int]
    host_top_p: list[float]
    host_min_p: list[float]
    need: Optional[list[int]] = None  # `num_candidates` of the rows, when the caller has it
    top_p_alone: Optional[bool] = None  # whether a candidate row is top-p alone (known with `need`)
    inv_t: Optional[torch.Tensor] = None  # [n, 1] float32 1 / temperature, when the caller has it


def sample_random_rows(x: torch.Tensor, rows: RandomRows) -> torch.Tensor:
    """Token ids [n] (int64) for float32 logits `x` [n, vocab] of random rows, exact: rows the
    candidate path could not settle are redone at once (one host read of their flags)."""
    out, unresolved = draw_random_rows(x, rows)
    if unresolved is not None:
        unresolved.apply(out, unresolved.flags.tolist())
    return out


def draw_random_rows(x: torch.Tensor, rows: RandomRows, private: bool = True):
    """The draw with no host sync: (ids [n], `Unresolved` or None). `x` is float32 (the torch paths),
    or any float dtype where the kernels run. Ids of rows flagged in
    `Unresolved.flags` are only provisional until `Unresolved.redo` ran for them. `private`:
    `x` is the caller's own (False: it may be reused, so a redo keeps a copy)."""
    return _run(x, rows, want_mask=False, private=private)


def kept_mask(x: torch.Tensor, rows: RandomRows) -> torch.Tensor:
    """[n, vocab] bool: the tokens each row may draw, found by the same paths as the draw
    (for tests and diagnostics; the draw itself never builds this)."""
    out, unresolved = _run(x, rows, want_mask=True)
    if unresolved is not None:
        unresolved.apply(out, unresolved.flags.tolist(), want_mask=True)
    return out


@dataclass
class Unresolved:
    """Candidate rows whose kept set may not fit their candidates (ties past k + margin, or a
    top-p set wider than its candidates): only the device knows which, so the draw hands the
    flags back instead of reading them. Whoever has them on the host calls `redo` for the
    flagged rows: the full path, with the same uniform, so the result is what a synchronous
    draw gives."""

    flags: torch.Tensor   # [len(rows)] bool on the device: True = redo on the full path
    rows: list[int]       # the draw's rows that took the candidate path
    x: torch.Tensor       # [n, vocab] logits of the draw, kept alive until the redo (where the
                          # caller may rewrite its buffer, only the flagged rows: `copy_flagged_rows`)
    m: torch.Tensor       # [n, 1] row maxima
    inv_t: torch.Tensor   # [n, 1]
    kth: torch.Tensor     # [len(rows), 1] top-k threshold of each candidate row
    params: RandomRows

    def redo(self, which: list[int], want_mask: bool = False) -> torch.Tensor:
        """Full-path ids (or kept masks) of `self.rows[j]` for j in `which` (on the device)."""
        dev = self.x.device
        sub = [self.rows[j] for j in which]
        sub_idx = _index(sub, dev)
        return _full(self.x[sub_idx], self.m[sub_idx], self.inv_t[sub_idx],
                     self.kth[_index(which, dev)], self.params, sub, want_mask)

    def apply(self, out: torch.Tensor, host_flags: list, want_mask: bool = False) -> None:
        """Redo the flagged rows into `out` (a host sync; rare)."""
        which = [j for j, f in enumerate(host_flags) if f]
        if which:
            out[_index([self.rows[j] for j in which], self.x.device)] = self.redo(which, want_mask)


def _run(x: torch.Tensor, rows: RandomRows, want_mask: bool, private: bool = True):
    n, vocab = x.shape
    dev = x.device
    need = rows.need if rows.need is not None else num_candidates(rows.host_top_k, rows.host_top_p, vocab)
    cand = [i for i, c in enumerate(need) if c]
    full = [i for i, c in enumerate(need) if not c] if len(cand) < n else []
    width = max(need, default=0)  # the widest candidate row (full rows need 0)
    kernel_cand = bool(cand) and not want_mask and _kernels(x) and width <= MAX_CANDIDATES
    maxima = None
    if kernel_cand and not full and _topk_by_blocks(x, width):
        # Every row takes the candidates: the top-k's block maxima give the row maxima too
        # (one pass over the logits, not two).
        maxima = block_maxima(x, TOPK_BLOCK)
        m = maxima.amax(dim=-1, keepdim=True).float()
    else:
        m = x.amax(dim=-1, keepdim=True).float()  # exact for bf16 / fp16 logits (the kernels' input)
    inv_t = rows.inv_t if rows.inv_t is not None else (1.0 / rows.temperature).unsqueeze(1)
    out = None  # a buffer only when both paths have rows: otherwise one path's result is the output
    if 0 < len(cand) < n or n == 0:
        out = (torch.zeros(n, vocab, dtype=torch.bool, device=dev) if want_mask
               else torch.empty(n, dtype=torch.long, device=dev))
    unresolved = None
    if kernel_cand:
        # One launch for the filters and the draw (kernels/sample_triton.py), same semantics.
        idx = _subset_index(cand, n, dev)
        xc = _take(x, idx, cand, n)
        vals, ids = topk_by_blocks(xc, width, maxima) if maxima is not None else topk(xc, width)
        mc, tc = _take(m, idx, cand, n), _take(inv_t, idx, cand, n)
        top_p, min_p, u = (_take(rows.top_p, idx, cand, n), _take(rows.min_p, idx, cand, n),
                           _take(rows.uniform, idx, cand, n))
        top_p_alone = (rows.top_p_alone if rows.top_p_alone is not None
                       else any_top_p_alone(rows.host_top_k, need, vocab))
        kept, codes, kth, mass = candidate_draw(xc, vals.float().contiguous(), ids.contiguous(), mc, tc,
                                          _take(rows.top_k, idx, cand, n), top_p, min_p, u,
                                          TOP_K_TIE_MARGIN, TOP_P_CANDIDATES, BLOCK, top_p_alone)
        if top_p_alone:
            # Top-p rows without top-k whose set is wider than their candidates (code 2) are
            # finished here on the device, with no host sync and no redo in `finish`: the full
            # path's top-p cut, then its draw, for those rows only.
            found = top_p_threshold_kernel(xc, mc, tc, kth, top_p.unsqueeze(1), active=codes, active_code=2,
                                           mass=mass)
            full_draw(xc, mc, tc, torch.maximum(kth, found), min_p, u, BLOCK, active=codes, active_code=2,
                      out=kept)
            flags = codes == 1
        else:
            flags = codes.bool()
        out = _put(out, idx, kept)
        # A redo reads only the flagged rows: a shared buffer keeps those (a launch whose programs
        # mostly stop at their flag), not an [n, vocab] copy of every row each step.
        unresolved = Unresolved(flags, cand, x if private else copy_flagged_rows(x, flags, idx), m, inv_t,
                                kth, rows)
    elif cand:
        idx = _subset_index(cand, n, dev)
        resolved, w, ids, kth = _filter_candidates(_take(x, idx, cand, n), _take(m, idx, cand, n),
                                                   _take(inv_t, idx, cand, n), rows, cand,
                                                   need if idx is None else [need[i] for i in cand])
        if want_mask:
            kept = torch.zeros(len(cand), vocab, dtype=torch.bool, device=dev).scatter_(1, ids, w > 0)
        else:
            order = ids.argsort(dim=-1)  # the draw runs in token-id order, as on the full path
            w, ids = w.gather(1, order), ids.gather(1, order)
            kept = ids.gather(1, _inverse_cdf(w, _take(rows.uniform, idx, cand, n)).unsqueeze(1)).squeeze(1)
        out = _put(out, idx, kept)
        # Rows whose kept set did not fit their candidates go the full way; only the device
        # knows which, so the caller reads the flags when it has them (no sync here).
        unresolved = Unresolved(~resolved, cand, x if private else x.clone(), m, inv_t, kth, rows)
    if full:
        idx = _subset_index(full, n, dev)
        tau = torch.full((len(full), 1), float("-inf"), device=dev)
        out = _put(out, idx, _full(_take(x, idx, full, n), _take(m, idx, full, n),
                                   _take(inv_t, idx, full, n), tau, rows, full, want_mask))
    return out, unresolved


def _kernels(x: torch.Tensor) -> bool:
    """Whether the draw of `x` runs the Triton kernels (they need unit column stride)."""
    return use_sample_kernels(x) and x.stride(1) == 1


def _subset_index(which: list[int], n: int, device) -> Optional[torch.Tensor]:
    """The index tensor of rows `which` out of n; None when that is every row (the usual batch),
    so `_take` and `_put` skip the upload, the gather and the scatter."""
    return None if len(which) == n else _index(which, device)


def _take(t: torch.Tensor, idx: Optional[torch.Tensor], which: list[int], n: int) -> torch.Tensor:
    """Rows `which` of `t`; `t` itself when that is every row (no [n, vocab] copy)."""
    return t if len(which) == n else t[idx]


def _put(out: torch.Tensor, idx: Optional[torch.Tensor], rows: torch.Tensor) -> torch.Tensor:
    """`out` with `rows` written at `idx`; `rows` itself when idx is None (every row)."""
    if idx is None:
        return rows
    out[idx] = rows
    return out


def any_top_p_alone(top_k, need, vocab: int) -> bool:
    """Whether some row is top-p without top-k and tries fewer candidates than the vocabulary
    (its kept set may be wider than them: the kernel path finishes it with the top-p cut).
    `top_k` and `need` (`num_candidates`) per row, as lists or numpy arrays."""
    top_k, need = np.asarray(top_k), np.asarray(need)
    return bool(((top_k == 0) & (need > 0) & (need < vocab)).any())


def num_candidates(top_k: list[int], top_p: list[float], vocab: int) -> list[int]:
    """Columns each row tries first: a fixed function of its own parameters (never of the batch),
    so whether it falls back to the full path depends only on the row. 0 = full path."""
    with_p = min(vocab, TOP_P_CANDIDATES)
    return [min(vocab, k + TOP_K_TIE_MARGIN) if k else (with_p if p < 1.0 else 0)
            for k, p in zip(top_k, top_p)]


def _filter_candidates(x, m, inv_t, rows: RandomRows, which: list[int], need: list[int]):
    """Filters over each row's top `need` values. Returns (resolved [n] bool, weights of the
    kept candidates [n, c] float64 (0 elsewhere), their token ids [n, c], the top-k threshold
    [n, 1], which the unresolved rows carry to the full path)."""
    n, vocab = x.shape
    dev = x.device
    num_random = len(rows.host_top_k)
    idx = _subset_index(which, num_random, dev)
    vals, ids = topk(x, max(need))  # sorted, highest first
    pos = torch.arange(vals.shape[1], device=dev)
    limit = to_device(need, torch.long, dev).unsqueeze(1)
    top_k = _take(rows.top_k, idx, which, num_random).unsqueeze(1)
    has_k = top_k > 0
    kth = torch.where(has_k, vals.gather(1, (top_k - 1).clamp(min=0)), torch.full_like(m, float("-inf")))
    # A top-k row is resolved unless ties with the k-th value may reach past its candidates.
    resolved = ((vals.gather(1, limit - 1) < kth) | (limit >= vocab) | ~has_k).squeeze(1)
    w = torch.exp((vals - m) * inv_t).masked_fill_((pos >= limit) | (vals < kth), 0.0).double()
    keep = w > 0
    host_top_p = rows.host_top_p if idx is None else [rows.host_top_p[i] for i in which]
    p_rows = [j for j, p in enumerate(host_top_p) if p < 1.0]
    if p_rows:
        top_p = _take(rows.top_p, idx, which, num_random).unsqueeze(1).double()
        total = w.sum(dim=-1, keepdim=True)
        # Rows with top_p and no top_k: the mass is that of the whole vocabulary.
        z_rows = [j for j in p_rows if not rows.host_top_k[which[j]] and need[j] < vocab]
        if z_rows:
            z_idx = _index(z_rows, dev)
            total[z_idx] = _full_mass(_take(x, z_idx, z_rows, n), _take(m, z_idx, z_rows, n),
                                      _take(inv_t, z_idx, z_rows, n))
        before = _mass_before_group(vals, w)
        keep_p = (before < top_p * total) | (top_p >= 1.0)
        keep &= keep_p
        # A top-p-only row is resolved when its last candidate is already cut off by top_p.
        if z_rows:
            cut = ~keep_p.gather(1, limit - 1).squeeze(1)
            resolved[z_idx] = cut[z_idx]
    if any(rows.host_min_p[i] > 0.0 for i in which):
        keep &= w >= _take(rows.min_p, idx, which, num_random).unsqueeze(1).double()
    return resolved, w.masked_fill(~keep, 0.0), ids, kth


def _mass_before_group(vals: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """For values sorted high to low: mass of strictly greater values (ties share their group's)."""
    before = w.cumsum(dim=-1) - w
    pos = torch.arange(vals.shape[1], device=vals.device).expand_as(vals)
    starts = torch.ones_like(vals, dtype=torch.bool)
    starts[:, 1:] = vals[:, 1:] != vals[:, :-1]
    group_start = torch.where(starts, pos, torch.zeros_like(pos)).cummax(dim=-1).values
    return before.gather(1, group_start)


def _inverse_cdf(w: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Index where the float64 cumulative weight first exceeds u * total; never a zero weight."""
    cum = w.cumsum(dim=-1)
    target = (u * cum[:, -1]).unsqueeze(1)
    found = torch.searchsorted(cum, target, right=True).squeeze(1)
    pos = torch.arange(w.shape[1], device=w.device)
    last_positive = torch.where(w > 0, pos, torch.zeros_like(pos)).amax(dim=-1)
    return torch.minimum(found, last_positive)


def _chunks(vocab: int, device: torch.device):
    step = CPU_CHUNK if device.type == "cpu" else vocab + BLOCK
    for c0 in range(0, vocab, step):
        yield c0, min(vocab, c0 + step)


def block_sums(x, m, inv_t, tau=None, min_p=None) -> torch.Tensor:
    """[n, ceil(vocab / BLOCK)] float32 sums of exp((x - m) * inv_t) over the kept columns."""
    n, vocab = x.shape
    sums = torch.empty(n, -(-vocab // BLOCK), dtype=torch.float32, device=x.device)
    buf = None
    for c0, c1 in _chunks(vocab, x.device):
        width = c1 - c0
        nblk = -(-width // BLOCK)
        if buf is None or buf.shape[1] != nblk * BLOCK:
            buf = torch.empty(n, nblk * BLOCK, dtype=torch.float32, device=x.device)
        w = buf[:, :width]
        torch.sub(x[:, c0:c1], m, out=w)
        w.mul_(inv_t).exp_()
        if tau is not None:
            w.masked_fill_(x[:, c0:c1] < tau, 0.0)
        if min_p is not None:
            w.masked_fill_(w < min_p, 0.0)
        if width < buf.shape[1]:
            buf[:, width:] = 0.0  # a reused buffer's tail holds the previous chunk
        sums[:, c0 // BLOCK:c0 // BLOCK + nblk] = buf.view(n, nblk, BLOCK).sum(dim=-1)
    return sums


def _full_mass(x, m, inv_t) -> torch.Tensor:
    return block_sums(x, m, inv_t).double().sum(dim=-1, keepdim=True)


def _full(x, m, inv_t, tau, rows: RandomRows, which: list[int], want_mask: bool) -> torch.Tensor:
    """The whole vocabulary with per-row logit thresholds: top-k `tau`, top-p found here, min_p.
    Returns the kept mask, or the draw: a block by its mass, then a column inside it."""
    n, vocab = x.shape
    dev = x.device
    num_random = len(rows.host_top_k)
    idx = _subset_index(which, num_random, dev)
    p_rows = [j for j, i in enumerate(which) if rows.host_top_p[i] < 1.0]
    if p_rows:
        p_idx = _index(p_rows, dev)
        t = _take(tau, p_idx, p_rows, n)
        top_p = _take(rows.top_p, idx, which, num_random)
        threshold = top_p_threshold_kernel if _kernels(x) else top_p_threshold
        found = threshold(_take(x, p_idx, p_rows, n), _take(m, p_idx, p_rows, n),
                          _take(inv_t, p_idx, p_rows, n), t, _take(top_p, p_idx, p_rows, n).unsqueeze(1))
        tau = tau.clone()
        tau[p_idx] = torch.maximum(t, found)
    min_p = _take(rows.min_p, idx, which, num_random).unsqueeze(1)
    if want_mask:
        w = torch.exp((x - m) * inv_t)
        return (x >= tau) & (w >= min_p) & (w > 0)
    if _kernels(x):  # two launches (kernels/sample_triton.py), same semantics
        return full_draw(x, m.contiguous(), inv_t.contiguous(), tau.contiguous(), min_p.contiguous(),
                         _take(rows.uniform, idx, which, num_random).contiguous(), BLOCK)
    has_min_p = any(rows.host_min_p[i] > 0.0 for i in which)
    has_tau = bool(p_rows) or any(rows.host_top_k[i] for i in which)
    sums = block_sums(x, m, inv_t, tau if has_tau else None, min_p if has_min_p else None).double()
    u = _take(rows.uniform, idx, which, num_random)
    block = _inverse_cdf(sums, u)
    cum = sums.cumsum(dim=-1)
    before = torch.where(block > 0, cum.gather(1, (block - 1).clamp(min=0).unsqueeze(1)).squeeze(1),
                         torch.zeros_like(u))
    target = u * cum[:, -1] - before  # the same u * total as the block choice: one inverse CDF
    cols = block.unsqueeze(1) * BLOCK + torch.arange(BLOCK, device=dev)
    xb = x.gather(1, cols.clamp(max=vocab - 1))
    w = torch.exp((xb - m) * inv_t)
    w = w.masked_fill_((cols >= vocab) | (xb < tau) | (w < min_p), 0.0).double()
    found = torch.searchsorted(w.cumsum(dim=-1), target.unsqueeze(1), right=True).squeeze(1)
    pos = torch.arange(BLOCK, device=dev)
    last_positive = torch.where(w > 0, pos, torch.zeros_like(pos)).amax(dim=-1)
    return block * BLOCK + torch.minimum(found, last_positive)


def _index(values: list[int], device: torch.device) -> torch.Tensor:
    return to_device(values, torch.long, device)


TOPK_BLOCK = ROW_STATS_BLOCK  # the sampler's logprobs take these block maxima from `row_stats`


def topk(x: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """`x.topk(k, dim=-1)` for a wide float `x` [n, vocab]: the same values (sorted, highest
    first; which id of a tie comes first may differ). On CUDA it goes through block maxima:
    every value of the top k lies in one of the k blocks with the largest maxima (k blocks with
    a larger maximum would each hold a larger value), so one reduction over the vocabulary and
    two small topks replace a full-width selection, about a third of its time at workload A's
    batch."""
    if not _topk_by_blocks(x, k):
        return x.topk(k, dim=-1)
    return topk_by_blocks(x, k)


def _topk_by_blocks(x: torch.Tensor, k: int) -> bool:
    """Whether `topk` goes through block maxima for this `x` and `k`."""
    return (x.device.type == "cuda" and x.shape[1] >= 64 * TOPK_BLOCK and k <= 512
            and x.is_contiguous())


def topk_by_blocks(x: torch.Tensor, k: int,
                   maxima: Optional[torch.Tensor] = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The block-maxima top-k on any device (`topk` picks it on CUDA; tests run it anywhere).
    `maxima`: the maxima of x's runs of `TOPK_BLOCK` columns when the caller has them already
    (`kernels.row_stats`)."""
    n, vocab = x.shape
    b = TOPK_BLOCK
    if maxima is None:
        maxima = block_maxima(x, b)
    if _kernels(x) and topk_select_fits(x, maxima, k, b):  # one launch for the steps below
        return topk_select(x, maxima, k, b)
    blocks = maxima.topk(min(k, maxima.shape[1]), dim=-1).indices
    cols = (blocks.unsqueeze(-1) * b + torch.arange(b, device=x.device)).view(n, -1)
    if vocab % b:  # a short last block: its columns past the vocabulary take no part
        cand = x.gather(1, cols.clamp(max=vocab - 1)).masked_fill_(cols >= vocab, float("-inf"))
    else:  # every column exists (151,936 = 1,187 x 128): three [n, k x 128] ops fewer
        cand = x.gather(1, cols)
    vals, pos = cand.topk(k, dim=-1)
    return vals, cols.gather(1, pos)


def to_device(values, dtype: torch.dtype, device) -> torch.Tensor:
    """A host list as a tensor on `device` without a sync. A CUDA copy from pageable memory
    waits for every kernel queued before it (the whole forward pass), so host lists go through
    pinned memory and an asynchronous copy; the caching host allocator keeps the pinned block
    until the copy has run."""
    device = torch.device(device)
    if device.type != "cuda":
        return torch.tensor(values, dtype=dtype, device=device)
    return torch.tensor(values, dtype=dtype, pin_memory=True).to(device, non_blocking=True)
