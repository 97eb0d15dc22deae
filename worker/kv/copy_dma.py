"""Staging-buffer copies of the host KV tier: the DMA fallbacks of `HostKVPool`
(`copy_mode="runs"` and `"gather"`), kept to compare with the zero-copy kernel and for hosts
where the pool cannot be mapped for the device.

Owns: a device staging buffer laid out like the host pool (`[num_staging, num_layers, *block]`
per field, so staging row k mirrors host block h), and for "gather" a page-locked host staging
buffer. Lists longer than the staging buffer go in chunks. Both modes move a chunk in three
parts: device blocks <-> device staging (ONE `kv_swap` launch per chunk for "runs", per-layer
`index_select`/`index_copy_` for "gather"), staging <-> host pool by DMA, in stream order:
  * "runs": one async copy per run of consecutive host blocks per field, straight between the
    host pool and the device staging buffer: no CPU work on the data, no host synchronization;
  * "gather" (the tier's first implementation): one DMA per field per chunk, with the host
    blocks gathered (`index_select`, single-threaded memcpy) into / scattered out of the host
    staging buffer when they are not consecutive; swap-outs then block the host.
Which block goes where is decided by the caller (lists sorted by host block). Must never
choose blocks, and never reuse a staging buffer before the stream has finished with it.
"""

from __future__ import annotations

from typing import Optional

import numpy as np
import torch

from infer_cluster.kernels.kv_swap import SwapLayout, kv_swap

from infer_cluster.worker.device.host_memory import HostBuffer


def consecutive_runs(blocks: list[int]) -> list[tuple[int, int, int]]:
    """(position in `blocks`, first block, length) of each run of consecutive ids, in order."""
    runs = []
    start = 0
    for i in range(1, len(blocks) + 1):
        if i == len(blocks) or blocks[i] != blocks[i - 1] + 1:
            runs.append((start, blocks[start], i - start))
            start = i
    return runs


