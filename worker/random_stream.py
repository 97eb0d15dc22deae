"""Counter-based random numbers for sampling: uniforms keyed by (seed, step), for a whole batch.

Owns: Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC'11) over
numpy uint64 arrays, and `step_uniforms(seeds, steps)`, which gives each row two uniforms in
[0, 1) that depend only on that row's (seed, step). A seeded request therefore draws the same
numbers whatever else is in the batch, on any device, and after a failover: the engine's step
index of a request is the number of tokens it has generated, which a resumed request carries.

The counter layout is Triton's `tl.randint4x(seed, offset)`: key = (seed low 32 bits, seed
high 32 bits), counter = (offset low, offset high, 0, 0), so a Triton kernel can produce the
same stream on the device (tests/kernels/test_random_stream.py checks it).

Must never: depend on global RNG state, on the device, or on the position of a row in a batch.
To extend: more numbers per step come from more counter words (c2 is free), never from a
second call with a shifted step (that would reuse the next step's numbers).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

_MASK32 = np.uint64(0xFFFFFFFF)
_ROUND_A = np.uint64(0xD2511F53)
_ROUND_B = np.uint64(0xCD9E8D57)
_KEY_A = np.uint64(0x9E3779B9)
_KEY_B = np.uint64(0xBB67AE85)
_S32 = np.uint64(32)
_S11 = np.uint64(11)
_S21 = np.uint64(21)
_TWO_POW_M53 = 2.0 ** -53


def philox4x32(counter: Sequence[np.ndarray], key: Sequence[np.ndarray], rounds: int = 10) -> list[np.ndarray]:
    """Philox4x32 on arrays of 32-bit words held in uint64 (products of two words fit exactly)."""
    c0, c1, c2, c3 = (np.asarray(c, dtype=np.uint64) & _MASK32 for c in counter)
    k0, k1 = (np.asarray(k, dtype=np.uint64) & _MASK32 for k in key)
    for _ in range(rounds):
        p0 = _ROUND_A * c0
        p2 = _ROUND_B * c2
        c0, c1, c2, c3 = ((p2 >> _S32) ^ c1 ^ k0, p2 & _MASK32, (p0 >> _S32) ^ c3 ^ k1, p0 & _MASK32)
        k0 = (k0 + _KEY_A) & _MASK32
        k1 = (k1 + _KEY_B) & _MASK32
    return [c0, c1, c2, c3]


def step_uniforms(seeds: Sequence[int], steps: Sequence[int]) -> np.ndarray:
    """[len(seeds), 2] float64 uniforms in [0, 1) with 53 random bits each; row i depends only
    on (seeds[i], steps[i]). Seeds and steps are non-negative and below 2**64."""
    seed = np.asarray(seeds, dtype=np.uint64)
    step = np.asarray(steps, dtype=np.uint64)
    zero = np.zeros_like(step)
    w0, w1, w2, w3 = philox4x32((step & _MASK32, step >> _S32, zero, zero),
                                (seed & _MASK32, seed >> _S32))
    u0 = ((w0 << _S21) | (w1 >> _S11)).astype(np.float64) * _TWO_POW_M53
    u1 = ((w2 << _S21) | (w3 >> _S11)).astype(np.float64) * _TWO_POW_M53
    return np.stack([u0, u1], axis=1)
