"""The device half of logprobs: each row's log-sum-exp and the pack of the sampled token's
logprob with the top-k alternatives, taken from the logits before temperature and the filters.

Owns: `lse_and_block_maxima` (one read of the rows: `kernels.row_stats` where Triton runs, else
block sums), `logprob_pack` (float64 values and int64 ids, and greedy rows' ids, left on the
device; one launch where Triton runs; the host builds entries from them later,
worker/text/logprob_rows.py). To add a per-token field (e.g. ranks): compute
it here beside the pack and carry it in the sampler's one transfer.
"""

from __future__ import annotations

from typing import Optional

import torch

from infer_cluster.kernels.dispatch import use_triton
from infer_cluster.kernels.row_stats import PACK_K_MAX, row_stats
from infer_cluster.kernels.row_stats import logprob_pack as pack_kernel

from infer_cluster.worker.sampling.ops import TOPK_BLOCK, block_sums, topk, topk_by_blocks


def _logsumexp(x: torch.Tensor) -> torch.Tensor:
    """[n] float64 log-sum-exp of each row, from cache-sized block sums (no [n, vocab] write)."""
    if x.is_cuda:  # one fused reduction; the block sums below spare the CPU's caches
        return torch.logsumexp(x, dim=-1).double()
    m = x.amax(dim=-1, keepdim=True)
    ones = torch.ones_like(m)
    sums = block_sums(x, m, ones).double().sum(dim=-1)
    return m.squeeze(1).double() + sums.log()


def lse_and_block_maxima(x: torch.Tensor) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """[n] log-sum-exp of each row (float32 from the kernel, float64 on the CPU's path; either
    is taken as float64 below), and on the kernel path the rows' block maxima (for the top-k
    and the greedy ids): one read of `x` in its own dtype (`kernels.row_stats`) instead of a
    float32 copy, a logsumexp and the top-k's own pass."""
    if use_triton(x):  # the kernel; row_stats itself falls back for strided rows
        return row_stats(x, TOPK_BLOCK)
    return _logsumexp(x), None


def logprob_pack(x: torch.Tensor, lse: torch.Tensor, chosen: Optional[torch.Tensor], k: int,
                 maxima: Optional[torch.Tensor] = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """On the device: float64 [rows, 1 + k] (the sampled token's logprob, then the top-k
    logprobs), int64 [rows, k] (their ids) and the sampled ids [rows]. logprob = logit -
    logsumexp; the alternatives by one topk over the logits (the same order as over the
    logprobs), through the block maxima when the caller has them. `chosen` None: the rows are
    greedy, and their ids are each row's argmax (torch's rule), which the kernel path finds from
    the block maxima in the same launch as the values (kernels/logprob_pack_triton.py)."""
    if maxima is not None and k <= min(maxima.shape[1], PACK_K_MAX) and use_triton(x) and x.stride(1) == 1:
        if k:
            vals, ids = topk_by_blocks(x, k, maxima)
        else:  # float32 values, as topk_select's: the launch keeps its one compiled variant
            vals = torch.empty(x.shape[0], 0, dtype=torch.float32, device=x.device)
            ids = torch.empty(x.shape[0], 0, dtype=torch.long, device=x.device)
        values, chosen = pack_kernel(x, lse, chosen, vals, maxima, TOPK_BLOCK)
        return values, ids, chosen
    if chosen is None:
        chosen = x.argmax(dim=-1)
    lse = lse.double()
    sampled = x.gather(1, chosen.unsqueeze(1)).double() - lse.unsqueeze(1)
    if not k:
        return sampled, torch.empty(x.shape[0], 0, dtype=torch.long, device=x.device), chosen
    if maxima is not None and k <= maxima.shape[1]:
        vals, ids = topk_by_blocks(x, k, maxima)
    else:
        vals, ids = topk(x, k)
    return torch.cat([sampled, vals.double() - lse.unsqueeze(1)], dim=1), ids, chosen
