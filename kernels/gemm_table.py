"""Launch configs for `kernels.gemm.linear_mid`, written by `bench/gemm.py --sweep` on an H200.

Owns: TABLE, keyed (N, K, 64-row tiles of M) -> GemmConfig, or None where cuBLAS stayed ahead;
keys ending in "silu" are the gate/up GEMM with SiLU-and-mul fused (N = the gate/up rows), None
where cuBLAS and the SiLU kernel stayed ahead.
Plain data: `bench/gemm.py --sweep --write` rewrites a model's entries and keeps the rest, each
model's under its stamp line; shapes not listed stay on cuBLAS. Never put logic here.
"""

from .gemm_gluon import GemmConfig  # noqa: F401  (entries are GemmConfig(...) literals)

TABLE: dict = {
    # qwen3-0.6b: `python bench/gemm.py --sweep --write --model qwen3-0.6b --m 64 128 192 256`, NVIDIA H200, 2026-12-02, at 90a403d with two-warpgroup candidates beside these (slower in every cell, not kept)
    (1024, 2048, 1): GemmConfig(block_n=64, block_k=128, stages=4, splits=4),  # o M=64: 4.58 us vs cuBLAS + add-norm 7.09 us
    (1024, 2048, 2): GemmConfig(block_n=64, block_k=128, stages=6, splits=2),  # o M=128: 4.94 us vs cuBLAS + add-norm 7.42 us
    (1024, 2048, 3): GemmConfig(block_n=64, block_k=128, stages=6, splits=2),  # o M=192: 5.38 us vs cuBLAS + add-norm 7.59 us
    (1024, 2048, 4): GemmConfig(block_n=64, block_k=128, stages=6, splits=2),  # o M=256: 5.89 us vs cuBLAS + add-norm 7.97 us
    (1024, 3072, 1): GemmConfig(block_n=64, block_k=128, stages=6, splits=3),  # down M=64: 5.13 us vs cuBLAS + add-norm 8.02 us
    (1024, 3072, 2): GemmConfig(block_n=64, block_k=128, stages=6, splits=2),  # down M=128: 5.88 us vs cuBLAS + add-norm 8.56 us
    (1024, 3072, 3): GemmConfig(block_n=64, block_k=128, stages=6, splits=2),  # down M=192: 6.32 us vs cuBLAS + add-norm 9.05 us
    (1024, 3072, 4): GemmConfig(block_n=64, block_k=128, stages=6, splits=2),  # down M=256: 6.85 us vs cuBLAS + add-norm 9.52 us
    (4096, 1024, 1): GemmConfig(block_n=64, block_k=128, stages=6),  # qkv M=64: 3.89 us vs cuBLAS 5.08 us
    (4096, 1024, 2): GemmConfig(block_n=64, block_k=128, stages=5),  # qkv M=128: 4.54 us vs cuBLAS 5.06 us
    (4096, 1024, 3): GemmConfig(block_n=128, block_k=128, stages=4),  # qkv M=192: 5.45 us vs cuBLAS 6.03 us
    (4096, 1024, 4): GemmConfig(block_n=128, block_k=128, stages=4),  # qkv M=256: 5.79 us vs cuBLAS 6.05 us
    (6144, 1024, 1): GemmConfig(block_n=64, block_k=128, stages=5),  # gate_up M=64: 4.83 us vs cuBLAS 6.21 us
    (6144, 1024, 1, 'silu'): GemmConfig(block_n=64, block_k=128, stages=4),  # gate_up+silu M=64: 5.73 us vs cuBLAS + SiLU 7.59 us
    (6144, 1024, 2): None,  # gate_up M=128: 5.77 us vs cuBLAS 5.77 us
    (6144, 1024, 2, 'silu'): GemmConfig(block_n=64, block_k=64, stages=8),  # gate_up+silu M=128: 6.17 us vs cuBLAS + SiLU 8.02 us
    (6144, 1024, 3): None,  # gate_up M=192: 7.00 us vs cuBLAS 7.00 us
    (6144, 1024, 3, 'silu'): GemmConfig(block_n=64, block_k=64, stages=4),  # gate_up+silu M=192: 7.55 us vs cuBLAS + SiLU 8.99 us
    (6144, 1024, 4): None,  # gate_up M=256: 7.26 us vs cuBLAS 7.26 us
    (6144, 1024, 4, 'silu'): GemmConfig(block_n=128, block_k=64, stages=5),  # gate_up+silu M=256: 8.30 us vs cuBLAS + SiLU 9.78 us
}
