"""`HostKVPool`: the tensors of the host-memory KV tier and the batched copies between it and
the device pool.

Owns: one host tensor per `LayerKV` field (K, V and, for an int8 cache, their scales), shaped
`[num_host_blocks, num_layers, *per-block shape]` (a block's data for every layer is one
contiguous run), all views of one `HostBuffer` (worker/device/host_memory.py): page-locked AND mapped
into the device's address space on CUDA, plain CPU memory on CPU.
`swap(swap_out, swap_in, loads)` performs a step's copies, swap-outs first. How (`copy_mode`):
  * "kernel": ONE `kv_swap` launch per direction (kernels/kv_swap_triton.py on CUDA:
    the SMs read/write the mapped host pool directly; torch index ops on CPU). No staging
    buffer, no CPU gather, no host synchronization;
  * "runs" (default) / "gather": DMA through a device staging buffer (worker/kv/copy_dma.py).
    "runs" is the default: on the H100 (2026-11-24, bench/gpu_suite.sh kvswap) the host-tier
    workload ran 1.59x with it vs 1.18x with "kernel" — the copy engines leave the SMs to the
    forward, while the kernel (48.7 GB/s alone vs 44.0 for runs) holds SMs for the whole copy.
    "gather" (the old CPU gather) is kept to compare with (bench/kv_swap.py).
Ordering (CUDA), which is what makes the copies correct without blocking the host:
  * swap-outs run on their own stream (`out_stream`), which waits for nothing: the device
    blocks they read are evicted prefix-cache blocks (their KV was written by steps the host
    already collected, so no queued work writes them) or a preemption victim's (preemption
    happens only when no step is in flight). The compute stream then waits for the swap-outs
    before the step's forward, which may write the blocks they read;
  * swap-ins run on a side copy stream that first waits for the swap-out stream (so they read
    host blocks only after the swap-outs that wrote them, and write device blocks only after
    the swap-outs that read them), one *load* at a time (`loads`: one per admitted request),
    each with its completion event. They do not wait for the compute stream: a load's device
    blocks are newly allocated (free, or evicted from the prefix cache), and no queued step
    reads or writes those (the scheduler frees the blocks of a request only once every step
    that computes it was collected). So a load starts at once, while the step in flight runs;
  * nothing on the compute stream waits for a load: the scheduler asks `landed(ids)` (event
    queries, never blocking) and lets no forward read or write a load's blocks before it
    landed, so loads overlap the forwards of other requests, across as many steps as they take.
    `wait_load(id)` blocks the host on one (the scheduler has nothing else to run);
    `wait_loads()` makes the compute stream wait for all copies (a resize moves the blocks).
  * swap-outs and swap-ins have their own staging buffers (DMA modes), so a swap-out never
    waits for a load in flight; the scheduler keeps a load's host blocks pinned until it landed.
Which block goes where is decided elsewhere (`HostTier`, `Scheduler`); this module never
chooses blocks. Must never be used with tensor/pipeline parallel ranks (config refuses it).
To extend (e.g. a disk tier): add a copier beside `StagedCopier` and a `copy_mode` for it.
"""

from __future__ import annotations

import logging
from typing import Optional, Sequence

import torch

from infer_cluster.kernels.kv_swap import SwapLayout, kv_swap

from infer_cluster.worker.device.host_memory import HostBuffer
from infer_cluster.worker.kv.copy_dma import StagedCopier, block_ids_on
from infer_cluster.worker.device.upload import MappedUpload
from infer_cluster.worker.models.decoder import LayerKV

log = logging.getLogger(__name__)

STAGING_BYTES = 128 << 20  # device (+ "gather": host) staging of the DMA modes, per direction
COPY_MODES = ("kernel", "runs", "gather")
DEFAULT_COPY_MODE = "runs"  # why: the module docstring


def host_pool_blocks(kv_offload_gib: float, bytes_per_block: int) -> int:
    return int(kv_offload_gib * 2**30) // bytes_per_block


