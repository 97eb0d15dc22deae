"""`apply_grammar_masks`: the sampler's grammar step, in place on one step's logits.

Owns: filling the packed token bitmask of the constrained rows on the host (each row's
`GrammarState`, synced to the row's tokens first) and applying it to those rows of the logits
only (`xgrammar.apply_token_bitmask_inplace`: C++ on the CPU, a kernel on CUDA). The bitmask
covers the model's vocabulary (`TokenizerInfo` is built over it); logits wider than that (a
padded LM head) get their extra columns set to -inf, narrower ones use the mask's prefix.
On CUDA the host fill runs while the step's forward is still queued on the device, and the mask
goes up from pinned memory without a host sync.
Bans the sampler would put on a constrained row (no_repeat_ngram_size, min_tokens) are cleared
from its mask instead, and only where they leave a token the grammar allows: a ban that would
empty the row is dropped (the grammar wins; an all -inf row would pick token 0).
Must never: touch rows without a grammar, or run for a row with tokens pending on the device
(its matcher would be a token behind: the engine makes such steps synchronous).
"""

from __future__ import annotations

from typing import Optional, Sequence

import numpy as np
import torch


def apply_grammar_masks(x: torch.Tensor, rows: Sequence, which: list[int],
                        bans: Optional[dict] = None) -> list[int]:
    """x[which] restricted to each row's allowed tokens (`rows[i].grammar`), less the tokens of
    `bans[i]` (the sampler's n-gram and min_tokens bans) unless that would leave none. Returns
    the rows whose state is broken (their logits are left as they are)."""
    import xgrammar as xgr

    n, width = x.shape
    states, use, broken = [], [], []
    for i in which:
        r = rows[i]
        if r.num_pending:
            raise RuntimeError("a constrained row was drawn with tokens pending on the device; "
                               "its grammar needs them on the host first")
        if not r.grammar.sync(r.output_token_ids):
            broken.append(i)
            continue
        states.append(r.grammar)
        use.append(i)
    if not use:
        return broken
    vocab = states[0].vocab_size
    bitmask = xgr.allocate_token_bitmask(n, vocab)
    for state, i in zip(states, use):
        state.fill(bitmask, i)
        if bans and bans.get(i):
            _clear_bans(bitmask[i], bans[i], vocab)
    if x.device.type == "cuda":
        bitmask = bitmask.pin_memory().to(x.device, non_blocking=True)
    xgr.apply_token_bitmask_inplace(x, bitmask, vocab_size=min(width, vocab), indices=use)
    if width > vocab:  # a padded LM head: ids past the vocabulary are never allowed
        idx = torch.tensor(use, dtype=torch.long, pin_memory=x.device.type == "cuda")
        idx = idx.to(x.device, non_blocking=True)
        x[:, vocab:].index_fill_(0, idx, float("-inf"))
    return broken


def _clear_bans(row: torch.Tensor, banned, vocab: int) -> None:
    """Clear the bits of `banned` in one packed bitmask row (int32 words, bit t % 32 of word
    t // 32), unless no allowed token would be left."""
    words = row.numpy().view(np.uint32)
    hits = [t for t in banned if 0 <= t < vocab and words[t >> 5] >> np.uint32(t & 31) & np.uint32(1)]
    if not hits:
        return
    if len(hits) >= int(np.unpackbits(words.view(np.uint8)).sum()):
        return  # every allowed token is banned: the grammar wins
    for t in hits:
        words[t >> 5] &= ~np.uint32(1 << (t & 31))
