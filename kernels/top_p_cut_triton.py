"""The full path's top-p cut on the device: for each row, the smallest logit value v with
mass(x > v) < top_p * mass(x >= tau), the masses of exp((x - max) / T).

Owns `top_p_threshold` (one program per row), the Triton twin of `sampling_ops.top_p_threshold`
(a 32-step bisection over the float32 bit order, the reference). The kernel finds the same
unique key with a 16-way search: each pass evaluates 15 pivots of the bracket (lo: not below
the target, hi: below) in one sweep over the row, each thread keeping its column's 16 partial
sums ([WAYS, LANES], no reduction inside the loop, the next tile's loads issued before this
tile's sums), then one tree. Every pivot's mass is summed in the same order, so a mass never
grows as its pivot rises and the search cannot disagree with itself. At most 8 passes for
float32 logits, 4 for bfloat16 (the answer is always a value of the row, so bfloat16 keys
suffice); the row's mass is one more pass unless the caller has it (a top-p-alone row's, from
`sample_triton.candidate_draw`).

To extend: keep the pivot masses' summation order common to every pivot; a case goes to
tests/kernels/test_sample_draw.py (`test_top_p_threshold_kernel_*`, against the bisection).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .sample_triton import _is_active

_CUT_LANES = 256      # the top-p cut: one column of each 256 per thread (8 warps), 8 columns a tile
_CUT_WAYS = 16        # pivots per pass of the top-p cut (the last is the bracket's top): 4 bits a pass


def cut_options(dtype: torch.dtype) -> dict:
    """The top-p cut's tile options for logits of `dtype`: a bracket of 2 ** BITS keys closes in
    BITS / 4 passes of 16 ways (bfloat16 values are float32s with 16 low zero bits)."""
    bits = 16 if dtype == torch.bfloat16 else 32
    return dict(LANES=_CUT_LANES, WAYS=_CUT_WAYS, BITS=bits, PASSES=bits // 4)


@triton.jit
def _order_key(v, BITS: tl.constexpr):
    """int64 order key of float32 `v` over its top BITS bits (`worker.top_p_cut._float_key` at 32; at
    16, the key of a bfloat16 value): the bits, with negatives' magnitude bits flipped."""
    b = (v.to(tl.int32, bitcast=True) >> (32 - BITS)).to(tl.int64)  # arithmetic shift: signed
    return tl.where(b < 0, b ^ ((1 << (BITS - 1)) - 1), b)


@triton.jit
def _key_value(k, BITS: tl.constexpr):
    """The float32 whose `_order_key` at BITS is `k`."""
    b = tl.where(k < 0, k ^ ((1 << (BITS - 1)) - 1), k) << (32 - BITS)
    return b.to(tl.int32).to(tl.float32, bitcast=True)


@triton.jit
def _fold_column(acc, low, x, m, it, tau, piv):
    """One column per thread into the pivots' partial sums and the least kept value."""
    w = tl.where(x < tau, 0.0, tl.exp((x - m) * it))
    low = tl.minimum(low, tl.where(w > 0, x, float("inf")))
    return acc + tl.where(x[None, :] > piv, w[None, :], 0.0), low


@triton.jit
def _lane_load(base, c0, lane, u: tl.constexpr, vocab, LANES: tl.constexpr):
    cols = c0 + u * LANES + lane
    return tl.load(base + cols, mask=cols < vocab, other=float("-inf")).to(tl.float32)


@triton.jit
def _pivot_masses(base, vocab, m, it, tau, pivots, LANES: tl.constexpr, WAYS: tl.constexpr):
    """[WAYS] float32 masses of exp((x - m) * it) over the row's x >= tau with x > pivots[j], and
    the smallest such x of positive weight over the whole row (pivots of -inf: the row's least
    kept value). Each thread keeps its column's WAYS partial sums over the tiles ([WAYS, LANES],
    one column per thread: no reduction inside the loop), then one tree: every pivot's mass is
    summed in the same order, so a mass never grows as its pivot rises (the search's invariant).
    A tile is 8 loads per thread; the next tile's loads are issued before this one's sums, so
    the memory latency overlaps the arithmetic."""
    lane = tl.arange(0, LANES)
    acc = tl.zeros([WAYS, LANES], dtype=tl.float32)
    low = tl.full([LANES], float("inf"), tl.float32)
    piv = pivots[:, None]
    x0 = _lane_load(base, 0, lane, 0, vocab, LANES)
    x1 = _lane_load(base, 0, lane, 1, vocab, LANES)
    x2 = _lane_load(base, 0, lane, 2, vocab, LANES)
    x3 = _lane_load(base, 0, lane, 3, vocab, LANES)
    x4 = _lane_load(base, 0, lane, 4, vocab, LANES)
    x5 = _lane_load(base, 0, lane, 5, vocab, LANES)
    x6 = _lane_load(base, 0, lane, 6, vocab, LANES)
    x7 = _lane_load(base, 0, lane, 7, vocab, LANES)
    for c0 in range(0, vocab, LANES * 8):
        n = c0 + LANES * 8
        y0 = _lane_load(base, n, lane, 0, vocab, LANES)
        y1 = _lane_load(base, n, lane, 1, vocab, LANES)
        y2 = _lane_load(base, n, lane, 2, vocab, LANES)
        y3 = _lane_load(base, n, lane, 3, vocab, LANES)
        y4 = _lane_load(base, n, lane, 4, vocab, LANES)
        y5 = _lane_load(base, n, lane, 5, vocab, LANES)
        y6 = _lane_load(base, n, lane, 6, vocab, LANES)
        y7 = _lane_load(base, n, lane, 7, vocab, LANES)
        acc, low = _fold_column(acc, low, x0, m, it, tau, piv)
        acc, low = _fold_column(acc, low, x1, m, it, tau, piv)
        acc, low = _fold_column(acc, low, x2, m, it, tau, piv)
        acc, low = _fold_column(acc, low, x3, m, it, tau, piv)
        acc, low = _fold_column(acc, low, x4, m, it, tau, piv)
        acc, low = _fold_column(acc, low, x5, m, it, tau, piv)
        acc, low = _fold_column(acc, low, x6, m, it, tau, piv)
        acc, low = _fold_column(acc, low, x7, m, it, tau, piv)
        x0, x1, x2, x3, x4, x5, x6, x7 = y0, y1, y2, y3, y4, y5, y6, y7
    return tl.sum(acc, axis=1), tl.min(low, axis=0)


