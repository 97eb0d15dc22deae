"""`MappedUpload`: a step's packed inputs to the device without a copy engine.

Why: with the host KV tier on, loads keep the host->device copy engine busy (a 4,000-token
prefix of the Qwen3-0.6B shape is ~460 MB, ~9 ms), and each step's own small input copy
(`DynamicContext.prepare`: one packed buffer per step) queued behind them. In a profiled
host-tier run on the H100 (2026-11-25, 128 requests, `bench/gpu_timeline.py` gap causes) the
compute stream sat idle 650 ms of a 1,680 ms window, 321 ms of it waiting for those copies. Reading the inputs with a kernel
from page-locked, device-mapped memory (`kernels/mapped_read_triton.py`) moves them on the SMs
in microseconds, whatever the copy engines are doing.

Owns: a ring of `slots` mapped host rows (`device/host_memory.HostBuffer`) of `capacity` int64
values each, the CUDA event of the read that last used each row, and `__call__(values)`, which
returns the values as a device int64 tensor. A row is written again only once its previous read
ran (`event.synchronize()`; normally long done, at most two steps are in flight). Longer inputs,
and hosts whose memory cannot be mapped, take the pinned DMA copy (`dma_upload`).
Used by every CUDA model runner for its step inputs (`INFER_CLUSTER_MAPPED_UPLOAD=0` turns that
off, for A/B runs), and by the host tier's "runs" swap-outs for their device block ids (the step
waits for the swap-outs). Without a tier it saves host time: `dma_upload` pins a fresh host
buffer through torch's caching host allocator every step (~0.5 ms per step of a workload-A run
on the H100, under cProfile), where a ring row is reused.
To extend (another dtype, another caller): one `MappedUpload` per caller and dtype, its
`capacity` from the most the caller sends at once (`step_capacity` for step inputs).
"""

from __future__ import annotations

import numpy as np
import torch

from infer_cluster.kernels.dispatch import env_switch
from infer_cluster.kernels.mapped_read_triton import mapped_read_triton

from infer_cluster.worker.device.host_memory import HostBuffer


# Step inputs of every CUDA runner go through a `MappedUpload` (see above); 0 keeps `dma_upload`
# unless a host tier is on. Read once at import.
MAPPED_UPLOAD = env_switch("INFER_CLUSTER_MAPPED_UPLOAD")


def padded_words(nbytes: int) -> int:
    """int64 words that `nbytes` take in a packed upload, padded to a multiple of 16 bytes: every
    part of a step's inputs starts 16 bytes aligned (Triton specializes kernels on pointer
    alignment; a view at an odd offset would compile a second variant mid-serving)."""
    return -(-nbytes // 16) * 2


def dma_upload(values: np.ndarray, device: torch.device) -> torch.Tensor:
    """The default path: pinned copy, non-blocking transfer on the current stream (dtype kept;
    off CUDA, the array itself as a tensor)."""
    host = torch.from_numpy(values)
    if torch.device(device).type != "cuda":
        return host
    return host.pin_memory().to(device, non_blocking=True)


def step_capacity(max_num_batched_tokens: int, max_num_seqs: int, max_blocks_per_seq: int) -> int:
    """int64 words `DynamicContext.prepare` packs at most: ids, positions and slots per token,
    the block table, five short per-sequence lists, and one padding value for each of its nine
    parts (each starts 16 bytes aligned). Its int32 parts (block table, seq_lens, query starts)
    take half a word per value plus at most 1.5 of padding, so this bound holds for them too."""
    return 3 * max_num_batched_tokens + max_num_seqs * max_blocks_per_seq + 5 * max_num_seqs + 1 + 9


class MappedUpload:
    def __init__(self, device: torch.device, capacity: int, slots: int = 8):
        self.device = device
        self.capacity = capacity
        # Rows 128 bytes apart: every row starts aligned alike, so the read kernel compiles once
        # (Triton specializes on 16-byte pointer alignment).
        self._buffer = HostBuffer([((slots, -(-capacity // 16) * 16), torch.int64)], pin=True)
        self.enabled = self._buffer.is_mapped
        self._rows = self._buffer.tensors[0]
        self._rows_np = self._rows.numpy()
        # One event per row: the read that last used it (an event never recorded is done).
        self._events = [torch.cuda.Event() for _ in range(slots)] if self.enabled else []
        self._next = 0
        if self.enabled:  # compile the read kernel now, not in the first step
            self(np.arange(17, dtype=np.int64))
            torch.cuda.synchronize(device)

    def __call__(self, values: np.ndarray) -> torch.Tensor:
        n = values.shape[0]
        if not self.enabled or n > self.capacity:
            return dma_upload(values, self.device)
        slot = self._next
        self._next = (slot + 1) % len(self._events)
        self._events[slot].synchronize()  # its previous read has run (normally long ago)
        self._rows_np[slot, :n] = values
        out = torch.empty(n, dtype=torch.int64, device=self.device)
        mapped_read_triton(self._rows[slot, :n], out)
        self._events[slot].record()
        return out
