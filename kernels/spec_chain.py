"""The inputs of a chained verify step, made on the device from the step before it.

A verify step's rows are known only once the step before it is verified: how many proposals a
row kept moves its positions, and the next proposals are looked up in its tokens. A chained verify
step (worker/spec_decode/chain.py) is launched before the host knows that outcome, so this runs
on the device, between the step before and the chained step's forward:

1. acceptance of the step before, per request slot: a = the leading proposals equal to the
   draws at their positions, then the draw after them (the rule of worker/spec_decode/verify.py
   `num_accepted`);
2. the request's tokens (`hist`, a device copy of prompt + output) grow by those a + 1 tokens;
3. prompt lookup on the grown tokens: the longest suffix n-gram (n from `max_n` down to
   `min_n`) whose most recent earlier occurrence is followed by a token; up to k_i tokens
   that followed it are the new proposals (the rule of worker/spec_decode/ngram.py); fewer or
   none when the text does not repeat, the rest of the row filled with the new last token;
4. the chained step's decode rows (the host's `layout`: request g, kept in state slot i, has
   k_g + 1 rows from its first row on; requests that ended since the chain began are left out): input ids (the new last token, then the proposals), positions, KV slots from the
   rows' block tables, and context lengths.

State, one row a request slot of `meta` (int32 `[slots, 4 + width]`, and of `hist`): the number of tokens in `hist`,
the slot's first row in the step before, how many of its proposals are real (the rest is filler,
never accepted), how many tokens the lookup found (up to `width`, whatever k_i was: the host
reads it to give the slot proposal positions again), then the proposals. The kernel rewrites it for the chained step, so the next
chained step reads this one. The host reads the same row to verify the step itself: both sides
apply one rule to the same numbers, so they agree on every token.

`chain_inputs` dispatches: the Triton kernel of spec_chain_triton.py on CUDA, the plain-torch
reference below elsewhere (tests/kernels/test_spec_chain.py holds them equal).
"""

from __future__ import annotations

import torch

from .dispatch import use_triton

META_HEAD = 4  # tokens in hist, first row in the step before, real proposals, tokens found


def chain_inputs(draws: torch.Tensor, hist: torch.Tensor, meta: torch.Tensor, layout: torch.Tensor,
                 min_n: int, max_n: int, block_tables: torch.Tensor, page: int, input_ids: torch.Tensor,
                 positions: torch.Tensor, slots: torch.Tensor, seq_lens: torch.Tensor) -> None:
    """Write the chained step's rows into `input_ids` / `positions` / `slots` (int64) and
    `seq_lens` (int32), and move `hist` / `meta` on (see the module docstring). `draws`: the
    step before's argmax ids, one a row; `layout`: int32 `[3, requests]`, each request's first
    row in the chained step, its proposal positions (0 or more: it has that many + 1 rows) and
    its state slot (its row of `hist` and `meta`); `block_tables`: int32, the chained step's
    rows (every row of a request holds its table)."""
    width = meta.shape[1] - META_HEAD
    if layout.dim() != 2 or layout.shape[0] != 3 or layout.shape[1] > meta.shape[0]:
        raise ValueError(f"layout must be [3, requests <= {meta.shape[0]}], got {tuple(layout.shape)}")
    if layout.shape[1] == 0:
        return
    if use_triton(hist):
        from .spec_chain_triton import chain_inputs_triton
        chain_inputs_triton(draws, hist, meta, layout, min_n, max_n, block_tables, page,
                            input_ids, positions, slots, seq_lens)
        return
    if not all(0 <= k < width for k in layout[1].tolist()):
        raise ValueError(f"a request's proposals must be 0..{width - 1}, got {layout[1].tolist()}")
    if not all(0 <= i < meta.shape[0] for i in layout[2].tolist()):
        raise ValueError(f"state slots must be 0..{meta.shape[0] - 1}, got {layout[2].tolist()}")
    _chain_inputs_torch(draws, hist, meta, layout, min_n, max_n, block_tables, page,
                        input_ids, positions, slots, seq_lens)


def lookup(tokens: list[int], k: int, min_n: int, max_n: int) -> list[int]:
    """Up to k tokens that followed the most recent earlier occurrence (ending before the last
    token) of the longest suffix n-gram of `tokens`, n from max_n down to min_n; [] if none."""
    size = len(tokens)
    for n in range(min(max_n, size - 1), min_n - 1, -1):
        suffix = tokens[size - n:]
        for end in range(size - 2, n - 2, -1):
            if tokens[end - n + 1:end + 1] == suffix:
                return tokens[end + 1:end + 1 + k]
    return []


def _chain_inputs_torch(draws, hist, meta, layout, min_n, max_n, block_tables, page,
                        input_ids, positions, slots, seq_lens) -> None:
    width = meta.shape[1] - META_HEAD
    firsts, ks, state = layout.tolist()
    drawn = draws.tolist()
    tables = block_tables.tolist()
    for g, i in enumerate(state):
        length, off, k, _found, *props = meta[i].tolist()
        a = 0
        while a < k and props[a] == drawn[off + a]:
            a += 1
        x = drawn[off + a]
        hist[i, length:length + a + 1] = torch.tensor(props[:a] + [x], dtype=hist.dtype)
        length += a + 1
        tokens = hist[i, :length].tolist()
        found = lookup(tokens, width, min_n, max_n)
        k_new, first = ks[g], firsts[g]
        proposals = found[:k_new] + [x] * (k_new - len(found[:k_new]))
        meta[i, :META_HEAD + k_new] = torch.tensor([length, first, len(found[:k_new]), len(found), *proposals],
                                                   dtype=meta.dtype)
        table = tables[first]
        for j, token in enumerate([x, *proposals]):
            p = length - 1 + j
            input_ids[first + j] = token
            positions[first + j] = p
            slots[first + j] = table[p // page] * page + p % page
            seq_lens[first + j] = p + 1
