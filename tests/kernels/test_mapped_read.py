"""`mapped_read_triton` (kernels/mapped_read_triton.py) against the plain copy it replaces: on
the CPU under the interpreter, and on CUDA from page-locked, device-mapped host memory; and
`MappedUpload` (worker/device/upload.py), whose ring of host rows must never hand the device a
row the host has already rewritten."""

import os

import numpy as np
import pytest
import torch

from infer_cluster.kernels.mapped_read_triton import BLOCK, mapped_read_triton

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
SIZES = [0, 1, BLOCK - 1, BLOCK, BLOCK + 1, 3 * BLOCK + 17]


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="CPU tensors need TRITON_INTERPRET=1")
@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("dtype", [torch.int64, torch.float32])
def test_matches_copy_on_cpu(n, dtype):
    src = (torch.arange(n, dtype=torch.int64) * 7919 - 5).to(dtype)
    out = torch.full((n,), -1, dtype=dtype)
    mapped_read_triton(src, out)
    assert torch.equal(out, src)


def test_rejects_mismatched_tensors():
    with pytest.raises(ValueError, match="one shape and dtype"):
        mapped_read_triton(torch.zeros(4, dtype=torch.int64), torch.zeros(5, dtype=torch.int64))
    with pytest.raises(ValueError, match="one shape and dtype"):
        mapped_read_triton(torch.zeros(4, dtype=torch.int64), torch.zeros(4, dtype=torch.int32))
    with pytest.raises(ValueError, match="contiguous"):
        mapped_read_triton(torch.zeros(8, dtype=torch.int64)[::2], torch.zeros(4, dtype=torch.int64))


@pytest.mark.gpu
@cuda
@pytest.mark.parametrize("n", SIZES)
def test_reads_mapped_host_memory_on_cuda(n):
    from infer_cluster.worker.device.host_memory import HostBuffer
    buf = HostBuffer([((max(n, 1),), torch.int64)], pin=True)
    assert buf.is_mapped
    src = buf.tensors[0][:n]
    src.copy_(torch.arange(n, dtype=torch.int64) * 3 + 1)
    out = torch.full((n,), -1, dtype=torch.int64, device="cuda")
    mapped_read_triton(src, out)
    torch.cuda.synchronize()
    assert torch.equal(out.cpu(), src)


@pytest.mark.gpu
@cuda
def test_upload_ring_wraps_without_overwriting_pending_rows():
    """More uploads than ring rows, each read by a kernel queued behind a long-running one: every
    device tensor holds what its own call was given."""
    from infer_cluster.worker.device.upload import MappedUpload
    up = MappedUpload(torch.device("cuda"), capacity=4096, slots=3)
    assert up.enabled
    big = torch.randn(4096, 4096, device="cuda")
    outs, wants = [], []
    for i in range(10):
        big = big @ big.T / 4096  # keeps the stream busy, so reads queue behind it
        values = np.arange(100 + i, dtype=np.int64) * (i + 1)
        outs.append(up(values))
        wants.append(values)
    torch.cuda.synchronize()
    for out, want in zip(outs, wants):
        assert np.array_equal(out.cpu().numpy(), want)
    long = up(np.arange(5000, dtype=np.int64))  # over capacity: the pinned DMA copy
    torch.cuda.synchronize()
    assert np.array_equal(long.cpu().numpy(), np.arange(5000))


def _staged_case(rows: int, cols: int, device: str = "cpu"):
    from infer_cluster.kernels.mapped_read_triton import mapped_read_staged
    head, table_at, stride = 37, 40, 9
    words = table_at + (4 * stride + 1) // 2 + 1
    src = torch.arange(words, dtype=torch.int64) * 1_000_003 + 11
    out = torch.full((words,), -1, dtype=torch.int64, device=device)
    want = out.cpu().clone()
    want[:head] = src[:head]
    w32, s32 = want.view(torch.int32), src.view(torch.int32)
    for r in range(rows):
        at = 2 * table_at + r * stride
        w32[at:at + cols] = s32[at:at + cols]
    return mapped_read_staged, src, out, want, (head, table_at, rows, cols, stride)


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="CPU tensors need TRITON_INTERPRET=1")
@pytest.mark.parametrize("rows,cols", [(0, 0), (1, 1), (3, 5), (4, 9)])
def test_staged_read_copies_the_head_and_the_rows_only(rows, cols):
    """The head, then `cols` values of each of `rows` table rows: nothing else changes."""
    read, src, out, want, args = _staged_case(rows, cols)
    read(src, out, *args)
    assert torch.equal(out, want)


def test_staged_read_refuses_what_does_not_fit():
    from infer_cluster.kernels.mapped_read_triton import mapped_read_staged
    buf = torch.zeros(64, dtype=torch.int64)
    with pytest.raises(ValueError, match="do not fit"):
        mapped_read_staged(buf, buf.clone(), 8, 16, 12, 4, 9)  # 12 rows of 9 int32 end past word 64
    with pytest.raises(ValueError, match="do not fit"):
        mapped_read_staged(buf, buf.clone(), 8, 16, 1, 10, 9)  # cols wider than a row
    with pytest.raises(ValueError, match="int64"):
        mapped_read_staged(buf.view(torch.int32), buf.view(torch.int32), 8, 16, 1, 1, 9)


@pytest.mark.gpu
@cuda
def test_staged_read_from_mapped_memory_on_cuda():
    from infer_cluster.worker.device.host_memory import HostBuffer
    read, src, out, want, args = _staged_case(4, 7, "cuda")
    buf = HostBuffer([((src.shape[0],), torch.int64)], pin=True)
    buf.tensors[0].copy_(src)
    read(buf.tensors[0], out, *args)
    torch.cuda.synchronize()
    assert torch.equal(out.cpu(), want)
