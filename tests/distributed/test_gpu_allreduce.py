"""On 2 CUDA devices: the symmetric-memory TP all-reduce (worker/distributed/symm_allreduce.py)
gives NCCL's sums, bit for bit (two operands round once either way), eagerly and replayed from a
CUDA graph, through `ParallelState.all_reduce` as the layers call it, for every mode, odd
shapes and both dtypes; a tensor larger than the buffer still goes through NCCL; `nccl` mode
sets nothing up. Run: `pytest -m gpu tests/distributed/test_gpu_allreduce.py`."""

import datetime
import socket

import pytest
import torch

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available() or torch.cuda.device_count() < 2:
    pytest.skip("needs 2 CUDA devices", allow_module_level=True)

SHAPES = [(1, 1024), (3, 1000), (256, 1024), (256, 4096), (7, 4096)]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank(rank: int, port: int, queue) -> None:
    import torch.distributed as dist
    from infer_cluster.worker.distributed.symm_allreduce import BUFFER_BYTES, SymmAllReduce
    from infer_cluster.worker.models.parallel import ParallelState

    failures = []
    try:
        device = torch.device("cuda", rank)
        torch.cuda.set_device(device)
        store = dist.TCPStore("127.0.0.1", port, 2, is_master=rank == 0, timeout=datetime.timedelta(seconds=60))
        dist.init_process_group("nccl", store=store, rank=rank, world_size=2, device_id=device)
        control = dist.new_group(backend="gloo")
        group = dist.new_group([0, 1])
        if SymmAllReduce.create(group, device, control, mode="nccl") is not None:
            failures.append("nccl mode set a buffer up")
        for mode in ("auto", "one_shot", "two_shot"):
            fast = SymmAllReduce.create(group, device, control, mode=mode)
            if fast is None:
                failures.append(f"{mode}: not available")
                continue
            ps = ParallelState(tp_rank=rank, tp_size=2, tp_group=group, fast_all_reduce=fast)
            for dtype in (torch.bfloat16, torch.float32):
                for shape in SHAPES:
                    gen = torch.Generator(device=device).manual_seed(hash((rank, shape)) % 2**31)
                    x = torch.randn(*shape, device=device, generator=gen).to(dtype)
                    ref = x.clone()
                    dist.all_reduce(ref, group=group)
                    kept = x.clone()
                    got = ps.all_reduce(x)
                    if not torch.equal(got, ref):
                        failures.append(f"{mode} {dtype} {shape}: eager sum differs")
                    if fast.fits(x) and not torch.equal(x, kept):  # NCCL (auto, small x) sums in place
                        failures.append(f"{mode} {dtype} {shape}: input changed")
                    static = x.clone()
                    stream = torch.cuda.Stream()
                    stream.wait_stream(torch.cuda.current_stream())
                    with torch.cuda.stream(stream):
                        ps.all_reduce(static)
                    torch.cuda.current_stream().wait_stream(stream)
                    dist.barrier(group=control)
                    graph = torch.cuda.CUDAGraph()
                    with torch.cuda.graph(graph, capture_error_mode="thread_local"):
                        out = ps.all_reduce(static)
                    dist.barrier(group=control)
                    static.copy_(x * 2)
                    graph.replay()
                    torch.cuda.synchronize()
                    twice = (x * 2).clone()
                    dist.all_reduce(twice, group=group)
                    if not torch.equal(out, twice):
                        failures.append(f"{mode} {dtype} {shape}: graph replay sum differs")
                    del graph
            big = torch.ones(BUFFER_BYTES // 4 + 256, device=device, dtype=torch.float32)
            if fast.fits(big):
                failures.append(f"{mode}: a tensor over the buffer fits")
            if ps.all_reduce(big).sum().item() != 2 * big.numel():
                failures.append(f"{mode}: NCCL fallback sum wrong")
        dist.barrier(group=control)
        dist.destroy_process_group()
    except Exception as exc:  # reported to the test, which fails with it
        failures.append(f"rank {rank}: {type(exc).__name__}: {exc}")
    queue.put((rank, failures))


@pytest.mark.timeout(240, method="thread")
def test_symm_allreduce_equals_nccl():
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_rank, args=(r, port, queue)) for r in range(2)]
    for p in procs:
        p.start()
    try:
        reports = dict(queue.get(timeout=200) for _ in procs)
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    assert reports == {0: [], 1: []}
