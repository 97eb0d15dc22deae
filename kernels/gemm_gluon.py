"""Mid-size GEMMs on Hopper in Gluon: `y = x @ W^T` for the 17-256 rows of a decode step.

Owns: `_gemm_kernel` and its launcher `gemm_sm90(x, weight, cfg, silu=False)` (bf16 or fp16 `x
[M, K]` and `weight [N, K]`, both contiguous; `cfg` a `GemmConfig`). With `silu`, `weight` is a
gate/up pair (gate rows, then as many up rows) and the result is `silu_and_mul(x @ weight^T)`,
`[M, N / 2]`: each program holds a gate tile and the up tile of the same columns in two
accumulators and applies SiLU-and-mul in its epilogue, rounding where the SiLU kernel does
(kernels/activation_triton.py), so no `[M, N]` intermediate is written or read back.

Why: at these rows cuBLAS runs a layer GEMM of the Qwen3-0.6B shape in 6-8 us, against 1.5-4.4
us at the bf16 matmul peak spread over every SM: its tiles leave most SMs idle for the N = 1,024
projections and it starts reading the weights only once the kernel before it has ended. Here
each program owns a 64-row tile of x (one warpgroup, `wgmma` from shared memory) and a BN-wide
tile of W, so the table (`gemm_table.py`, written by `bench/gemm.py --sweep`) can choose per shape
how many programs fill the GPU. Copies are TMA into a STAGES-deep ring (each program's
throughput is bounded by the bytes it keeps in flight, so deep rings and wide K steps win); a
program issues its first STAGES weight tiles before it waits on the previous kernel (PDL,
kernels/pdl.py: weights are never written during a step), then x's.
OOB rows of x read as zero (TMA) and the output store clips them, so M needs no padding.

Split-K (`cfg.splits` > 1, `partials=True`): the programs of split s cover K steps [s * STEPS,
(s + 1) * STEPS) and store their float32 tile unrounded into `[splits, rows_pad, N]` (rows_pad
= M rounded up to 64), with no reduction in the kernel: the consumer adds the splits in order
(`kernels.norm.add_rms_norm`, which reads its input once anyway), so the result is
deterministic. Why: the N = 1,024 projections (o, down) have 16 tiles at 64 rows, and each of
those programs streams all of K; splitting K puts every SM to work. (An in-kernel reduction by
the last program of a tile was measured and dropped: docs/kernels.md, "Tried and rejected".)
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma,
                                                              warpgroup_mma, warpgroup_mma_wait)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from .pdl import pdl_launch
from .pdl_gluon import pdl_gluon

BLOCK_M = 64  # one warpgroup's wgmma rows


@dataclass(frozen=True)
class GemmConfig:
    block_n: int = 128
    block_k: int = 64
    stages: int = 4
    splits: int = 1  # K split this many ways into float32 partial sums (`gemm_sm90(partials=True)`)

    def fits(self, m: int, n: int, k: int) -> bool:
        """Whether this config tiles the shape exactly along N and K (rows may be ragged), each
        split taking whole K steps."""
        return m > 0 and self.splits >= 1 and n % self.block_n == 0 and k % (self.block_k * self.splits) == 0

    def programs(self, m: int, n: int) -> int:
        """Output tiles (the grid's first axis; the splits are its second)."""
        return -(-m // BLOCK_M) * (n // self.block_n)

    def shared_bytes(self, silu: bool = False) -> int:
        """The ring (x and W tiles, bf16; with `silu` two W tiles a stage) and the output tile
        (float32 where split)."""
        ring = self.stages * (BLOCK_M + (2 if silu else 1) * self.block_n) * self.block_k * 2
        return ring + BLOCK_M * self.block_n * (4 if self.splits > 1 else 2)


@gluon.jit
def _store_tile(c_desc, acc, off_m, off_n):
    """acc (float32, the wgmma layout) rounded to the output dtype and stored by TMA (rows past
    M clipped)."""
    c_smem = gl.allocate_shared_memory(c_desc.dtype, c_desc.block_type.shape, c_desc.layout)
    c_smem.store(acc.to(c_desc.dtype))
    fence_async_shared()
    tma.async_copy_shared_to_global(c_desc, [off_m, off_n], c_smem)
    tma.store_wait(pendings=0)


@gluon.jit
def _gemm_kernel(a_desc, w_desc, c_desc, n_m, up_row, c_rows,
                 STEPS: gl.constexpr, STAGES: gl.constexpr, SILU: gl.constexpr, PDL: gl.constexpr,
                 num_warps: gl.constexpr):
    BM: gl.constexpr = a_desc.block_type.shape[0]
    BK: gl.constexpr = a_desc.block_type.shape[1]
    BN: gl.constexpr = w_desc.block_type.shape[0]
    W_TILES: gl.constexpr = 2 if SILU else 1  # SILU: a gate tile and its up tile (`up_row` below)
    NBYTES: gl.constexpr = a_desc.block_type.nbytes + W_TILES * w_desc.block_type.nbytes
    PRE: gl.constexpr = STAGES if STAGES < STEPS else STEPS
    pdl_gluon(PDL, False)

    tile = gl.program_id(0)  # the programs of one W tile are adjacent: it is read once from HBM
    off_m = (tile % n_m) * BM
    off_n = (tile // n_m) * BN
    k0 = gl.program_id(1) * (STEPS * BK)  # this split's first column of K (0 unsplit)
    c_row0 = gl.program_id(1) * c_rows  # its slab of the partials (c_rows 0 unsplit)

    a_smem = gl.allocate_shared_memory(a_desc.dtype, [STAGES, BM, BK], a_desc.layout)
    w_smem = gl.allocate_shared_memory(w_desc.dtype, [STAGES, BN, BK], w_desc.layout)
    if SILU:
        u_smem = gl.allocate_shared_memory(w_desc.dtype, [STAGES, BN, BK], w_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for s in gl.static_range(STAGES):
        mbarrier.init(ready.index(s), count=1)
    # The weights first: no kernel of the step writes them, so they load before the wait.
    for s in gl.static_range(PRE):
        mbarrier.expect(ready.index(s), NBYTES)
        tma.async_copy_global_to_shared(w_desc, [off_n, k0 + s * BK], ready.index(s), w_smem.index(s))
        if SILU:
            tma.async_copy_global_to_shared(w_desc, [up_row + off_n, k0 + s * BK], ready.index(s), u_smem.index(s))
    pdl_gluon(PDL, True)
    for s in gl.static_range(PRE):
        tma.async_copy_global_to_shared(a_desc, [off_m, k0 + s * BK], ready.index(s), a_smem.index(s))

    mma_l: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                    instr_shape=[16, BN, 16])
    acc = gl.zeros([BM, BN], gl.float32, layout=mma_l)
    if SILU:
        acc_u = gl.zeros([BM, BN], gl.float32, layout=mma_l)
    for i in range(STEPS):
        cur = i % STAGES
        mbarrier.wait(ready.index(cur), (i // STAGES) & 1)
        acc = warpgroup_mma(a_smem.index(cur), w_smem.index(cur).permute((1, 0)), acc, is_async=True)
        # Step i-1's wgmmas are done once at most this step's are outstanding: its stage takes
        # step i-1+STAGES.
        if SILU:
            acc_u = warpgroup_mma(a_smem.index(cur), u_smem.index(cur).permute((1, 0)), acc_u,
                                  is_async=True)
            acc, acc_u = warpgroup_mma_wait(num_outstanding=2, deps=(acc, acc_u))
        else:
            acc = warpgroup_mma_wait(num_outstanding=1, deps=(acc, ))
        nxt = i - 1 + STAGES
        if (i > 0) & (nxt < STEPS):
            sp = nxt % STAGES
            mbarrier.expect(ready.index(sp), NBYTES)
            tma.async_copy_global_to_shared(w_desc, [off_n, k0 + nxt * BK], ready.index(sp), w_smem.index(sp))
            if SILU:
                tma.async_copy_global_to_shared(w_desc, [up_row + off_n, k0 + nxt * BK], ready.index(sp),
                                                u_smem.index(sp))
            tma.async_copy_global_to_shared(a_desc, [off_m, k0 + nxt * BK], ready.index(sp), a_smem.index(sp))
    if SILU:
        acc, acc_u = warpgroup_mma_wait(num_outstanding=0, deps=(acc, acc_u))
    else:
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, ))
    for st in gl.static_range(STAGES):
        mbarrier.invalidate(ready.index(st))

    if SILU:  # as _silu_and_mul_kernel: inputs rounded to the activation dtype, then SiLU rounded
        dt: gl.constexpr = c_desc.dtype
        gate = acc.to(dt).to(gl.float32)
        act = (gate / (1.0 + gl.exp(-gate))).to(dt).to(gl.float32)
        acc = act * acc_u.to(dt).to(gl.float32)
    _store_tile(c_desc, acc, c_row0 + off_m, off_n)


_GL_DTYPES = {torch.bfloat16: gl.bfloat16, torch.float16: gl.float16}


def gemm_supported(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """The inputs this kernel takes: CUDA sm_90, bf16/fp16 of one dtype, 2-D, contiguous."""
    return (x.is_cuda and x.dim() == 2 and weight.dim() == 2 and x.dtype in _GL_DTYPES
            and weight.dtype == x.dtype and x.is_contiguous() and weight.is_contiguous()
            and x.shape[1] == weight.shape[1]
            and torch.cuda.get_device_capability(x.device)[0] == 9)


def gemm_sm90(x: torch.Tensor, weight: torch.Tensor, cfg: GemmConfig, pdl: bool = True,
              silu: bool = False, partials: bool = False) -> torch.Tensor:
    """`x @ weight^T` (`[M, N]` in x's dtype; with `silu` see above). With `partials` and
    `cfg.splits` > 1: the float32 split-K partial sums `[splits, rows_pad, N]` instead (their sum
    over the first axis, rows < M, is the product); without `partials` a split config runs
    unsplit."""
    m, k = x.shape
    n = weight.shape[0] // 2 if silu else weight.shape[0]  # output columns
    if silu and weight.shape[0] % 2:
        raise ValueError(f"a gate/up weight has an even number of rows, got {weight.shape[0]}")
    if cfg.splits > 1 and (silu or not partials):
        cfg = replace(cfg, splits=1)  # SiLU needs the whole sum; a caller not taking partials
    if not cfg.fits(m, n, k):
        raise ValueError(f"GemmConfig {cfg} does not tile a {m}x{n}x{k} GEMM")
    dt = _GL_DTYPES[x.dtype]
    bm, bn, bk = BLOCK_M, cfg.block_n, cfg.block_k
    n_m = -(-m // bm)
    if cfg.splits > 1:
        out = torch.empty(cfg.splits, n_m * bm, n, dtype=torch.float32, device=x.device)
        c2, c_dt, c_rows = out.view(-1, n), gl.float32, n_m * bm
    else:
        out = torch.empty(m, n, dtype=x.dtype, device=x.device)
        c2, c_dt, c_rows = out, dt, 0
    a_desc = TensorDescriptor.from_tensor(x, [bm, bk], gl.NVMMASharedLayout.get_default_for([bm, bk], dt))
    w_desc = TensorDescriptor.from_tensor(weight, [bn, bk], gl.NVMMASharedLayout.get_default_for([bn, bk], dt))
    c_desc = TensorDescriptor.from_tensor(c2, [bm, bn], gl.NVMMASharedLayout.get_default_for([bm, bn], c_dt))
    _gemm_kernel[(cfg.programs(m, n), cfg.splits)](
        a_desc, w_desc, c_desc, n_m, n, c_rows, STEPS=k // bk // cfg.splits, STAGES=cfg.stages,
        SILU=silu, PDL=pdl, num_warps=4, **pdl_launch(pdl))
    return out
