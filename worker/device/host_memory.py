"""Page-locked, device-mapped host memory for the host KV tier.

Owns: `HostBuffer`, one host allocation carved into tensors (one per KV field), page-locked
with `cudaHostRegister(cudaHostRegisterPortable | cudaHostRegisterMapped)` (flags 3) on CUDA so
that the DMA engines can copy it at link speed AND kernels can read and write it in place
(UVA zero-copy, `kernels/kv_swap_triton.py`). Registered rather than taken from torch's pinned
allocator, which rounds every allocation up to a power of two (a 9 GiB pool would pin 16 GiB).
Unregistered when the buffer dies, after the device has finished with it (not at interpreter
exit, when the process's end releases it).

Device pointer: `cuMemHostGetDevicePointer` gives the address kernels must use. On x86-64 with
unified addressing (every CUDA 12 GPU; `cudaDevAttrCanUseHostPointerForRegisteredMem` = 1 on
H100/H200) it equals the host pointer, so the host tensors' own `data_ptr()` works in kernels.
Where it differs, nothing breaks: Triton's launcher translates every pointer argument with
`cuPointerGetAttribute(DEVICE_POINTER)`, and all other fields are reached by offsets from that
one base inside the same registration. `HostBuffer.device_pointer_equal` records what was found
(None: the driver could not be asked), and bench/kv_swap.py prints it.
Must never be used for device memory, and never unregister memory the device may still touch.
"""

from __future__ import annotations

import ctypes
import logging
import weakref
from typing import Optional, Sequence

import torch

log = logging.getLogger(__name__)

_PORTABLE_MAPPED = 3  # cudaHostRegisterPortable | cudaHostRegisterMapped
_ALIGN = 4096         # every carved tensor starts on its own page


class HostBuffer:
    """Host tensors of the given shapes and dtypes, views of ONE allocation; page-locked and
    mapped on CUDA (`pin`), plain CPU memory otherwise."""

    def __init__(self, specs: Sequence[tuple[tuple[int, ...], torch.dtype]], pin: bool):
        offsets, total = [], 0
        for shape, dtype in specs:
            offsets.append(total)
            nbytes = _numel(shape) * torch.tensor([], dtype=dtype).element_size()
            total += -(-nbytes // _ALIGN) * _ALIGN
        self.nbytes = total
        self._storage = torch.empty(total, dtype=torch.uint8)
        self.tensors = [self._storage[off:off + _numel(shape) * torch.tensor([], dtype=dtype).element_size()]
                        .view(dtype).view(shape) for off, (shape, dtype) in zip(offsets, specs)]
        self.is_mapped = False
        self.device_pointer_equal: Optional[bool] = None
        if pin and total:
            ptr = self._storage.data_ptr()
            _register(ptr, total)
            # Not at interpreter exit: the process's end releases the registration anyway, and
            # the device may be stuck (worker/device/wait.py), so the sync would never return.
            weakref.finalize(self._storage, _unregister, ptr).atexit = False
            try:
                dev_ptr = _mapped_device_pointer(ptr)
            except RuntimeError as exc:  # page-locked for DMA, but kernels cannot reach it
                log.warning("%s", exc)
                return
            self.is_mapped = True
            self.device_pointer_equal = None if dev_ptr is None else dev_ptr == ptr
            if dev_ptr is not None and dev_ptr != ptr:
                log.info("host KV tier: mapped device address %#x differs from host address %#x "
                         "(kernels get it through Triton's pointer translation)", dev_ptr, ptr)


def _numel(shape: Sequence[int]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def _register(ptr: int, size: int) -> None:
    err = int(torch.cuda.cudart().cudaHostRegister(ptr, size, _PORTABLE_MAPPED))
    if err != 0:
        raise RuntimeError(f"could not page-lock {size / 2**30:.2f} GiB of host memory for the KV tier "
                           f"(cudaError {err}); lower kv_offload_gib")


def _unregister(ptr: int) -> None:
    try:
        torch.cuda.synchronize()  # no copy or kernel may still read or write it
    except RuntimeError:  # CUDA already torn down (interpreter exit): nothing runs any more
        pass
    torch.cuda.cudart().cudaHostUnregister(ptr)


def _mapped_device_pointer(ptr: int) -> Optional[int]:
    """The device address of registered host memory at `ptr` (driver API
    cuMemHostGetDevicePointer), or None when the driver library cannot be asked."""
    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None
    fn = lib.cuMemHostGetDevicePointer_v2
    fn.argtypes = [ctypes.POINTER(ctypes.c_uint64), ctypes.c_void_p, ctypes.c_uint]
    fn.restype = ctypes.c_int
    out = ctypes.c_uint64(0)
    status = fn(ctypes.byref(out), ctypes.c_void_p(ptr), 0)
    if status != 0:
        raise RuntimeError(f"host KV tier memory is page-locked but not mapped for the device "
                           f"(cuMemHostGetDevicePointer error {status})")
    return out.value