def staging_blocks(num_host_blocks: int, bytes_per_block: int) -> int:
    return max(1, min(num_host_blocks, STAGING_BYTES // bytes_per_block))


class HostKVPool:
    def __init__(self, kv_caches: Sequence[LayerKV], num_blocks: int, num_staging_blocks: int,
                 copy_mode: str = DEFAULT_COPY_MODE):
        first = kv_caches[0]
        self.device = first.k.device
        self.fields = [i for i, t in enumerate(first) if t is not None]
        pin = self.device.type == "cuda"
        self.num_blocks = num_blocks
        self.num_staging = num_staging_blocks
        shapes = [((num_blocks, len(kv_caches)) + tuple(first[f].shape[1:]), first[f].dtype) for f in self.fields]
        self._buffer = HostBuffer(shapes, pin)
        self.host = self._buffer.tensors
        self._kv_caches = kv_caches
        self.layout = self._layout(kv_caches)
        self.copy_stream = torch.cuda.Stream(self.device) if pin else None  # swap-ins (loads)
        self.out_stream = torch.cuda.Stream(self.device) if pin else None  # swap-outs
        self._loads: dict[object, torch.cuda.Event] = {}  # load id -> completion, in flight
        self._staged: Optional[StagedCopier] = None  # swap-outs (out stream)
        self._staged_in: Optional[StagedCopier] = None  # swap-ins (copy stream)
        self.chunk_bytes: Optional[int] = None  # kernel path: bytes per program (None: its default)
        self.set_copy_mode(copy_mode)
        self._compile_copies()

    def _compile_copies(self) -> None:
        """Run each copy kernel once on block 0 so that Triton compiles them now, at start-up, and
        not inside the first step that swaps (~0.5 s on the H100). Only while the pool is new:
        it overwrites host block 0 (empty) and copies device block 0 onto itself."""
        if self.device.type != "cuda":
            return
        if self._staged is not None:
            self._staged.compile_copies()
            self._staged_in.compile_copies()
            return
        ids = block_ids_on(self.device, [[0], [0]])
        kv_swap(self.layout, ids[0], ids[1], True, self.chunk_bytes)
        kv_swap(self.layout, ids[0], ids[1], False, self.chunk_bytes)

    def set_copy_mode(self, copy_mode: str) -> None:
        """Choose how blocks move (see the module docstring); the pool's content stays.
        "kernel" on a pool the device cannot map falls back to "runs", with a warning."""
        if copy_mode not in COPY_MODES:
            raise ValueError(f"copy_mode must be one of {', '.join(COPY_MODES)}, got {copy_mode!r}")
        if copy_mode == "kernel" and self.device.type == "cuda" and not self._buffer.is_mapped:
            log.warning("host KV tier: the pool is not mapped for the device; copying through "
                        "a staging buffer instead (copy_mode='runs')")
            copy_mode = "runs"
        self.wait_loads()
        self._staged = self._staged_in = None  # their device staging goes before new ones are made
        if copy_mode != "kernel":
            gather = copy_mode == "gather"
            ids = MappedUpload(self.device, self.num_staging) if self.device.type == "cuda" and not gather else None
            self._staged = StagedCopier(self.layout, self.num_staging, gather, upload_ids=ids)  # skips the copy engines
            self._staged_in = StagedCopier(self.layout, self.num_staging, gather)
        self.copy_mode = copy_mode

    # -- the device pool it copies to ----------------------------------------------------------

    @property
    def kv_caches(self) -> Sequence[LayerKV]:
        return self._kv_caches

    @kv_caches.setter
    def kv_caches(self, kv_caches: Sequence[LayerKV]) -> None:
        """Point at a new device pool of the same layout (after a resize)."""
        self.wait_loads()
        self._kv_caches = kv_caches
        self.layout = self._layout(kv_caches)
        if self._staged is not None:
            self._staged.rebind(self.layout)
            self._staged_in.rebind(self.layout)

    def _layout(self, kv_caches: Sequence[LayerKV]) -> SwapLayout:
        return SwapLayout([[kv[f] for f in self.fields] for kv in kv_caches], self.host)

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.host)

    @property
    def device_pointer_equal(self) -> Optional[bool]:
        """Whether the mapped device address of the pool equals its host address (CUDA)."""
        return self._buffer.device_pointer_equal

    # -- copies ---------------------------------------------------------------------------------

    def swap(self, swap_out: Sequence[tuple[int, int]], swap_in: Sequence[tuple[int, int]],
             loads: Optional[Sequence[tuple[object, int]]] = None) -> None:
        """Run a step's copies: every (device, host) swap-out, then the (host, device) swap-ins
        as `loads`: (load id, number of consecutive `swap_in` pairs) each (default: one load,
        id None). Loads stay in flight (see the module docstring)."""
        if swap_out:
            out = sorted(swap_out, key=lambda p: p[1])  # by host block: runs for the DMA modes
            if self.out_stream is None:
                self._copy([h for _, h in out], [d for d, _ in out], to_host=True)
            else:
                with torch.cuda.stream(self.out_stream):
                    self._copy([h for _, h in out], [d for d, _ in out], to_host=True)
                # The forward may write the blocks just read: it runs after them.
                torch.cuda.current_stream(self.device).wait_stream(self.out_stream)
        if not swap_in:
            return
        if self.copy_stream is not None:
            self.copy_stream.wait_stream(self.out_stream)  # after every swap-out so far
        pos = 0
        for load, n in (loads or [(None, len(swap_in))]):
            into = sorted(swap_in[pos:pos + n], key=lambda p: p[0])
            pos += n
            if self.copy_stream is None:
                self._copy([h for h, _ in into], [d for _, d in into], to_host=False)
                continue
            with torch.cuda.stream(self.copy_stream):
                self._copy([h for h, _ in into], [d for _, d in into], to_host=False)
                done = torch.cuda.Event()
                done.record(self.copy_stream)
            self._loads[load] = done

    def landed(self, load_ids: Sequence[object]) -> list[object]:
        """Those of `load_ids` that finished (or were never in flight); never blocks."""
        done = []
        for load in load_ids:
            event = self._loads.get(load)
            if event is None or event.query():
                self._loads.pop(load, None)
                done.append(load)
        return done

    def wait_load(self, load: object) -> None:
        """Block the host until `load` finished."""
        event = self._loads.pop(load, None)
        if event is not None:
            event.synchronize()

    def wait_loads(self) -> None:
        """Make the compute stream wait for every load in flight (they count as landed then) and
        every swap-out queued."""
        if self.out_stream is not None:  # CUDA (on CPU every copy is done when issued)
            compute = torch.cuda.current_stream(self.device)
            compute.wait_stream(self.out_stream)
            for event in self._loads.values():
                compute.wait_event(event)
        self._loads.clear()

    def _copy(self, host_blocks: list[int], device_blocks: list[int], to_host: bool) -> None:
        if self._staged is not None:
            if to_host:
                self._staged.swap_out(device_blocks, host_blocks)
            else:
                self._staged_in.swap_in(host_blocks, device_blocks)
            return
        ids = block_ids_on(self.device, [host_blocks, device_blocks])  # one copy for both lists
        kv_swap(self.layout, ids[0], ids[1], to_host, self.chunk_bytes)


def build_host_pool(kv_caches: Sequence[LayerKV], kv_offload_gib: float, bytes_per_block: int,
                    copy_mode: str = DEFAULT_COPY_MODE) -> HostKVPool:
    """The host tier for `kv_offload_gib` GiB of blocks of `bytes_per_block` bytes."""
    from infer_cluster.protocol.errors import ConfigError
    num_blocks = host_pool_blocks(kv_offload_gib, bytes_per_block)
    if num_blocks <= 0:
        raise ConfigError(f"kv_offload_gib={kv_offload_gib} holds no KV block of {bytes_per_block} bytes; "
                          f"raise it or set 0 to turn the host tier off")
    return HostKVPool(kv_caches, num_blocks, staging_blocks(num_blocks, bytes_per_block), copy_mode)


def staging_device_bytes(kv_offload_gib: float, bytes_per_block: int, copy_mode: str = DEFAULT_COPY_MODE) -> int:
    """Device memory the tier's staging buffer takes (0 when the tier is off, and for the
    staging-free "kernel" copies)."""
    num_blocks = host_pool_blocks(kv_offload_gib, bytes_per_block)
    if num_blocks <= 0 or copy_mode == "kernel":
        return 0
    return 2 * staging_blocks(num_blocks, bytes_per_block) * bytes_per_block  # one per direction
