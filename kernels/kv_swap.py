"""KV block swaps between the paged device pool and the host tier's pool, every layer and field
in one call: the reference here, the Triton kernel in `kv_swap_triton.py`.

Layouts (`SwapLayout` checks them once, when a pool is built):
  * device: per layer a tuple of fields (K, V, and for an int8 cache k_scale, v_scale), each
    `[num_device_blocks, *per-block shape]`, contiguous (one block of one field = one row);
  * host: per field ONE tensor `[num_host_blocks, num_layers, *per-block shape]`, contiguous, all
    fields views of one storage (one page-locked registration on CUDA, so a single mapped base
    pointer reaches every field).
`kv_swap(layout, host_blocks, device_blocks, to_host)` copies, for every i, host block
`host_blocks[i]` <-> device block `device_blocks[i]` for every layer and field (to the host when
`to_host`, else to the device). Indices are int tensors of equal length; on CUDA they live on the
device. A block may appear at most once on the written side.
Dispatch: Triton when the device pool is on CUDA (the host pool must then be mapped into the
device's address space: `worker/kv/copy.py` registers it so), the torch reference elsewhere
(`INFER_CLUSTER_KERNELS` overrides, see `dispatch.py`).
Must never allocate device memory per call beyond the index tensors the caller passes, and never
synchronize the host. To extend (a new field, e.g. fp8 scales): add it to the device tuples and
the host fields in the same order; rows of one size must come first (see `SwapLayout`).
"""

from __future__ import annotations

from typing import Optional, Sequence

import torch

from .dispatch import use_triton


class SwapLayout:
    """The device pool's fields (`device[layer][field]`) and the host pool's (`host[field]`),
    checked once; `kv_swap` and the Triton kernel read their geometry from here."""

    def __init__(self, device: Sequence[Sequence[torch.Tensor]], host: Sequence[torch.Tensor]):
        if not device or not host:
            raise ValueError("a swap layout needs at least one layer and one field")
        self.device = [list(fields) for fields in device]
        self.host = list(host)
        self.num_layers, self.num_fields = len(self.device), len(self.host)
        storage = self.host[0].untyped_storage().data_ptr()
        for j, h in enumerate(self.host):
            if h.dim() < 3 or h.shape[1] != self.num_layers or not h.is_contiguous():
                raise ValueError(f"host field {j} must be contiguous [num_host_blocks, {self.num_layers}, "
                                 f"*block], got {tuple(h.shape)}")
            if h.shape[0] != self.host[0].shape[0]:
                raise ValueError(f"host fields hold different block counts: {h.shape[0]} vs {self.host[0].shape[0]}")
            if h.untyped_storage().data_ptr() != storage:
                raise ValueError("host fields must be views of one storage (one mapped registration)")
        for layer, fields in enumerate(self.device):
            if len(fields) != self.num_fields:
                raise ValueError(f"layer {layer} has {len(fields)} fields, the host pool {self.num_fields}")
            for j, (d, h) in enumerate(zip(fields, self.host)):
                if d.dtype != h.dtype or d.shape[1:] != h.shape[2:] or not d.is_contiguous():
                    raise ValueError(f"layer {layer} field {j}: device {d.dtype} {tuple(d.shape)} does not "
                                     f"match host {h.dtype} {tuple(h.shape)} (or is not contiguous)")
                if d.device != self.device[0][0].device or d.shape[0] != self.device[0][0].shape[0]:
                    raise ValueError(f"layer {layer} field {j}: every device field must share one device "
                                     f"and block count")
        # bytes of one block of one layer, per field
        self.row_bytes = [h[0, 0].numel() * h.element_size() for h in self.host]
        self._triton_plan = None  # built by kv_swap_triton on first use

    @property
    def num_host_blocks(self) -> int:
        return self.host[0].shape[0]

    @property
    def num_device_blocks(self) -> int:
        return self.device[0][0].shape[0]

    @property
    def bytes_per_block(self) -> int:
        return sum(self.row_bytes) * self.num_layers

    def check_indices(self, host_blocks: torch.Tensor, device_blocks: torch.Tensor) -> None:
        if host_blocks.dim() != 1 or host_blocks.shape != device_blocks.shape:
            raise ValueError(f"host_blocks and device_blocks must be 1-D of one length, got "
                             f"{tuple(host_blocks.shape)} and {tuple(device_blocks.shape)}")
        if host_blocks.dtype.is_floating_point or device_blocks.dtype.is_floating_point:
            raise ValueError("block indices must be integer tensors")


def kv_swap_ref(layout: SwapLayout, host_blocks: torch.Tensor, device_blocks: torch.Tensor,
                to_host: bool) -> None:
    """Plain torch index ops: per field and layer one gather and one scatter."""
    layout.check_indices(host_blocks, device_blocks)
    if host_blocks.numel() == 0:
        return
    for j, host in enumerate(layout.host):
        hb = host_blocks.to(host.device, torch.int64)
        for layer, fields in enumerate(layout.device):
            dev = fields[j]
            db = device_blocks.to(dev.device, torch.int64)
            if to_host:
                host[:, layer].index_copy_(0, hb, dev.index_select(0, db).to(host.device))
            else:
                dev.index_copy_(0, db, host[:, layer].index_select(0, hb).to(dev.device))


def kv_swap(layout: SwapLayout, host_blocks: torch.Tensor, device_blocks: torch.Tensor, to_host: bool,
            chunk_bytes: Optional[int] = None) -> None:
    if use_triton(layout.device[0][0]):
        from .kv_swap_triton import kv_swap_triton
        return kv_swap_triton(layout, host_blocks, device_blocks, to_host, chunk_bytes)
    return kv_swap_ref(layout, host_blocks, device_blocks, to_host)
