"""Launch configs for `kernels.gemm.linear_mid`, written by `bench/gemm.py --sweep` on an H200.

Owns: TABLE, keyed (N, K, 64-row tiles of M) -> GemmConfig, or None where cuBLAS stayed ahead;
keys ending in "silu" are the gate/up GEMM with SiLU-and-mul fused (N = the gate/up rows), None
where cuBLAS and the SiLU kernel stayed ahead.
Plain data: `bench/gemm.py --sweep --write` rewrites a model's entries and keeps the rest, each
model's under its stamp line; shapes not listed stay on cuBLAS. Never put logic here.
"""

from .gemm_gluon import GemmConfig  # noqa: F401  (entries are GemmConfig(...) literals)

TABLE: dict = {
    # qwen3-0.6b: `python bench/gemm.py --sweep --write --model qwen3-0.6b --m 32 64 128 192 256`, NVIDIA H200, 2026-11-30, commit 7b1ed0a
    (1024, 2048, 1): GemmConfig(block_n=64, block_k=128, stages=6),  # o M=64: 4.52 us vs cuBLAS 5.50 us
    (1024, 2048, 2): GemmConfig(block_n=64, block_k=128, stages=6),  # o M=128: 4.51 us vs cuBLAS 5.73 us
    (1024, 2048, 3): GemmConfig(block_n=64, block_k=128, stages=6),  # o M=192: 4.62 us vs cuBLAS 5.94 us
    (1024, 2048, 4): GemmConfig(block_n=64, block_k=128, stages=6),  # o M=256: 4.65 us vs cuBLAS 6.19 us
    (1024, 3072, 1): GemmConfig(block_n=64, block_k=128, stages=6),  # down M=64: 6.20 us vs cuBLAS 7.19 us
    (1024, 3072, 2): GemmConfig(block_n=64, block_k=128, stages=6),  # down M=128: 6.16 us vs cuBLAS 7.31 us
    (1024, 3072, 3): GemmConfig(block_n=64, block_k=128, stages=6),  # down M=192: 6.15 us vs cuBLAS 7.38 us
    (1024, 3072, 4): GemmConfig(block_n=64, block_k=128, stages=6),  # down M=256: 6.22 us vs cuBLAS 7.30 us
    (4096, 1024, 1): GemmConfig(block_n=64, block_k=128, stages=6),  # qkv M=64: 3.80 us vs cuBLAS 4.99 us
    (4096, 1024, 2): GemmConfig(block_n=64, block_k=128, stages=5),  # qkv M=128: 4.46 us vs cuBLAS 4.95 us
    (4096, 1024, 3): GemmConfig(block_n=128, block_k=128, stages=4),  # qkv M=192: 5.25 us vs cuBLAS 5.49 us
    (4096, 1024, 4): GemmConfig(block_n=128, block_k=128, stages=4),  # qkv M=256: 5.65 us vs cuBLAS 5.91 us
    (6144, 1024, 1): GemmConfig(block_n=64, block_k=128, stages=5),  # gate_up M=64: 4.72 us vs cuBLAS 5.75 us
    (6144, 1024, 2): GemmConfig(block_n=128, block_k=64, stages=8),  # gate_up M=128: 5.66 us vs cuBLAS 5.86 us
    (6144, 1024, 3): None,  # gate_up M=192: 6.56 us vs cuBLAS 6.56 us
    (6144, 1024, 4): None,  # gate_up M=256: 7.10 us vs cuBLAS 7.10 us
}
