"""Launch configs for `linear_small`, tuned on the H100 with `bench/gemv.py --sweep` (bf16).

Owns: TUNED, keyed (N, K, M bucket) -> GemvConfig, or None where cuBLAS was faster. Plain data:
paste the sweep's output here; shapes not listed fall back to `gemv.default_config`. Never put
logic here.
"""

from .gemv_config import GemvConfig  # noqa: F401  (entries are GemvConfig(...) literals)

# Sweep of 2026-11-24 (H100 80GB HBM3, torch 2.11 + CUDA 13, triton 3.6), commit cc1caca.
# Two Qwen3-0.6B rows at one row (M = 1) were picked on 2026-11-25 by batch-1 TPOT in the whole
# step, not by the sweep, once PDL (kernels/pdl.py) let each GEMV load its first W tile while the
# kernel before it drains: a tile spanning all (qkv) or most (down) of K preloads the most. TPOT
# p50 0.99 -> 0.93 ms (alternating runs in one H100 call at 1dc0720). A sweep repeated with PDL
# (each GEMV timed after itself) picked other tiles for every row, and those were slower in the
# step (1.016 vs 0.982 ms), so the other rows stay as swept at cc1caca.
TUNED: dict = {
    (4096, 1024, 1): GemvConfig(block_n=4, block_k=1024, num_warps=4, num_stages=1, split_k=1, use_dot=False),  # qwen3-0.6b qkv: picked in the step, see above (was cuBLAS: 5.4 us)
    (4096, 1024, 2): None,  # qwen3-0.6b qkv: 6.0 us vs cuBLAS 5.7 us (1412 GB/s)
    (4096, 1024, 4): None,  # qwen3-0.6b qkv: 6.0 us vs cuBLAS 5.7 us (1401 GB/s)
    (4096, 1024, 8): None,  # qwen3-0.6b qkv: 5.6 us vs cuBLAS 5.7 us (1516 GB/s)
    (4096, 1024, 16): None,  # qwen3-0.6b qkv: 5.6 us vs cuBLAS 5.6 us (1528 GB/s)
    (1024, 2048, 1): GemvConfig(block_n=4, block_k=2048, num_warps=4, num_stages=1, split_k=2, use_dot=False),  # qwen3-0.6b o: 3.9 us vs cuBLAS 5.8 us (1074 GB/s)
    (1024, 2048, 2): GemvConfig(block_n=4, block_k=512, num_warps=4, num_stages=3, split_k=1, use_dot=False),  # qwen3-0.6b o: 4.2 us vs cuBLAS 5.8 us (1013 GB/s)
    (1024, 2048, 4): GemvConfig(block_n=4, block_k=512, num_warps=4, num_stages=3, split_k=1, use_dot=False),  # qwen3-0.6b o: 4.6 us vs cuBLAS 5.8 us (922 GB/s)
    (1024, 2048, 8): None,  # qwen3-0.6b o: 6.1 us vs cuBLAS 5.8 us (695 GB/s)
    (1024, 2048, 16): None,  # qwen3-0.6b o: 6.1 us vs cuBLAS 5.8 us (703 GB/s)
    (6144, 1024, 1): GemvConfig(block_n=4, block_k=1024, num_warps=4, num_stages=1, split_k=1, use_dot=False),  # qwen3-0.6b gate_up: 6.5 us vs cuBLAS 7.2 us (1943 GB/s)
    (6144, 1024, 2): None,  # qwen3-0.6b gate_up: 7.4 us vs cuBLAS 7.1 us (1715 GB/s)
    (6144, 1024, 4): None,  # qwen3-0.6b gate_up: 7.3 us vs cuBLAS 7.1 us (1723 GB/s)
    (6144, 1024, 8): GemvConfig(block_n=64, block_k=128, num_warps=4, num_stages=4, split_k=1, use_dot=True),  # qwen3-0.6b gate_up: 7.0 us vs cuBLAS 7.1 us (1822 GB/s)
    (6144, 1024, 16): GemvConfig(block_n=32, block_k=128, num_warps=4, num_stages=4, split_k=1, use_dot=True),  # qwen3-0.6b gate_up: 6.9 us vs cuBLAS 7.2 us (1848 GB/s)
    (1024, 3072, 1): GemvConfig(block_n=4, block_k=2048, num_warps=8, num_stages=1, split_k=1, use_dot=False),  # qwen3-0.6b down: picked in the step, see above (was 4x1024 w8 s3: 5.0 us)
    (1024, 3072, 2): GemvConfig(block_n=4, block_k=1024, num_warps=4, num_stages=3, split_k=1, use_dot=False),  # qwen3-0.6b down: 5.4 us vs silu+cuBLAS 8.1 us (1176 GB/s)
    (1024, 3072, 4): GemvConfig(block_n=8, block_k=512, num_warps=8, num_stages=3, split_k=1, use_dot=False),  # qwen3-0.6b down: 6.9 us vs silu+cuBLAS 8.0 us (920 GB/s)
    (1024, 3072, 8): None,  # qwen3-0.6b down: 12.7 us vs silu+cuBLAS 8.0 us (504 GB/s)
    (1024, 3072, 16): None,  # qwen3-0.6b down: 12.2 us vs silu+cuBLAS 8.2 us (534 GB/s)
    (151936, 1024, 1): GemvConfig(block_n=4, block_k=1024, num_warps=4, num_stages=1, split_k=1, use_dot=False),  # qwen3-0.6b lm_head: 101.1 us vs cuBLAS 112.2 us (3082 GB/s)
    (151936, 1024, 2): GemvConfig(block_n=16, block_k=256, num_warps=4, num_stages=3, split_k=1, use_dot=False),  # qwen3-0.6b lm_head: 104.8 us vs cuBLAS 111.8 us (2974 GB/s)
    (151936, 1024, 4): GemvConfig(block_n=64, block_k=256, num_warps=4, num_stages=3, split_k=1, use_dot=True),  # qwen3-0.6b lm_head: 107.3 us vs cuBLAS 113.7 us (2912 GB/s)
    (151936, 1024, 8): GemvConfig(block_n=64, block_k=256, num_warps=4, num_stages=4, split_k=1, use_dot=True),  # qwen3-0.6b lm_head: 108.1 us vs cuBLAS 114.8 us (2900 GB/s)
    (151936, 1024, 16): GemvConfig(block_n=64, block_k=256, num_warps=4, num_stages=2, split_k=1, use_dot=True),  # qwen3-0.6b lm_head: 109.0 us vs cuBLAS 117.3 us (2899 GB/s)
    (6144, 4096, 1): GemvConfig(block_n=4, block_k=1024, num_warps=4, num_stages=1, split_k=1, use_dot=False),  # llama-3-8b qkv: 18.9 us vs cuBLAS 20.8 us (2667 GB/s)
    (6144, 4096, 2): GemvConfig(block_n=4, block_k=1024, num_warps=4, num_stages=3, split_k=1, use_dot=False),  # llama-3-8b qkv: 19.4 us vs cuBLAS 20.9 us (2592 GB/s)
    (6144, 4096, 4): None,  # llama-3-8b qkv: 21.5 us vs cuBLAS 20.8 us (2347 GB/s)
    (6144, 4096, 8): None,  # llama-3-8b qkv: 20.7 us vs cuBLAS 20.9 us (2436 GB/s)
    (6144, 4096, 16): GemvConfig(block_n=32, block_k=256, num_warps=4, num_stages=3, split_k=1, use_dot=True),  # llama-3-8b qkv: 20.5 us vs cuBLAS 21.2 us (2473 GB/s)
    (4096, 4096, 1): GemvConfig(block_n=4, block_k=2048, num_warps=4, num_stages=1, split_k=1, use_dot=False),  # llama-3-8b o: 13.2 us vs cuBLAS 15.6 us (2536 GB/s)
    (4096, 4096, 2): GemvConfig(block_n=4, block_k=1024, num_warps=4, num_stages=3, split_k=1, use_dot=False),  # llama-3-8b o: 14.0 us vs cuBLAS 15.5 us (2397 GB/s)
    (4096, 4096, 4): None,  # llama-3-8b o: 15.2 us vs cuBLAS 15.5 us (2210 GB/s)
    (4096, 4096, 8): GemvConfig(block_n=64, block_k=256, num_warps=4, num_stages=4, split_k=1, use_dot=True),  # llama-3-8b o: 14.8 us vs cuBLAS 15.5 us (2271 GB/s)
    (4096, 4096, 16): GemvConfig(block_n=32, block_k=256, num_warps=4, num_stages=4, split_k=1, use_dot=True),  # llama-3-8b o: 14.3 us vs cuBLAS 15.7 us (2371 GB/s)
    (28672, 4096, 1): GemvConfig(block_n=4, block_k=2048, num_warps=4, num_stages=1, split_k=1, use_dot=False),  # llama-3-8b gate_up: 76.6 us vs cuBLAS 81.8 us (3066 GB/s)
    (28672, 4096, 2): GemvConfig(block_n=4, block_k=1024, num_warps=4, num_stages=3, split_k=1, use_dot=False),  # llama-3-8b gate_up: 77.7 us vs cuBLAS 82.0 us (3024 GB/s)
    (28672, 4096, 4): None,  # llama-3-8b gate_up: 82.6 us vs cuBLAS 82.4 us (2846 GB/s)
    (28672, 4096, 8): None,  # llama-3-8b gate_up: 82.7 us vs cuBLAS 82.7 us (2846 GB/s)
    (28672, 4096, 16): None,  # llama-3-8b gate_up: 82.4 us vs cuBLAS 83.3 us (2862 GB/s)
    (4096, 14336, 1): GemvConfig(block_n=8, block_k=1024, num_warps=4, num_stages=1, split_k=1, use_dot=False),  # llama-3-8b down: 41.3 us vs silu+cuBLAS 45.9 us (2844 GB/s)
    (4096, 14336, 2): GemvConfig(block_n=8, block_k=512, num_warps=4, num_stages=3, split_k=1, use_dot=False),  # llama-3-8b down: 42.3 us vs silu+cuBLAS 45.4 us (2780 GB/s)
    (4096, 14336, 4): None,  # llama-3-8b down: 47.5 us vs silu+cuBLAS 45.3 us (2477 GB/s)
    (4096, 14336, 8): None,  # llama-3-8b down: 58.8 us vs silu+cuBLAS 45.7 us (2007 GB/s)
    (4096, 14336, 16): None,  # llama-3-8b down: 57.8 us vs silu+cuBLAS 46.9 us (2049 GB/s)
    (128256, 4096, 1): GemvConfig(block_n=4, block_k=2048, num_warps=4, num_stages=1, split_k=1, use_dot=False),  # llama-3-8b lm_head: 330.8 us vs cuBLAS 375.5 us (3177 GB/s)
    (128256, 4096, 2): GemvConfig(block_n=4, block_k=1024, num_warps=4, num_stages=3, split_k=1, use_dot=False),  # llama-3-8b lm_head: 333.8 us vs cuBLAS 371.8 us (3149 GB/s)
    (128256, 4096, 4): GemvConfig(block_n=64, block_k=256, num_warps=4, num_stages=4, split_k=1, use_dot=True),  # llama-3-8b lm_head: 344.8 us vs cuBLAS 373.6 us (3051 GB/s)
    (128256, 4096, 8): GemvConfig(block_n=64, block_k=256, num_warps=4, num_stages=4, split_k=1, use_dot=True),  # llama-3-8b lm_head: 349.3 us vs cuBLAS 374.8 us (3014 GB/s)
    (128256, 4096, 16): GemvConfig(block_n=64, block_k=256, num_warps=4, num_stages=4, split_k=1, use_dot=True),  # llama-3-8b lm_head: 349.6 us vs cuBLAS 378.0 us (3017 GB/s)
    # One rank's shard of Llama-3-8B at T=2 (`bench/gemv.py --sweep --models llama-3-8b-tp2`), swept on
    # 2026-11-26 on an H100 of a 2x H100 machine (torch 2.11 + CUDA 13, triton 3.6), kernels as at 5786f49.
    # Before these, the shard shapes took the heuristic, and 16-row decode steps at T=2 ran 1.6x slower
    # than with cuBLAS (3.7x with the fused norm prologue; bench/gpu_suite.sh t2gemv).
    (3072, 4096, 1): GemvConfig(block_n=8, block_k=1024, num_warps=8, num_stages=1, split_k=1, use_dot=False),  # llama-3-8b-tp2 qkv: 9.5 us vs cuBLAS 13.7 us (2646 GB/s)
    (3072, 4096, 2): GemvConfig(block_n=4, block_k=512, num_warps=8, num_stages=3, split_k=1, use_dot=False),  # llama-3-8b-tp2 qkv: 11.1 us vs cuBLAS 13.8 us (2264 GB/s)
    (3072, 4096, 4): GemvConfig(block_n=64, block_k=128, num_warps=4, num_stages=4, split_k=2, use_dot=True),  # llama-3-8b-tp2 qkv: 12.0 us vs cuBLAS 13.6 us (2090 GB/s)
    (3072, 4096, 8): GemvConfig(block_n=64, block_k=128, num_warps=4, num_stages=4, split_k=2, use_dot=True),  # llama-3-8b-tp2 qkv: 11.9 us vs cuBLAS 13.8 us (2107 GB/s)
    (3072, 4096, 16): GemvConfig(block_n=64, block_k=128, num_warps=4, num_stages=4, split_k=2, use_dot=True),  # llama-3-8b-tp2 qkv: 12.0 us vs cuBLAS 13.7 us (2102 GB/s)
    (4096, 2048, 1): GemvConfig(block_n=8, block_k=1024, num_warps=8, num_stages=3, split_k=1, use_dot=False),  # llama-3-8b-tp2 o: 6.3 us vs cuBLAS 8.5 us (2655 GB/s)
    (4096, 2048, 2): GemvConfig(block_n=8, block_k=512, num_warps=4, num_stages=1, split_k=1, use_dot=False),  # llama-3-8b-tp2 o: 7.2 us vs cuBLAS 8.5 us (2322 GB/s)
    (4096, 2048, 4): None,  # llama-3-8b-tp2 o: 8.3 us vs cuBLAS 8.4 us (2012 GB/s)
    (4096, 2048, 8): None,  # llama-3-8b-tp2 o: 8.3 us vs cuBLAS 8.3 us (2020 GB/s)
    (4096, 2048, 16): GemvConfig(block_n=64, block_k=256, num_warps=4, num_stages=4, split_k=1, use_dot=True),  # llama-3-8b-tp2 o: 8.3 us vs cuBLAS 8.5 us (2029 GB/s)
    (14336, 4096, 1): GemvConfig(block_n=4, block_k=2048, num_warps=8, num_stages=3, split_k=1, use_dot=False),  # llama-3-8b-tp2 gate_up: 38.5 us vs cuBLAS 42.0 us (3053 GB/s)
    (14336, 4096, 2): None,  # llama-3-8b-tp2 gate_up: 41.4 us vs cuBLAS 42.0 us (2836 GB/s)
    (14336, 4096, 4): None,  # llama-3-8b-tp2 gate_up: 43.2 us vs cuBLAS 42.0 us (2721 GB/s)
    (14336, 4096, 8): None,  # llama-3-8b-tp2 gate_up: 42.9 us vs cuBLAS 42.0 us (2741 GB/s)
    (14336, 4096, 16): None,  # llama-3-8b-tp2 gate_up: 42.9 us vs cuBLAS 42.5 us (2735 GB/s)
    (4096, 7168, 1): GemvConfig(block_n=8, block_k=1024, num_warps=4, num_stages=1, split_k=1, use_dot=False),  # llama-3-8b-tp2 down: 21.0 us vs silu+cuBLAS 25.5 us (2797 GB/s)
    (4096, 7168, 2): GemvConfig(block_n=8, block_k=512, num_warps=4, num_stages=3, split_k=1, use_dot=False),  # llama-3-8b-tp2 down: 22.0 us vs silu+cuBLAS 25.6 us (2670 GB/s)
    (4096, 7168, 4): None,  # llama-3-8b-tp2 down: 25.5 us vs silu+cuBLAS 25.6 us (2305 GB/s)
    (4096, 7168, 8): None,  # llama-3-8b-tp2 down: 33.6 us vs silu+cuBLAS 25.9 us (1748 GB/s)
    (4096, 7168, 16): None,  # llama-3-8b-tp2 down: 33.7 us vs silu+cuBLAS 26.4 us (1740 GB/s)
    (64128, 4096, 1): GemvConfig(block_n=4, block_k=2048, num_warps=4, num_stages=1, split_k=1, use_dot=False),  # llama-3-8b-tp2 lm_head: 166.6 us vs cuBLAS 190.6 us (3154 GB/s)
    (64128, 4096, 2): GemvConfig(block_n=4, block_k=1024, num_warps=4, num_stages=3, split_k=1, use_dot=False),  # llama-3-8b-tp2 lm_head: 171.1 us vs cuBLAS 193.1 us (3071 GB/s)
    (64128, 4096, 4): GemvConfig(block_n=64, block_k=256, num_warps=4, num_stages=4, split_k=1, use_dot=True),  # llama-3-8b-tp2 lm_head: 175.8 us vs cuBLAS 190.7 us (2989 GB/s)
    (64128, 4096, 8): GemvConfig(block_n=64, block_k=256, num_warps=4, num_stages=4, split_k=1, use_dot=True),  # llama-3-8b-tp2 lm_head: 176.2 us vs cuBLAS 192.0 us (2982 GB/s)
    (64128, 4096, 16): GemvConfig(block_n=64, block_k=256, num_warps=4, num_stages=4, split_k=1, use_dot=True),  # llama-3-8b-tp2 lm_head: 178.0 us vs cuBLAS 192.1 us (2951 GB/s)
}
