"""Launch configs for `kernels.gemm.linear_mid`, written by `bench/gemm.py --sweep` on an H200.

Owns: TABLE, keyed (N, K, 64-row tiles of M) -> GemmConfig, or None where cuBLAS stayed ahead;
keys ending in "silu" are the gate/up GEMM with SiLU-and-mul fused (N = the gate/up rows), None
where cuBLAS and the SiLU kernel stayed ahead.
Plain data: `bench/gemm.py --sweep --write` rewrites a model's entries and keeps the rest, each
model's under its stamp line; shapes not listed stay on cuBLAS. Never put logic here.
"""

from .gemm_gluon import GemmConfig  # noqa: F401  (entries are GemmConfig(...) literals)

TABLE: dict = {
    # qwen3-0.6b: `python bench/gemm.py --sweep --write --model qwen3-0.6b --m 32 64 128 192 256`, NVIDIA H200, 2026-11-30, commit d94884d
    (4096, 1024, 1): GemmConfig(block_n=64, block_k=128, stages=6),  # qkv M=64: 3.98 us vs cuBLAS 5.13 us
    (4096, 1024, 2): GemmConfig(block_n=64, block_k=128, stages=5),  # qkv M=128: 4.50 us vs cuBLAS 5.06 us
    (4096, 1024, 3): GemmConfig(block_n=128, block_k=128, stages=4),  # qkv M=192: 5.29 us vs cuBLAS 5.55 us
    (4096, 1024, 4): GemmConfig(block_n=128, block_k=128, stages=4),  # qkv M=256: 5.71 us vs cuBLAS 5.96 us
    (6144, 1024, 1): GemmConfig(block_n=64, block_k=128, stages=6),  # gate_up M=64: 4.69 us vs cuBLAS 5.75 us
    (6144, 1024, 1, 'silu'): GemmConfig(block_n=64, block_k=128, stages=4),  # gate_up+silu M=64: 5.75 us vs cuBLAS + SiLU 6.94 us
    (6144, 1024, 2): None,  # gate_up M=128: 5.62 us vs cuBLAS 5.78 us
    (6144, 1024, 2, 'silu'): GemmConfig(block_n=64, block_k=128, stages=4),  # gate_up+silu M=128: 6.12 us vs cuBLAS + SiLU 7.24 us
    (6144, 1024, 3): None,  # gate_up M=192: 6.67 us vs cuBLAS 6.67 us
    (6144, 1024, 3, 'silu'): GemmConfig(block_n=64, block_k=64, stages=4),  # gate_up+silu M=192: 7.73 us vs cuBLAS + SiLU 8.24 us
    (6144, 1024, 4): None,  # gate_up M=256: 7.37 us vs cuBLAS 7.37 us
    (6144, 1024, 4, 'silu'): GemmConfig(block_n=64, block_k=64, stages=4),  # gate_up+silu M=256: 8.27 us vs cuBLAS + SiLU 8.92 us
    # qwen3-0.6b o / down with split-K, each timed with the add + norm after it: `python bench/gemm.py --sweep --write --model qwen3-0.6b --shapes o down --m 64 128 256` (ec284c8's tree before its commit) and `--m 192` (at ec284c8), NVIDIA H200, 2026-11-30
    (1024, 2048, 1): GemmConfig(block_n=64, block_k=128, stages=4, splits=4),  # o M=64: 6.05 us vs cuBLAS + add-norm 7.03 us
    (1024, 2048, 2): GemmConfig(block_n=64, block_k=128, stages=4, splits=4),  # o M=128: 6.55 us vs cuBLAS + add-norm 7.97 us
    (1024, 2048, 3): GemmConfig(block_n=64, block_k=128, stages=6, splits=2),  # o M=192: 6.86 us vs cuBLAS + add-norm 7.57 us
    (1024, 2048, 4): GemmConfig(block_n=64, block_k=128, stages=6, splits=2),  # o M=256: 7.17 us vs cuBLAS + add-norm 8.63 us
    (1024, 3072, 1): GemmConfig(block_n=64, block_k=128, stages=4, splits=4),  # down M=64: 7.02 us vs cuBLAS + add-norm 8.82 us
    (1024, 3072, 2): GemmConfig(block_n=64, block_k=128, stages=4, splits=4),  # down M=128: 7.26 us vs cuBLAS + add-norm 8.98 us
    (1024, 3072, 3): GemmConfig(block_n=64, block_k=128, stages=6, splits=2),  # down M=192: 7.76 us vs cuBLAS + add-norm 9.67 us
    (1024, 3072, 4): GemmConfig(block_n=64, block_k=128, stages=6, splits=2),  # down M=256: 7.97 us vs cuBLAS + add-norm 9.73 us
}
