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
_S32 = np.uint64(32)
_S11 = np.uint64(11)
_S21 = np.uint64(21)
_TWO_POW_M53 = 2.0 ** -53


# Philox's two multiplies act on words 0 and 2, its keys are two words: both halves of a round
# run as one numpy op on a [2, n] array (5 array ops a round instead of 12; numpy's per-op cost
# dominates at batch sizes).
_ROUND_MUL = np.array([[0xD2511F53], [0xCD9E8D57]], dtype=np.uint64)
_KEY_STEP = np.array([[0x9E3779B9], [0xBB67AE85]], dtype=np.uint64)


def philox4x32(counter: Sequence[np.ndarray], key: Sequence[np.ndarray], rounds: int = 10) -> list[np.ndarray]:
    """Philox4x32 on arrays of 32-bit words held in uint64 (products of two words fit exactly).
    Words broadcast against each other; returns the four output words."""
    words = np.broadcast_arrays(*(np.asarray(w, dtype=np.uint64) & _MASK32 for w in (*counter, *key)))
    c0, c1, c2, c3, k0, k1 = words
    even, odd = np.stack([c0, c2]), np.stack([c1, c3])
    # every round's key at once: (k + r * step) mod 2**32, r = 0 .. rounds-1
    keys = (np.stack([k0, k1])[None] + np.arange(rounds, dtype=np.uint64)[:, None, None] * _KEY_STEP) & _MASK32
    for r in range(rounds):
        crossed = (_ROUND_MUL * even)[::-1]  # (B * c2, A * c0)
        even = (crossed >> _S32) ^ odd ^ keys[r]  # c0' = hi(B c2) ^ c1 ^ k0, c2' = hi(A c0) ^ c3 ^ k1
        odd = crossed & _MASK32                   # c1' = lo(B c2),          c3' = lo(A c0)
    return [even[0], odd[0], even[1], odd[1]]


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
