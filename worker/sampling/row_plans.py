"""`RowPlans`: what the sampler needs of each live request that never changes between steps,
kept in numpy tables so a step reads every row's with one gather instead of a dozen Python loops.

Owns: one row per live request id (slot), holding its feature flags (penalties, min_tokens,
logprobs, random, structured outputs, logit_bias), its effective random parameters (temperature, top_k with 0 for none or >=
vocab, top_p, min_p), its candidate count (`sampling_ops.num_candidates`), its three penalties
and its seed. A row is
filled when its request is first seen (or its `SamplingParams` object or the vocabulary changed)
and freed by `release`; rows of requests without an id live for one call (`scratch`).

The sampler's hot path at batch 256 spent ~0.5 ms of host time per step in per-row Python
(the feature flags, the parameter columns, the candidate counts); here that is one dict lookup
per row plus numpy. Host data only (no tensors). To extend: add a column (the float columns
below, or a flag bit), fill it in `_fill`, and read it from the table `gather` returns.
"""

from __future__ import annotations

from typing import Hashable

import numpy as np

from infer_cluster.protocol.sampling_params import SamplingParams

from infer_cluster.worker.sampling import ops as sampling_ops

PENALTIES, MIN_TOKENS, LOGPROBS, RANDOM, STRUCTURED, LOGIT_BIAS = 1, 2, 4, 8, 16, 32  # flag bits
# float64 columns: flags, temperature, top_k (effective), top_p, min_p, candidates (0: full path),
# then the repetition, frequency and presence penalties (`SamplingState.apply_penalties`' columns)
FLAGS, TEMPERATURE, TOP_K, TOP_P, MIN_P, NEED, REPETITION, FREQUENCY, PRESENCE = range(9)
_NUM_FLOAT = 9


class RowPlans:
    """Per-request sampler rows in numpy tables (see the module docstring)."""

    def __init__(self, capacity: int = 64):
        self._floats = np.zeros((capacity, _NUM_FLOAT), dtype=np.float64)
        self._seeds = np.zeros(capacity, dtype=np.int64)     # the seed's 64 bits (signed view)
        self._seeded = np.zeros(capacity, dtype=bool)
        self._free = list(range(capacity - 1, -1, -1))
        self._index: dict = {}  # request id -> (params object, slot, vocab)

    def __len__(self) -> int:
        return len(self._index)

    def slots(self, rows, vocab: int, scratch: list) -> np.ndarray:
        """int64 [len(rows)]: each row's slot, filled where new or stale. Rows without a request
        id get a slot listed in `scratch` (the caller frees them with `free_scratch`)."""
        get = self._index.get
        out = []
        append = out.append
        for r in rows:
            e = get(r.request_id)
            if e is None or e[0] is not r.params or e[2] != vocab:
                e = self._add(r, vocab, scratch)
            append(e[1])
        return np.asarray(out, dtype=np.int64)

    def gather(self, slots: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(floats [n, 9], seeds [n] int64, seeded [n] bool) of the rows at `slots`."""
        return self._floats[slots], self._seeds[slots], self._seeded[slots]

    def release(self, request_id: Hashable) -> None:
        e = self._index.pop(request_id, None)
        if e is not None:
            self._free.append(e[1])

    def free_scratch(self, scratch: list) -> None:
        self._free.extend(scratch)
        scratch.clear()

    def _add(self, r, vocab: int, scratch: list):
        key = r.request_id
        if key is not None:
            old = self._index.pop(key, None)
            if old is not None:
                self._free.append(old[1])
        if not self._free:
            self._grow()
        slot = self._free.pop()
        self._fill(slot, r.params, bool(r.eos_token_ids), vocab)
        e = (r.params, slot, vocab)
        if key is None:
            scratch.append(slot)
        else:
            self._index[key] = e
        return e

    def _grow(self) -> None:
        cap = self._floats.shape[0]
        self._floats = np.concatenate([self._floats, np.zeros_like(self._floats)])
        self._seeds = np.concatenate([self._seeds, np.zeros_like(self._seeds)])
        self._seeded = np.concatenate([self._seeded, np.zeros_like(self._seeded)])
        self._free.extend(range(2 * cap - 1, cap - 1, -1))

    def _fill(self, slot: int, p: SamplingParams, has_eos: bool, vocab: int) -> None:
        flags = plan_flags(p, has_eos)
        top_k = p.top_k if 0 < p.top_k < vocab else 0
        need = sampling_ops.num_candidates([top_k], [p.top_p], vocab)[0]
        self._floats[slot] = (flags, p.temperature, top_k, p.top_p, p.min_p, need,
                              p.repetition_penalty, p.frequency_penalty, p.presence_penalty)
        self._seeded[slot] = p.seed is not None
        self._seeds[slot] = p.seed or 0  # validated <= 2 ** 63 - 1


def plan_flags(p: SamplingParams, has_eos: bool) -> int:
    """The feature bits of a row with params `p` (`has_eos`: the request has EOS ids)."""
    return ((PENALTIES if p.has_penalties else 0)
            | (MIN_TOKENS if p.min_tokens and (has_eos or p.stop_token_ids) else 0)
            | (LOGPROBS if p.logprobs is not None else 0)
            | (RANDOM if not p.is_greedy else 0)
            | (STRUCTURED if p.structured_outputs is not None else 0)
            | (LOGIT_BIAS if p.logit_bias else 0))


def rows_with(flags: np.ndarray, bit: int) -> list[int]:
    """The positions whose flags have `bit`, as a list."""
    return np.flatnonzero(np.asarray(flags, dtype=np.int64) & bit).tolist()


