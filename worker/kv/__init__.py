"""The paged KV cache as tensors: block tables on the device, the pinned host-memory tier, KV
copies between device and host (copy engine or DMA kernels), and resizing the cache.

The bookkeeping of which block holds what is plain Python and lives in sched/; this package moves
the bytes.
"""
