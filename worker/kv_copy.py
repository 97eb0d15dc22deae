"""`HostKVPool`: the tensors of the host-memory KV tier and the batched copies between it and
the device pool.

Owns: one host tensor per `LayerKV` field (K, V and, for an int8 cache, their scales), shaped
`[num_host_blocks, num_layers, *per-block shape]`: a block's data for every layer is one
contiguous run, so a run of consecutive host blocks is one contiguous region. Pinned on CUDA
(plain CPU tensors on CPU), plus a device and a host staging buffer of `staging_blocks` blocks.
`swap(swap_out, swap_in)` performs a step's copies in that order (swap-outs on the compute
stream, blocking; swap-ins on CUDA on a side copy stream, so they overlap the step's forward,
which never reads the blocks they fill: the scheduler lets those requests compute from the next
step on; `wait_loads()` makes the compute stream wait for them before the next forward or copy):
  * out: per layer a gather of the listed device blocks into the device staging buffer, then ONE
    device-to-host copy per field (straight into the pool when the host blocks are consecutive,
    else into the pinned staging buffer and scattered there with one `index_copy_`);
  * in: the reverse (one host gather when not consecutive, ONE host-to-device copy per field,
    then per layer one `index_copy_` into the device blocks).
Lists longer than the staging buffer go in chunks of `staging_blocks`.
Which block goes where is decided elsewhere (`HostTier`, `Scheduler`); this module never
chooses blocks. Must never be used with tensor/pipeline parallel ranks (config refuses it).
"""

from __future__ import annotations

import weakref
from typing import Optional, Sequence

import torch

from .models.decoder import LayerKV

STAGING_BYTES = 256 << 20  # device + pinned host staging, each (capped by the pool size)


def host_pool_blocks(kv_offload_gib: float, bytes_per_block: int) -> int:
    return int(kv_offload_gib * 2**30) // bytes_per_block


