"""`HostKVPool` copies in every `copy_mode` (kernel: the torch reference on CPU and the Triton
kernel under the interpreter; runs and gather: the staging-buffer DMA paths), with chunking
(lists longer than the staging buffer), consecutive and scattered host blocks, float and int8
(+ scales) pools. On CUDA (`-m gpu`) the same tests run on the mapped pinned pool, the side
copy stream and per-load completion (`landed`, `wait_load`)."""

import os

import pytest
import torch

from infer_cluster.worker.kv.copy import HostKVPool, staging_device_bytes
from infer_cluster.worker.kv.copy_dma import consecutive_runs
from infer_cluster.worker.models.decoder import LayerKV

DEVICES = ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA device")])]
MODES = ["kernel", "kernel-triton", "runs", "gather"]
NUM_DEVICE, NUM_HOST, NUM_LAYERS = 12, 10, 2


def _device_pool(device, int8):
    def field(shape, dtype):
        if dtype == torch.int8:
            return torch.randint(-127, 128, shape, dtype=dtype, device=device)
        return torch.randn(shape, device=device).to(dtype)
    block = (NUM_DEVICE, 4, 2, 8)
    if int8:
        return [LayerKV(field(block, torch.int8), field(block, torch.int8),
                        field((NUM_DEVICE, 2, 4), torch.float32), field((NUM_DEVICE, 2, 4), torch.float32))
                for _ in range(NUM_LAYERS)]
    return [LayerKV(field(block, torch.bfloat16), field(block, torch.bfloat16)) for _ in range(NUM_LAYERS)]


def _snapshot(kv, blocks):
    return [[t[blocks].cpu().clone() for t in layer if t is not None] for layer in kv]


def _pool(kv, mode, monkeypatch):
    if mode == "kernel-triton":  # the Triton kernel itself (its interpreter on CPU)
        if kv[0].k.device.type == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
            pytest.skip("Triton on CPU tensors needs TRITON_INTERPRET=1 from the start")
        monkeypatch.setenv("INFER_CLUSTER_KERNELS", "triton")
        mode = "kernel"
    return HostKVPool(kv, NUM_HOST, num_staging_blocks=3, copy_mode=mode)  # 3: lists are chunked


def _sync(kv):
    if kv[0].k.device.type == "cuda":
        torch.cuda.synchronize()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("int8", [False, True])
@pytest.mark.parametrize("mode", MODES)
def test_swap_out_then_in_round_trips(device, int8, mode, monkeypatch):
    kv = _device_pool(device, int8)
    pool = _pool(kv, mode, monkeypatch)
    src = [0, 5, 3, 7, 11, 2, 9]
    saved = _snapshot(kv, src)
    # host blocks: a consecutive run, then scattered ones (sorted by host block inside the pool)
    host = [4, 5, 6, 7, 0, 9, 2]
    pool.swap(list(zip(src, host)), [])
    for layer in kv:  # the device blocks are reused: overwrite them
        for t in layer:
            if t is not None:
                t[src] = 0
    dst = [1, 4, 6, 8, 10, 0, 3]
    pool.swap([], list(zip(host, dst)))
    pool.wait_loads()
    _sync(kv)
    for la, lb in zip(_snapshot(kv, dst), saved):
        for a, b in zip(la, lb):
            assert torch.equal(a.view(torch.uint8), b.view(torch.uint8))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("mode", MODES)
def test_swap_in_leaves_other_blocks_alone(device, mode, monkeypatch):
    kv = _device_pool(device, int8=False)
    pool = _pool(kv, mode, monkeypatch)
    pool.swap([(b, b) for b in range(NUM_HOST)], [])
    others = [b for b in range(NUM_DEVICE) if b not in (2, 7)]
    before = _snapshot(kv, others)
    pool.swap([], [(8, 2), (1, 7)])
    pool.wait_loads()
    _sync(kv)
    assert all(torch.equal(a, b) for la, lb in zip(_snapshot(kv, others), before) for a, b in zip(la, lb))
    for layer in kv:
        assert torch.equal(layer.k[2].cpu(), layer.k[8].cpu()) and torch.equal(layer.v[7].cpu(), layer.v[1].cpu())


def test_modes_and_staging_budget():
    kv = _device_pool("cpu", int8=False)
    with pytest.raises(ValueError, match="copy_mode"):
        HostKVPool(kv, 4, 2, copy_mode="memcpy")
    assert HostKVPool(kv, 4, 2, copy_mode="kernel")._staged is None  # no staging buffer
    assert HostKVPool(kv, 4, 2).copy_mode == "runs"  # the default (see worker/kv/copy.py)
    assert staging_device_bytes(1.0, 1 << 20, "kernel") == 0
    assert staging_device_bytes(1.0, 1 << 20) == 256 << 20
    assert staging_device_bytes(0.0, 1 << 20, "runs") == 0


def test_consecutive_runs():
    assert consecutive_runs([]) == []
    assert consecutive_runs([3]) == [(0, 3, 1)]
    assert consecutive_runs([0, 1, 2, 5, 6, 9]) == [(0, 0, 3), (3, 5, 2), (5, 9, 1)]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("mode", ["kernel", "runs", "gather"])
def test_loads_stay_in_flight_until_landed(mode):
    """Each load has its own completion: `landed` reports it without blocking once it finished,
    `wait_load` blocks for one, and nothing on the compute stream waits for a load."""
    kv = _device_pool("cuda", int8=False)
    pool = HostKVPool(kv, NUM_HOST, 3, copy_mode=mode)
    pool.swap([(b, b) for b in range(NUM_HOST)], [])
    pool.swap([], [(3, 9), (4, 10), (5, 11)], loads=[(7, 1), (8, 2)])
    assert set(pool._loads) == {7, 8}
    pool.wait_load(7)
    assert 7 not in pool._loads and 7 in pool.landed([7])
    torch.cuda.synchronize()
    assert pool.landed([8, 9]) == [8, 9] and not pool._loads  # 9 was never in flight
    for dst, src in ((9, 3), (10, 4), (11, 5)):
        assert torch.equal(kv[0].k[dst], kv[0].k[src]) and torch.equal(kv[-1].v[dst], kv[-1].v[src])
