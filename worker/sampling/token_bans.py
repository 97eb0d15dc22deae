"""Logit edits that forbid tokens: min_tokens suppression (eos and stop ids while a request is
below its minimum) and the reference no_repeat_ngram_size ban.

Owns: `apply_logit_bias` (OpenAI's logit_bias, in place, the sampler's step 1b),
`apply_min_tokens` (in place, the sampler's step 2), `ban_tokens` (x[row, token] = -inf
for a batch of pairs, without a blocking host-scalar copy) and `banned_ngram_tokens` (HF's
definition by a full scan; the sampler uses `SamplingState`'s incremental map, and tests compare
the two). To add a ban: collect (row, token) pairs and call `ban_tokens` once per step.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from infer_cluster.worker.sampling.ops import to_device

if TYPE_CHECKING:
    from infer_cluster.worker.sampling.draw_io import SamplingRequestState


def banned_ngram_tokens(seq: list[int], n: int) -> set[int]:
    """HF no_repeat_ngram_size by its definition, a full scan: tokens that would complete an
    n-gram already in `seq`. The sampler uses `SamplingState`'s incremental map; tests compare."""
    if n <= 0 or len(seq) < n:
        return set()
    prefix = seq[len(seq) - n + 1:] if n > 1 else []
    banned = set()
    for start in range(len(seq) - n + 1):
        if seq[start:start + n - 1] == prefix:
            banned.add(seq[start + n - 1])
    return banned


def apply_min_tokens(x: torch.Tensor, rows: list["SamplingRequestState"], which: list[int]) -> None:
    """In place: eos and stop ids -> -inf for rows still below params.min_tokens."""
    vocab = x.shape[1]
    ban_rows, ban_ids = [], []
    for i in which:
        for t in set(rows[i].eos_token_ids) | set(rows[i].params.stop_token_ids):
            if 0 <= t < vocab:  # ids beyond the logits (padded vocab, bad config) can't be sampled
                ban_rows.append(i)
                ban_ids.append(t)
    if ban_rows:
        ban_tokens(x, ban_rows, ban_ids)


def apply_logit_bias(x: torch.Tensor, rows: list["SamplingRequestState"], which: list[int]) -> None:
    """In place: each row's `params.logit_bias` added to its logits (ids past the logits skipped)."""
    vocab = x.shape[1]
    ban_rows, ids, values = [], [], []
    for i in which:
        for t, b in rows[i].params.logit_bias.items():
            if t < vocab:
                ban_rows.append(i)
                ids.append(t)
                values.append(b)
    if ban_rows:
        dev = x.device
        x.index_put_((to_device(ban_rows, torch.long, dev), to_device(ids, torch.long, dev)),
                     to_device(values, torch.float32, dev).to(x.dtype), accumulate=True)


def ban_tokens(x: torch.Tensor, rows: list[int], tokens: list[int]) -> None:
    """x[rows[j], tokens[j]] = -inf. Not `x[...] = float`: on CUDA that value becomes a host
    scalar copied to the device by a blocking copy, which waits for the whole queue."""
    x.index_put_((to_device(rows, torch.long, x.device), to_device(tokens, torch.long, x.device)),
                 x.new_full((len(rows),), float("-inf")))