def staging_blocks(num_host_blocks: int, bytes_per_block: int) -> int:
    return max(1, min(num_host_blocks, STAGING_BYTES // bytes_per_block))


class HostKVPool:
    def __init__(self, kv_caches: Sequence[LayerKV], num_blocks: int, num_staging_blocks: int):
        first = kv_caches[0]
        self.kv_caches = kv_caches
        self.device = first.k.device
        self.fields = [i for i, t in enumerate(first) if t is not None]
        pin = self.device.type == "cuda"
        self.num_blocks = num_blocks
        self.num_staging = num_staging_blocks
        self.host, self.host_stage, self.dev_stage = [], [], []
        for f in self.fields:
            shape = (len(kv_caches),) + tuple(first[f].shape[1:])
            dtype = first[f].dtype
            self.host.append(_host_empty((num_blocks,) + shape, dtype, pin))
            self.host_stage.append(torch.empty((num_staging_blocks,) + shape, dtype=dtype, pin_memory=pin))
            self.dev_stage.append(torch.empty((num_staging_blocks,) + shape, dtype=dtype, device=self.device))
        self._h2d_done: Optional[torch.cuda.Event] = None  # host staging buffer free again
        self._loaded: Optional[torch.cuda.Event] = None    # the last swap-ins landed
        self.copy_stream = torch.cuda.Stream(self.device) if pin else None

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.host)

    def swap(self, swap_out: Sequence[tuple[int, int]], swap_in: Sequence[tuple[int, int]]) -> None:
        """Run a step's copies: every (device, host) swap-out, then every (host, device) swap-in."""
        self.wait_loads()  # the previous step's swap-ins share the staging buffer
        out = sorted(swap_out, key=lambda p: p[1])  # by host block: consecutive runs copy direct
        for i in range(0, len(out), self.num_staging):
            chunk = out[i:i + self.num_staging]
            self._out([d for d, _ in chunk], [h for _, h in chunk])
        if not swap_in:
            return
        into = sorted(swap_in, key=lambda p: p[0])
        if self.copy_stream is None:
            self._in_chunks(into)
            return
        self.copy_stream.wait_stream(torch.cuda.current_stream(self.device))  # after the swap-outs
        with torch.cuda.stream(self.copy_stream):
            self._in_chunks(into)
            self._loaded = torch.cuda.Event()
            self._loaded.record(self.copy_stream)

    def wait_loads(self) -> None:
        """Make the compute stream wait for the swap-ins issued so far (before a forward)."""
        if self._loaded is not None:
            torch.cuda.current_stream(self.device).wait_event(self._loaded)
            self._loaded = None

    def _in_chunks(self, into: list[tuple[int, int]]) -> None:
        for i in range(0, len(into), self.num_staging):
            chunk = into[i:i + self.num_staging]
            self._in([h for h, _ in chunk], [d for _, d in chunk])

    def _out(self, device_blocks: list[int], host_blocks: list[int]) -> None:
        n = len(device_blocks)
        dev_idx = torch.tensor(device_blocks, dtype=torch.int64).to(self.device, non_blocking=True)
        first = _first_if_consecutive(host_blocks)
        for j, f in enumerate(self.fields):
            stage = self.dev_stage[j][:n]
            for layer, kv in enumerate(self.kv_caches):
                stage[:, layer] = kv[f].index_select(0, dev_idx)
            if first is not None:
                self.host[j][first:first + n].copy_(stage)  # blocking: done before the CPU goes on
            else:
                host_stage = self.host_stage[j][:n]
                self._wait_h2d()
                host_stage.copy_(stage)
                self.host[j].index_copy_(0, torch.tensor(host_blocks, dtype=torch.int64), host_stage)

    def _in(self, host_blocks: list[int], device_blocks: list[int]) -> None:
        n = len(device_blocks)
        dev_idx = torch.tensor(device_blocks, dtype=torch.int64).to(self.device, non_blocking=True)
        first = _first_if_consecutive(host_blocks)
        for j, f in enumerate(self.fields):
            if first is not None:
                src = self.host[j][first:first + n]
            else:
                src = self.host_stage[j][:n]
                self._wait_h2d()  # the staging buffer may still feed the previous copy
                torch.index_select(self.host[j], 0, torch.tensor(host_blocks, dtype=torch.int64), out=src)
            stage = self.dev_stage[j][:n]
            stage.copy_(src, non_blocking=True)
            if self.device.type == "cuda":
                self._h2d_done = torch.cuda.Event()
                self._h2d_done.record(torch.cuda.current_stream(self.device))
            for layer, kv in enumerate(self.kv_caches):
                kv[f].index_copy_(0, dev_idx, stage[:, layer])

    def _wait_h2d(self) -> None:
        if self._h2d_done is not None:
            self._h2d_done.synchronize()
            self._h2d_done = None


def _host_empty(shape: tuple, dtype: torch.dtype, pin: bool) -> torch.Tensor:
    """A host tensor, page-locked on CUDA. Registered with `cudaHostRegister` rather than taken
    from torch's pinned allocator, which rounds every block up to a power of two (a 9 GiB pool
    would pin 16 GiB); unregistered when the tensor dies."""
    t = torch.empty(shape, dtype=dtype)
    if not pin:
        return t
    ptr, size = t.data_ptr(), t.numel() * t.element_size()
    err = int(torch.cuda.cudart().cudaHostRegister(ptr, size, 1))  # 1: cudaHostRegisterPortable
    if err != 0:
        raise RuntimeError(f"could not page-lock {size / 2**30:.2f} GiB of host memory for the KV tier "
                           f"(cudaError {err}); lower kv_offload_gib")
    weakref.finalize(t, _host_unregister, ptr)
    return t


def _host_unregister(ptr: int) -> None:
    torch.cuda.cudart().cudaHostUnregister(ptr)


def _first_if_consecutive(blocks: list[int]) -> Optional[int]:
    """The first block if `blocks` (sorted) are consecutive, else None."""
    return blocks[0] if blocks[-1] - blocks[0] == len(blocks) - 1 else None


def build_host_pool(kv_caches: Sequence[LayerKV], kv_offload_gib: float, bytes_per_block: int) -> HostKVPool:
    """The host tier for `kv_offload_gib` GiB of blocks of `bytes_per_block` bytes."""
    from infer_cluster.protocol.errors import ConfigError
    num_blocks = host_pool_blocks(kv_offload_gib, bytes_per_block)
    if num_blocks <= 0:
        raise ConfigError(f"kv_offload_gib={kv_offload_gib} holds no KV block of {bytes_per_block} bytes; "
                          f"raise it or set 0 to turn the host tier off")
    return HostKVPool(kv_caches, num_blocks, staging_blocks(num_blocks, bytes_per_block))


def staging_device_bytes(kv_offload_gib: float, bytes_per_block: int) -> int:
    """Device memory the tier's staging buffer takes (0 when the tier is off)."""
    num_blocks = host_pool_blocks(kv_offload_gib, bytes_per_block)
    return staging_blocks(num_blocks, bytes_per_block) * bytes_per_block if num_blocks > 0 else 0