@triton.jit(do_not_specialize=["sx", "vocab"])
def _top_p_threshold_kernel(x_ptr, sx, m_ptr, inv_t_ptr, tau_ptr, top_p_ptr, out_ptr, vocab, active_ptr,
                            mass_ptr, LANES: tl.constexpr, WAYS: tl.constexpr,
                            BITS: tl.constexpr, PASSES: tl.constexpr, HAS_ACTIVE: tl.constexpr,
                            ACTIVE_CODE: tl.constexpr, HAS_MASS: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    vocab = tl.where(_is_active(active_ptr, row, HAS_ACTIVE, ACTIVE_CODE), vocab, 0)  # inactive: no pass
    m = tl.load(m_ptr + row)
    it = tl.load(inv_t_ptr + row)
    tau = tl.load(tau_ptr + row)
    p = tl.load(top_p_ptr + row)
    base = x_ptr + row * sx
    j = tl.arange(0, WAYS).to(tl.int64)
    if HAS_MASS:  # the row's mass from the caller (a top-p-alone row's, from the candidate draw)
        target = p * tl.load(mass_ptr + row)
        low = tl.full([], float("inf"), tl.float32)  # the bracket starts at -inf
    else:
        # Pass 0: the row's mass (every pivot -inf; the same summation as the passes below) and
        # its least kept value, whose key minus 2 is a key with the whole mass above it.
        total, low = _pivot_masses(base, vocab, m, it, tau, tl.full([WAYS], float("-inf"), tl.float32),
                                   LANES, WAYS)
        target = p * tl.max(total, axis=0)
    # The smallest key k with mass(x > k) < target, as the torch path's bisection over the float32
    # bit order finds it (the answer is unique: masses are monotone), but WAYS - 1 pivots a pass:
    # the bracket (lo: not below, hi: below) shrinks WAYS-fold per pass instead of 2-fold. The
    # answer is always the key of a value of the row (the mass only drops at those), so for
    # bfloat16 logits (BITS = 16) the search runs over bfloat16 keys: half the passes.
    hi = _order_key(m, BITS)
    lo_inf = _order_key(tl.full([], float("-inf"), tl.float32), BITS)
    lo = tl.where(low < float("inf"), _order_key(low, BITS) - 2, lo_inf)
    lo = tl.minimum(tl.maximum(lo, lo_inf), hi - 1)  # never below the key of -inf
    for _ in range(PASSES):
        span = hi - lo
        open_ = span > 1
        keys = lo + (span * (j + 1)) // WAYS  # the last is hi itself
        mass, _low = _pivot_masses(base, tl.where(open_, vocab, 0), m, it, tau, _key_value(keys, BITS),
                                   LANES, WAYS)
        below = mass < target
        hi = tl.where(open_, tl.min(tl.where(below, keys, hi), axis=0), hi)
        lo = tl.where(open_, tl.max(tl.where(below, lo, keys), axis=0), lo)
    tl.store(out_ptr + row, _key_value(hi, BITS))


def top_p_threshold(x: torch.Tensor, m: torch.Tensor, inv_t: torch.Tensor, tau: torch.Tensor,
                    top_p: torch.Tensor, active: torch.Tensor = None, active_code: int = 0,
                    mass: torch.Tensor = None) -> torch.Tensor:
    """[n, 1] float32: `sampling_ops.top_p_threshold` with one program per row (one pass for the
    row's mass, then multi-way search passes, 16 ways: at most 8 passes for any float32 bracket,
    4 for bfloat16 logits, instead of the bisection's 32) instead of ~6 torch ops over
    [rows, vocab] per step. x [n, vocab] any float dtype (unit column stride); m (the rows'
    maxima: values of x), inv_t, tau, top_p [n, 1] float32.
    `active` as in `full_draw` (other rows' values are meaningless). `mass` [n] float32: the
    rows' masses (`candidate_draw`'s, of rows with no logit threshold) instead of a pass for them."""
    n, vocab = x.shape
    out = torch.empty(n, 1, dtype=torch.float32, device=x.device)
    if n:
        has = active is not None
        _top_p_threshold_kernel[(n,)](x, x.stride(0), m, inv_t, tau, top_p, out, vocab,
                                      active if has else out, mass if mass is not None else out,
                                      **cut_options(x.dtype), HAS_ACTIVE=has, ACTIVE_CODE=active_code,
                                      HAS_MASS=mass is not None, num_warps=8)
    return out