class StagedCopier:
    def __init__(self, layout: SwapLayout, num_staging: int, gather: bool, upload_ids=None):
        self.layout = layout
        self.gather = gather
        self.num_staging = num_staging
        dev = layout.device[0][0].device
        self.device = dev
        specs = [((num_staging,) + tuple(h.shape[1:]), h.dtype) for h in layout.host]
        size = sum(-(-_nbytes(s, d) // 4096) * 4096 for s, d in specs)
        raw = torch.empty(size, dtype=torch.uint8, device=dev)
        self.dev_stage, off = [], 0
        for shape, dtype in specs:  # one device allocation, like the host pool: one SwapLayout
            n = _nbytes(shape, dtype)
            self.dev_stage.append(raw[off:off + n].view(dtype).view(shape))
            off += -(-n // 4096) * 4096
        self._dev_raw = raw
        self.stage_layout = SwapLayout(layout.device, self.dev_stage)
        self.host_stage = (HostBuffer(specs, pin=dev.type == "cuda").tensors if gather else None)
        # How "runs" swap-outs send their device block ids (default `block_ids_on`, a DMA): the
        # pool gives a zero-copy upload (worker/device/upload.py), since on the swap-out stream a
        # DMA would queue behind the loads and the step waits for the swap-outs.
        self.upload_ids = upload_ids
        self._h2d_done: Optional[torch.cuda.Event] = None  # host staging free again

    def rebind(self, layout: SwapLayout) -> None:
        """The device pool was replaced (same field layout): point at its tensors."""
        self.layout = layout
        self.stage_layout = SwapLayout(layout.device, self.dev_stage)

    def compile_copies(self) -> None:
        """Run the staging kernel both ways on device block 0 and staging row 0 (block 0 ends as
        it was), so that it is compiled before the first real swap."""
        zero = block_ids_on(self.device, [0])
        kv_swap(self.stage_layout, zero, zero, to_host=True)
        kv_swap(self.stage_layout, zero, zero, to_host=False)

    def swap_out(self, device_blocks: list[int], host_blocks: list[int]) -> None:
        for i in range(0, len(device_blocks), self.num_staging):
            self._out(device_blocks[i:i + self.num_staging], host_blocks[i:i + self.num_staging])

    def swap_in(self, host_blocks: list[int], device_blocks: list[int]) -> None:
        for i in range(0, len(device_blocks), self.num_staging):
            self._in(host_blocks[i:i + self.num_staging], device_blocks[i:i + self.num_staging])

    # -- one chunk --------------------------------------------------------------------------------

    def _out(self, device_blocks: list[int], host_blocks: list[int]) -> None:
        n = len(device_blocks)
        if self.upload_ids is not None and not self.gather:
            dev_idx = self.upload_ids(np.asarray(device_blocks, dtype=np.int64))
        else:
            dev_idx = block_ids_on(self.device, device_blocks, torch.int32 if not self.gather else torch.int64)
        if not self.gather:
            kv_swap(self.stage_layout, torch.arange(n, dtype=torch.int32, device=self.device), dev_idx, to_host=True)
            for pos, first, length in consecutive_runs(host_blocks):
                for host, stage in zip(self.layout.host, self.dev_stage):
                    host[first:first + length].copy_(stage[pos:pos + length], non_blocking=True)
            return
        runs = consecutive_runs(host_blocks)
        for j, host in enumerate(self.layout.host):
            stage = self.dev_stage[j][:n]
            for layer, fields in enumerate(self.layout.device):
                stage[:, layer] = fields[j].index_select(0, dev_idx)
            if len(runs) == 1:
                host[host_blocks[0]:host_blocks[0] + n].copy_(stage)  # blocking
            else:
                host_stage = self.host_stage[j][:n]
                self._wait_h2d()
                host_stage.copy_(stage)  # blocking: the CPU scatters it next
                host.index_copy_(0, torch.tensor(host_blocks, dtype=torch.int64), host_stage)

    def _in(self, host_blocks: list[int], device_blocks: list[int]) -> None:
        n = len(device_blocks)
        dev_idx = block_ids_on(self.device, device_blocks, torch.int32 if not self.gather else torch.int64)
        if not self.gather:
            for pos, first, length in consecutive_runs(host_blocks):
                for host, stage in zip(self.layout.host, self.dev_stage):
                    stage[pos:pos + length].copy_(host[first:first + length], non_blocking=True)
            kv_swap(self.stage_layout, torch.arange(n, dtype=torch.int32, device=self.device), dev_idx, to_host=False)
            return
        consecutive = len(consecutive_runs(host_blocks)) == 1
        for j, host in enumerate(self.layout.host):
            if consecutive:
                src = host[host_blocks[0]:host_blocks[0] + n]
            else:
                src = self.host_stage[j][:n]
                self._wait_h2d()  # the staging buffer may still feed the previous copy
                torch.index_select(host, 0, torch.tensor(host_blocks, dtype=torch.int64), out=src)
            stage = self.dev_stage[j][:n]
            stage.copy_(src, non_blocking=True)
            if self.device.type == "cuda":
                self._h2d_done = torch.cuda.Event()
                self._h2d_done.record(torch.cuda.current_stream(self.device))
            for layer, fields in enumerate(self.layout.device):
                fields[j].index_copy_(0, dev_idx, stage[:, layer])

    def _wait_h2d(self) -> None:
        if self._h2d_done is not None:
            self._h2d_done.synchronize()
            self._h2d_done = None


def _nbytes(shape, dtype) -> int:
    n = torch.tensor([], dtype=dtype).element_size()
    for s in shape:
        n *= s
    return n


def block_ids_on(device: torch.device, blocks, dtype: torch.dtype = torch.int32) -> torch.Tensor:
    """Block ids as a tensor on `device`, through page-locked memory on CUDA so the copy is
    queued on the current stream without synchronizing the host (a pageable source would make
    the driver wait for the stream first). The pinned source block goes back to torch's pool
    only once that copy has run."""
    if device.type != "cuda":
        return torch.tensor(list(blocks), dtype=dtype)
    return torch.tensor(list(blocks), dtype=dtype, pin_memory=True).to(device, non_blocking=True)
