"""Launch configs for `linear_small`, tuned on the H100 with `bench/gemv.py --sweep` (bf16).

Owns: TUNED, keyed (N, K, M bucket) -> GemvConfig, or None where cuBLAS was faster. Plain data:
paste the sweep's output here; shapes not listed fall back to `gemv.default_config`. Never put
logic here.
"""

from .gemv_config import GemvConfig  # noqa: F401  (entries are GemvConfig(...) literals)

# Sweep of 2026-11-24 (H100 80GB HBM3, torch 2.11 + CUDA 13, triton 3.6), commit cc1caca; the
# Qwen3-0.6B rows again on 2026-11-25 at 80cdcc4, with PDL (kernels/pdl.py): each timed GEMV follows
# another in the graph, as in a decode step, so the picks assume PDL (on by default on sm_90).
TUNED: dict = {
    (4096, 1024, 1): GemvConfig(block_n=4, block_k=512, num_warps=4, num_stages=1, split_k=1, use_dot=False),  # qwen3-0.6b qkv: 4.1 us vs cuBLAS 5.3 us
    (4096, 1024, 2): GemvConfig(block_n=4, block_k=512, num_warps=4, num_stages=1, split_k=1, use_dot=False),  # qwen3-0.6b qkv: 4.6 us vs cuBLAS 5.7 us
    (4096, 1024, 4): None,  # qwen3-0.6b qkv: 5.6 us vs cuBLAS 5.6 us
    (4096, 1024, 8): None,  # qwen3-0.6b qkv: 5.5 us vs cuBLAS 5.6 us
    (4096, 1024, 16): None,  # qwen3-0.6b qkv: 5.6 us vs cuBLAS 5.6 us
    (1024, 2048, 1): GemvConfig(block_n=4, block_k=2048, num_warps=8, num_stages=1, split_k=1, use_dot=False),  # qwen3-0.6b o: 2.5 us vs cuBLAS 5.8 us
    (1024, 2048, 2): GemvConfig(block_n=4, block_k=2048, num_warps=8, num_stages=1, split_k=2, use_dot=False),  # qwen3-0.6b o: 3.0 us vs cuBLAS 5.8 us
    (1024, 2048, 4): GemvConfig(block_n=4, block_k=1024, num_warps=8, num_stages=1, split_k=1, use_dot=False),  # qwen3-0.6b o: 4.1 us vs cuBLAS 5.8 us
    (1024, 2048, 8): GemvConfig(block_n=16, block_k=256, num_warps=4, num_stages=4, split_k=2, use_dot=True),  # qwen3-0.6b o: 5.4 us vs cuBLAS 5.8 us
    (1024, 2048, 16): GemvConfig(block_n=16, block_k=128, num_warps=4, num_stages=4, split_k=2, use_dot=True),  # qwen3-0.6b o: 5.4 us vs cuBLAS 5.8 us
    (6144, 1024, 1): GemvConfig(block_n=4, block_k=512, num_warps=4, num_stages=3, split_k=1, use_dot=False),  # qwen3-0.6b gate_up: 4.8 us vs cuBLAS 7.1 us
    (6144, 1024, 2): GemvConfig(block_n=4, block_k=1024, num_warps=4, num_stages=1, split_k=1, use_dot=False),  # qwen3-0.6b gate_up: 6.9 us vs cuBLAS 7.1 us
    (6144, 1024, 4): None,  # qwen3-0.6b gate_up: 6.9 us vs cuBLAS 7.0 us
    (6144, 1024, 8): GemvConfig(block_n=64, block_k=256, num_warps=4, num_stages=4, split_k=1, use_dot=True),  # qwen3-0.6b gate_up: 6.7 us vs cuBLAS 7.0 us
    (6144, 1024, 16): GemvConfig(block_n=64, block_k=256, num_warps=4, num_stages=4, split_k=1, use_dot=True),  # qwen3-0.6b gate_up: 6.6 us vs cuBLAS 7.1 us
    (1024, 3072, 1): GemvConfig(block_n=4, block_k=2048, num_warps=8, num_stages=1, split_k=1, use_dot=False),  # qwen3-0.6b down: 4.0 us vs silu+cuBLAS 7.9 us
    (1024, 3072, 2): GemvConfig(block_n=4, block_k=2048, num_warps=8, num_stages=1, split_k=1, use_dot=False),  # qwen3-0.6b down: 4.8 us vs silu+cuBLAS 8.0 us
    (1024, 3072, 4): GemvConfig(block_n=4, block_k=1024, num_warps=8, num_stages=1, split_k=1, use_dot=False),  # qwen3-0.6b down: 5.8 us vs silu+cuBLAS 7.9 us
    (1024, 3072, 8): None,  # qwen3-0.6b down: 11.7 us vs silu+cuBLAS 8.0 us
    (1024, 3072, 16): None,  # qwen3-0.6b down: 11.8 us vs silu+cuBLAS 8.1 us
    (151936, 1024, 1): GemvConfig(block_n=16, block_k=512, num_warps=4, num_stages=3, split_k=1, use_dot=False),  # qwen3-0.6b lm_head: 99.6 us vs cuBLAS 111.1 us
    (151936, 1024, 2): GemvConfig(block_n=64, block_k=256, num_warps=4, num_stages=3, split_k=1, use_dot=True),  # qwen3-0.6b lm_head: 104.8 us vs cuBLAS 111.4 us
    (151936, 1024, 4): GemvConfig(block_n=64, block_k=256, num_warps=4, num_stages=3, split_k=1, use_dot=True),  # qwen3-0.6b lm_head: 105.6 us vs cuBLAS 113.1 us
    (151936, 1024, 8): GemvConfig(block_n=64, block_k=256, num_warps=4, num_stages=3, split_k=1, use_dot=True),  # qwen3-0.6b lm_head: 106.4 us vs cuBLAS 113.7 us
    (151936, 1024, 16): GemvConfig(block_n=32, block_k=128, num_warps=4, num_stages=2, split_k=1, use_dot=True),  # qwen3-0.6b lm_head: 107.2 us vs cuBLAS 115.5 us
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
}