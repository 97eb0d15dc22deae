"""`apply_grammar_masks`: the sampler's grammar step, in place on one step's logits.

Owns: filling the packed token bitmask of the constrained rows on the host (each row's
`GrammarState`, synced to the row's tokens first) and applying it to those rows of the logits
only (`xgrammar.apply_token_bitmask_inplace`: C++ on the CPU, a kernel on CUDA). The bitmask
covers the model's vocabulary (`TokenizerInfo` is built over it); logits wider than that (a
padded LM head) get their extra columns set to -inf, narrower ones use the mask's prefix.
On CUDA the host fill runs while the step's forward is still queued on the device, and the mask
goes up from pinned memory without a host sync.
Must never: touch rows without a grammar, or run for a row with tokens pending on the device
(its matcher would be a token behind: the engine makes such steps synchronous).
"""

from __future__ import annotations

from typing import Sequence

import torch


def apply_grammar_masks(x: torch.Tensor, rows: Sequence, which: list[int]) -> list[int]:
    """x[which] restricted to each row's allowed tokens (`rows[i].grammar`). Returns the rows
    whose state is broken (their logits are left as they are)."""
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
    if x.device.type == "cuda":
        bitmask = bitmask.pin_memory().to(x.device, non_blocking=True)
    xgr.apply_token_bitmask_inplace(x, bitmask, vocab_size=min(width, vocab), indices=use)
    if width > vocab:  # a padded LM head: ids past the vocabulary are never allowed
        idx = torch.tensor(use, dtype=torch.long, pin_memory=x.device.type == "cuda")
        idx = idx.to(x.device, non_blocking=True)
        x[:, vocab:].index_fill_(0, idx, float("-inf"))
    return broken
