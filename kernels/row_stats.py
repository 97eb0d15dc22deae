"""Per-row statistics of a logits matrix in one read: log-sum-exp and block maxima.

`row_stats(x, block=128)` returns `(lse, block_max)` for `x` [rows, vocab] in any float dtype:
`lse` [rows] float32 = log(sum(exp(x))) computed in float32, and `block_max` [rows,
ceil(vocab / block)] (x's dtype) = the maximum of each run of `block` columns (the last run may
be short). The sampler's logprobs need both: `lse` turns logits into logprobs, and the block
maxima let `topk_by_blocks` skip its own pass over the vocabulary. The reference reads `x` a few
times through torch; the Triton kernel (CUDA, or the interpreter in tests) reads it once, in its
own dtype, with no float32 copy. Rows that are all -inf get lse = -inf, as torch.logsumexp.

`logprob_pack` turns those into the logprob values (and greedy rows' ids) in one more launch
(kernels/logprob_pack_triton.py).

To extend: add an output to both the kernel and `row_stats_ref`, and a case to
tests/kernels/test_row_stats.py.
"""

from __future__ import annotations

import torch

from .dispatch import use_triton

BLOCK = 128


def block_maxima(x: torch.Tensor, block: int = BLOCK) -> torch.Tensor:
    """[rows, ceil(vocab / block)]: the maximum of each run of `block` columns, in x's dtype: one
    read in the Triton kernel where it runs (torch's reshaped `amax` reads a 256 x 151,936 bf16
    matrix at about a third of the copy rate), else `block_maxima_ref`."""
    if use_triton(x) and x.dim() == 2 and x.shape[1] and x.stride(1) == 1 and block == BLOCK:
        from .row_stats_triton import block_maxima_triton
        return block_maxima_triton(x, block)
    return block_maxima_ref(x, block)


def block_maxima_ref(x: torch.Tensor, block: int = BLOCK) -> torch.Tensor:
    """`block_maxima` in torch ops (the reference, and the CPU's path)."""
    n, vocab = x.shape
    nfull = vocab // block
    maxima = x[:, :nfull * block].reshape(n, nfull, block).amax(dim=-1)
    if nfull * block < vocab:
        maxima = torch.cat([maxima, x[:, nfull * block:].amax(dim=-1, keepdim=True)], dim=1)
    return maxima


def row_stats_ref(x: torch.Tensor, block: int = BLOCK) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.logsumexp(x.float(), dim=-1), block_maxima_ref(x, block)


def row_stats(x: torch.Tensor, block: int = BLOCK) -> tuple[torch.Tensor, torch.Tensor]:
    if x.dim() != 2 or x.shape[1] == 0:
        raise ValueError(f"row_stats needs a non-empty [rows, vocab] matrix, got {tuple(x.shape)}")
    if use_triton(x) and x.stride(1) == 1 and block == BLOCK:
        from .row_stats_triton import row_stats_triton
        return row_stats_triton(x, block)
    return row_stats_ref(x, block)


PACK_K_MAX = 32  # alternatives `logprob_pack` carries (kernels/logprob_pack_triton.py, K_PAD)


def logprob_pack(x: torch.Tensor, lse: torch.Tensor, chosen, vals: torch.Tensor, maxima: torch.Tensor,
                 block: int = BLOCK) -> tuple[torch.Tensor, torch.Tensor]:
    """(values float64 [n, 1 + k], chosen ids int64 [n]) in one launch, from `row_stats`' lse and
    block maxima and the top-k values `vals` (k <= PACK_K_MAX); `chosen` None takes each row's
    argmax from the maxima (see kernels/logprob_pack_triton.py). Triton only: the torch path is
    `worker.sampling.logprob_pack`'s own."""
    from .logprob_pack_triton import logprob_pack_triton
    return logprob_pack_triton(x, lse, chosen, vals, maxima, block)
