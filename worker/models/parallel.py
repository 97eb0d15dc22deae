"""Tensor-parallel building blocks: column/row-parallel linears, vocab-parallel embedding and
LM head. With `tp_size == 1` they are plain matmuls (no communication).

Owns: how a full checkpoint tensor is cut into this rank's shard (`weight_loader`) and the
collective each layer needs (all-reduce after a row-parallel linear or the embedding, all-gather
of logits, or of argmax pairs for a greedy step: `ParallelLMHead.greedy_ids`; small all-reduces
may go through `ParallelState.fast_all_reduce`). `ParallelState` carries the rank, size and
process group explicitly: there is no module-level state. To add a sharded layer: give every
parameter a `weight_loader(param, loaded, shard_id)` that copies this rank's slice.

At decode batch sizes (<= `kernels.gemv.GEMV_MAX_M` rows, on the Triton dispatch) the linears and
the LM head run `kernels.gemv.linear_small` (the MLP down projection its fused SiLU twin), which
takes a tuned Triton GEMV or cuBLAS per shape and row count; `INFER_CLUSTER_GEMV=0`, read when a
layer is built, keeps them on `F.linear`. The collectives and the row-parallel bias (added once,
after the all-reduce) are the same either way. There, `ColumnParallelLinear.forward_rms_norm`
also runs the residual add + RMSNorm before the layer in the GEMV's prologue where
`kernels.gemv.fused_norm_config` allows (batch 1; `kernels.gemv.rms_norm_linear_small`; the norm
is over the full hidden, which every rank holds before a column-parallel linear);
`INFER_CLUSTER_NORM_FUSE=0` keeps the norm a kernel of its own. From 17 to 256 rows the
unbiased layer linears take `kernels.gemm.linear_mid` where its table (written by
`bench/gemm.py --sweep --write` on an H200) names the Gluon Hopper GEMM for the shape, else
cuBLAS; a gate/up layer's `forward_silu` also runs the SiLU-and-mul in that GEMM's epilogue
where the table has a "silu" row for it, and a row-parallel layer's `forward_split` returns
split-K partial sums where the table splits its K (one rank), which the add + norm after it
sums. `INFER_CLUSTER_GEMM=0`, read when a layer is built, keeps them all on cuBLAS, as an eager
engine does (`DecoderModel.keep_cublas`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from infer_cluster.kernels import silu_and_mul
from infer_cluster.kernels.gemm import gemm_enabled, gemm_split_enabled, linear_mid, mid_path, silu_linear_mid
from infer_cluster.kernels.norm import add_rms_norm
from infer_cluster.kernels.gemv import (gemv_enabled, linear_small, norm_fuse_enabled, rms_norm_linear_small,
                                        silu_mul_linear_small, use_small_path)


# torch 2.13 renamed all_gather_into_tensor (deprecated there) to all_gather_single.
_gather_into = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


@dataclass
class ParallelState:
    tp_rank: int = 0
    tp_size: int = 1
    tp_group: Optional[object] = None
    # A faster sum for tensors it `fits` (worker/distributed/symm_allreduce.py); None: NCCL/gloo only.
    fast_all_reduce: Optional[object] = None

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """The sum of x over the TP group: x itself, summed in place, or a new tensor (use the
        return value)."""
        if self.tp_size > 1:
            fast = self.fast_all_reduce
            if fast is not None and fast.fits(x):
                return fast(x)
            dist.all_reduce(x, group=self.tp_group)
        return x

    def all_gather_last_dim(self, x: torch.Tensor) -> torch.Tensor:
        """`[rows, d]` on each rank -> `[rows, tp * d]`, rank order along the last dim. One
        gather into one flat buffer (graph-capturable, no per-rank list), then a transpose."""
        if self.tp_size == 1:
            return x
        rows, d = x.shape
        out = torch.empty(self.tp_size * rows, d, dtype=x.dtype, device=x.device)
        _gather_into(out, x.contiguous(), group=self.tp_group)
        return out.view(self.tp_size, rows, d).transpose(0, 1).reshape(rows, self.tp_size * d)


def _divide(n: int, d: int, what: str) -> int:
    if n % d:
        raise ValueError(f"{what} ({n}) is not divisible by tensor_parallel_size ({d})")
    return n // d


class ColumnParallelLinear(nn.Module):
    """y = x W^T with W's output rows split across ranks. `output_sizes` lists the logical
    sub-matrices stacked in W (e.g. q, k, v) so each is split on its own; `replicas` lets a
    sub-matrix with fewer heads than ranks be replicated (KV heads < tp_size)."""

    def __init__(self, input_size: int, output_sizes: Sequence[int], bias: bool, ps: ParallelState,
                 num_replicas: Optional[Sequence[int]] = None):
        super().__init__()
        self.ps = ps
        self.output_sizes = list(output_sizes)
        # num_replicas[i] ranks share the same shard of sub-matrix i.
        self.num_replicas = list(num_replicas or [1] * len(output_sizes))
        self.shard_sizes = [_divide(size * r, ps.tp_size, "output size")
                            for size, r in zip(self.output_sizes, self.num_replicas)]
        out = sum(self.shard_sizes)
        self.use_gemv = gemv_enabled()
        self.use_gemm = gemm_enabled() and not bias
        self.fuse_norm = norm_fuse_enabled()
        self.weight = nn.Parameter(torch.empty(out, input_size), requires_grad=False)
        self.weight.weight_loader = self.load_shard
        if bias:
            self.bias = nn.Parameter(torch.empty(out), requires_grad=False)
            self.bias.weight_loader = self.load_shard
        else:
            self.register_parameter("bias", None)

    def load_shard(self, param: nn.Parameter, loaded: torch.Tensor, shard_id: int = 0) -> None:
        size = self.shard_sizes[shard_id]
        offset = sum(self.shard_sizes[:shard_id])
        shard_rank = self.ps.tp_rank // self.num_replicas[shard_id]
        piece = loaded.narrow(0, shard_rank * size, size)
        param.data.narrow(0, offset, size).copy_(piece)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if use_small_path(self.use_gemv, x):
            return linear_small(x, self.weight, self.bias)
        if mid_path(self.use_gemm, x, self.weight):
            return linear_mid(x, self.weight)
        return F.linear(x, self.weight, self.bias)

    def forward_rms_norm(self, x: torch.Tensor, residual: Optional[torch.Tensor],
                         norm_weight: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
        """`(forward(rms_norm(x + residual)), x + residual)`, or `(forward(rms_norm(x)), x)`
        without a residual; one launch on the small path."""
        if self.fuse_norm and use_small_path(self.use_gemv, x):
            return rms_norm_linear_small(x, residual, norm_weight, eps, self.weight, self.bias)
        h, residual = add_rms_norm(x, residual, norm_weight, eps)
        return self(h), residual

    def silu_applies(self, x: torch.Tensor) -> bool:
        """Whether `forward_silu` runs one launch for rows like `x` (a gate/up layer: gate rows,
        then up rows, in each rank's shard)."""
        return self.bias is None and mid_path(self.use_gemm, x, self.weight, silu=True)

    def forward_silu(self, x: torch.Tensor) -> torch.Tensor:
        """`silu_and_mul(forward(x))` of a gate/up layer: one launch where `silu_applies`."""
        if self.bias is not None:
            return silu_and_mul(self(x))
        return silu_linear_mid(x, self.weight)


class RowParallelLinear(nn.Module):
    """y = x W^T with W's input columns split across ranks; partial sums are all-reduced."""

    def __init__(self, input_size: int, output_size: int, bias: bool, ps: ParallelState):
        super().__init__()
        self.ps = ps
        self.shard_size = _divide(input_size, ps.tp_size, "input size")
        self.use_gemv = gemv_enabled()
        self.use_gemm = gemm_enabled()  # the bias is added after the reduction, never in the GEMM
        self.use_split = gemm_split_enabled() and ps.tp_size == 1  # partials skip the all-reduce
        self.weight = nn.Parameter(torch.empty(output_size, self.shard_size), requires_grad=False)
        self.weight.weight_loader = self.load_shard
        if bias:  # added once, after the reduction
            self.bias = nn.Parameter(torch.empty(output_size), requires_grad=False)
            self.bias.weight_loader = lambda p, w, shard_id=0: p.data.copy_(w)
        else:
            self.register_parameter("bias", None)

    def load_shard(self, param: nn.Parameter, loaded: torch.Tensor, shard_id: int = 0) -> None:
        param.data.copy_(loaded.narrow(1, self.ps.tp_rank * self.shard_size, self.shard_size))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if use_small_path(self.use_gemv, x):
            y = linear_small(x, self.weight)
        elif mid_path(self.use_gemm, x, self.weight):
            y = linear_mid(x, self.weight)
        else:
            y = F.linear(x, self.weight)
        return self._reduce(y)

    def forward_split(self, x: torch.Tensor) -> torch.Tensor:
        """`forward(x)`, or its split-K partial sums (float32 `[splits, rows_pad, N]`,
        `kernels.gemm.is_partials`) where the mid-size table splits this shape's K: one rank
        and no bias only, for callers whose next op is `kernels.norm.add_rms_norm`, which adds
        them as it reads them."""
        if self.use_split and self.bias is None and mid_path(self.use_gemm, x, self.weight):
            return linear_mid(x, self.weight, partials=True)
        return self.forward(x)

    def forward_silu_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        """`forward(silu_and_mul(gate_up))`; on the small path the SiLU runs inside the GEMV."""
        if use_small_path(self.use_gemv, gate_up):
            return self._reduce(silu_mul_linear_small(gate_up, self.weight))
        return self.forward(silu_and_mul(gate_up))

    def _reduce(self, y: torch.Tensor) -> torch.Tensor:
        y = self.ps.all_reduce(y)
        return y if self.bias is None else y + self.bias


class VocabParallelEmbedding(nn.Module):
    """Embedding rows split by vocab range; rows outside this rank's range contribute zeros
    and one all-reduce assembles the full vectors."""

    def __init__(self, vocab_size: int, hidden_size: int, ps: ParallelState):
        super().__init__()
        self.ps = ps
        self.vocab_size = vocab_size
        self.shard_size = -(-vocab_size // ps.tp_size)
        self.start = ps.tp_rank * self.shard_size
        self.weight = nn.Parameter(torch.zeros(self.shard_size, hidden_size), requires_grad=False)
        self.weight.weight_loader = self.load_shard
        self.use_gemv = gemv_enabled()
        self.fuse_norm = norm_fuse_enabled()

    def load_shard(self, param: nn.Parameter, loaded: torch.Tensor, shard_id: int = 0) -> None:
        rows = loaded[self.start:self.start + self.shard_size]
        param.data.zero_()
        param.data[:rows.shape[0]].copy_(rows)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if self.ps.tp_size == 1:
            return F.embedding(ids, self.weight)
        local = ids - self.start
        outside = (local < 0) | (local >= self.shard_size)
        out = F.embedding(local.masked_fill(outside, 0), self.weight)
        out.masked_fill_(outside[:, None], 0)
        return self.ps.all_reduce(out)


class ParallelLMHead(VocabParallelEmbedding):
    """Logits over this rank's vocab shard, gathered to full width (padding rows dropped).

    `gather=False` leaves them as this rank's shard `[rows, shard_size]` for `greedy_ids`,
    where each rank takes its shard's argmax and only `[rows, 2]` pairs are gathered: a step
    whose rows are all greedy needs no `[rows, vocab]` tensor anywhere (a T > 1 shard)."""

    def greedy_ids(self, local: torch.Tensor) -> torch.Tensor:
        """The argmax over the full vocab of each row (int64 `[rows]`, ties to the lowest id,
        as `torch.argmax` of the gathered logits), from this rank's shard: one all-gather of
        `[rows, 2]` (value, id) pairs. Every rank of the group (T > 1) calls it and gets the ids."""
        valid = max(0, min(self.shard_size, self.vocab_size - self.start))  # padding columns: none
        pair = shard_argmax_pair(local[:, :valid], self.start)
        pairs = torch.empty(self.ps.tp_size * pair.shape[0], 2, dtype=pair.dtype, device=pair.device)
        _gather_into(pairs, pair, group=self.ps.tp_group)
        return pick_shard_argmax(pairs.view(self.ps.tp_size, -1, 2))

    def _finish(self, local: torch.Tensor, gather: bool) -> torch.Tensor:
        return self.ps.all_gather_last_dim(local)[:, :self.vocab_size] if gather else local

    def logits(self, hidden: torch.Tensor, gather: bool = True) -> torch.Tensor:
        # linear_small keeps cuBLAS for vocab-wide shapes unless the tuned table says otherwise.
        small = use_small_path(self.use_gemv, hidden)
        local = linear_small(hidden, self.weight) if small else F.linear(hidden, self.weight)
        return self._finish(local, gather)

    def logits_rms_norm(self, hidden: torch.Tensor, residual: Optional[torch.Tensor],
                        norm_weight: torch.Tensor, eps: float, gather: bool = True) -> torch.Tensor:
        """`logits(rms_norm(hidden + residual))`; on the small path the add + norm run in the
        LM head GEMV's prologue (the new residual is not needed after the last layer)."""
        if self.fuse_norm and use_small_path(self.use_gemv, hidden):
            local, _ = rms_norm_linear_small(hidden, residual, norm_weight, eps, self.weight)
            return self._finish(local, gather)
        return self.logits(add_rms_norm(hidden, residual, norm_weight, eps)[0], gather)


# Ids travel as float32 beside their values: exact below 2**24.
MAX_PAIR_VOCAB = 1 << 24


def shard_argmax_pair(local: torch.Tensor, start: int) -> torch.Tensor:
    """`[rows, 2]` float32: each row's largest value in this shard and its vocab id (`start` +
    the first column that holds it). A shard with no column gives (-inf, start)."""
    if local.shape[1] == 0:
        pair = torch.full((local.shape[0], 2), float("-inf"), dtype=torch.float32, device=local.device)
        pair[:, 1] = start
        return pair
    idx = local.argmax(dim=-1, keepdim=True)
    return torch.cat([local.gather(1, idx).float(), (idx + start).float()], dim=1)


def pick_shard_argmax(pairs: torch.Tensor) -> torch.Tensor:
    """`[tp, rows, 2]` pairs in rank order -> int64 `[rows]`: the id of the largest value, the
    lowest rank on ties (argmax takes the first maximum), which is the lowest vocab id."""
    best = pairs[..., 0].argmax(dim=0, keepdim=True)
    return pairs[..., 1].gather(0, best)[0].long()
