"""Triton KV block swap vs `kv_swap_ref`: every layer and field (K, V, int8 scales) of each
(host block, device block) pair, both directions, in one launch; nothing else touched. The host
pool comes from `HostBuffer` (page-locked and mapped on CUDA, so the GPU case is the real
zero-copy path)."""

import pytest
import torch

from infer_cluster.kernels.kv_swap import SwapLayout, kv_swap_ref
from infer_cluster.kernels.kv_swap_triton import kv_swap_triton
from infer_cluster.worker.device.host_memory import HostBuffer

NUM_LAYERS, NUM_DEVICE, NUM_HOST = 3, 9, 7


def _random(shape, dtype, device):
    if dtype == torch.int8:
        return torch.randint(-127, 128, shape, dtype=torch.int8, device=device)
    return torch.randn(shape, device=device).to(dtype)


def _pools(device, dtype, block_size, num_kv_heads, head_dim):
    """Random device layers and host fields (so untouched blocks are detectable)."""
    block = (block_size, num_kv_heads, head_dim)
    specs = [(block, dtype), (block, dtype)]
    if dtype == torch.int8:
        specs += [((num_kv_heads, block_size), torch.float32)] * 2
    device_layers = [[_random((NUM_DEVICE,) + shape, dt, device) for shape, dt in specs]
                     for _ in range(NUM_LAYERS)]
    buf = HostBuffer([((NUM_HOST, NUM_LAYERS) + shape, dt) for shape, dt in specs], pin=device == "cuda")
    for t in buf.tensors:
        t.copy_(_random(t.shape, t.dtype, "cpu"))
    return device_layers, buf


def _clone(device_layers, buf):
    copy = HostBuffer([(t.shape, t.dtype) for t in buf.tensors], pin=False)
    for a, b in zip(copy.tensors, buf.tensors):
        a.copy_(b)
    return [[t.clone() for t in layer] for layer in device_layers], copy


def _assert_same(a_layers, a_buf, b_layers, b_buf):
    for la, lb in zip(a_layers, b_layers):
        for x, y in zip(la, lb):
            assert torch.equal(x.cpu().view(torch.uint8), y.cpu().view(torch.uint8))
    for x, y in zip(a_buf.tensors, b_buf.tensors):
        assert torch.equal(x.view(torch.uint8), y.view(torch.uint8))


PAIRS = {
    "non_consecutive": ([5, 0, 3, 6], [2, 7, 4, 0]),
    "consecutive": ([1, 2, 3], [4, 5, 6]),
    "single": ([6], [8]),
    "empty": ([], []),
}


@pytest.mark.parametrize("to_host", [False, True])
@pytest.mark.parametrize("pairs", list(PAIRS))
@pytest.mark.parametrize("dtype,head_dim,chunk_bytes", [
    (torch.bfloat16, 8, None),     # one chunk per row; scales: none
    (torch.float32, 12, 64),       # 96-word rows in 16-word chunks: six full chunks
    (torch.int8, 12, 128),         # 48-word K/V rows in 32-word chunks (a partial one), 8-word scales
])
def test_matches_reference(device, dtype, head_dim, chunk_bytes, pairs, to_host):
    layers, buf = _pools(device, dtype, block_size=4, num_kv_heads=2, head_dim=head_dim)
    ref_layers, ref_buf = _clone(layers, buf)
    host_blocks, device_blocks = PAIRS[pairs]
    idx = dict(dtype=torch.int32, device=device)
    kv_swap_triton(SwapLayout(layers, buf.tensors), torch.tensor(host_blocks, **idx),
                   torch.tensor(device_blocks, **idx), to_host, chunk_bytes)
    kv_swap_ref(SwapLayout(ref_layers, ref_buf.tensors), torch.tensor(host_blocks, dtype=torch.int64),
                torch.tensor(device_blocks, dtype=torch.int64), to_host)
    if device == "cuda":
        torch.cuda.synchronize()
    _assert_same(layers, buf, ref_layers, ref_buf)
    if host_blocks:  # and the reference really moved the data
        h, d = host_blocks[0], device_blocks[0]
        for layer in range(NUM_LAYERS):
            for j, t in enumerate(buf.tensors):
                assert torch.equal(t[h, layer], layers[layer][j][d].cpu())


def test_odd_rows_copy_byte_by_byte(device):
    """Rows whose byte count no wider word divides (int8, 1 head of 5 dims, blocks of 3 tokens:
    15-byte rows) take the 1-byte word, still in one launch."""
    layers, buf = _pools(device, torch.int8, block_size=3, num_kv_heads=1, head_dim=5)
    ref_layers, ref_buf = _clone(layers, buf)
    hb, db = [4, 1], [3, 8]
    layout = SwapLayout(layers, buf.tensors)
    kv_swap_triton(layout, torch.tensor(hb, device=device), torch.tensor(db, device=device), False, 8)
    assert layout._triton_plan.word == 1 and layout._triton_plan.num_a == 2
    kv_swap_ref(SwapLayout(ref_layers, ref_buf.tensors), torch.tensor(hb), torch.tensor(db), False)
    if device == "cuda":
        torch.cuda.synchronize()
    _assert_same(layers, buf, ref_layers, ref_buf)


def test_layout_rejects_mismatches():
    layers = [[torch.zeros(4, 2, 1, 8)] * 2 for _ in range(2)]
    buf = HostBuffer([((3, 2, 2, 1, 8), torch.float32)] * 2, pin=False)
    SwapLayout(layers, buf.tensors)  # the matching layout is accepted
    with pytest.raises(ValueError, match="one storage"):
        SwapLayout(layers, [buf.tensors[0], buf.tensors[1].clone()])
    with pytest.raises(ValueError, match="does not match"):
        SwapLayout([[torch.zeros(4, 2, 1, 8, dtype=torch.float16)] * 2] * 2, buf.tensors)
    with pytest.raises(ValueError, match="num_host_blocks, 3"):
        SwapLayout(layers + layers[:1], buf.tensors)
    with pytest.raises(ValueError, match="1-D of one length"):
        kv_swap_ref(SwapLayout(layers, buf.tensors), torch.tensor([0, 1]), torch.tensor([0]), True)


from tests.kernels.conftest import sm90_check  # noqa: E402

SM90_PTX_COUNTS = sm90_check("kv_swap_ptx_counts", """
import re
from bench.sm90_build import compile_sm90
from infer_cluster.kernels.kv_swap_triton import _kv_swap_kernel
ptrs = dict(dev_base="*i32", host_base="*i32", dev_off_ptr="*i64", host_off_ptr="*i64",
            host_idx_ptr="*i32", dev_idx_ptr="*i32")
consts = dict(TO_HOST=False, NUM_A=2, ROW_A=8192, ROW_B=8192, CHUNK_A=2048, CHUNK_B=2048, ALIGN=16)
ptx = compile_sm90(_kv_swap_kernel, ptrs, dict(num_layers=28), consts, dict(num_warps=4), ()).asm["ptx"]
print(len(re.findall(r"ld[.]global[.]v4[.]b32", ptx)), len(re.findall(r"st[.]global[.]v4[.]b32", ptx)))
""")


def test_sm90_build_moves_16_bytes_per_access(sm90_builds):
    """Compiled ahead of time for an H100 (no GPU needed; in a child process, as the
    interpreter cannot compile): the K/V rows move with 128-bit loads and stores, which the
    offsets' alignment hint and the compile-time row sizes allow. A regression to 32-bit
    accesses would cost most of the link's rate."""
    assert sm90_builds.get(SM90_PTX_COUNTS).split() == ["4", "4"]  # 4 x 16 B per thread each way: 8 KiB per program
