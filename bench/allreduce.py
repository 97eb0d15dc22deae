"""Latency of the TP all-reduce per path and size, on 2+ GPUs of one host, inside CUDA graphs
(as decode runs it): NCCL (`dist.all_reduce`) against torch's symmetric-memory one-shot and
two-shot all-reduces through `worker/distributed/symm_allreduce.py`.

Each rank captures `--calls` back-to-back all-reduces of a bf16 `[rows, hidden]` tensor in one
graph and replays it; the figure is the median replay time over `--calls`. Before timing, every
symmetric path's sum is checked against NCCL's (exact for 2 ranks: a two-operand sum rounds once
either way). The table sets `TWO_SHOT_MIN_BYTES` / `BUFFER_BYTES` in symm_allreduce.py.

    python bench/allreduce.py --gpus 2 --out bench/results/allreduce.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import socket
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

MODES = ("nccl", "one_shot", "two_shot")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _time_graph(graph, calls: int, repeats: int = 20) -> float:
    import torch
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000.0 / calls)
    return statistics.median(times)


def rank_main(rank: int, world: int, port: int, args, queue) -> None:
    import torch
    import torch.distributed as dist
    from infer_cluster.worker.distributed.symm_allreduce import BUFFER_BYTES, SymmAllReduce

    device = torch.device("cuda", rank)
    torch.cuda.set_device(device)
    store = dist.TCPStore("127.0.0.1", port, world, is_master=rank == 0,
                          timeout=datetime.timedelta(seconds=120))
    dist.init_process_group("nccl", store=store, rank=rank, world_size=world, device_id=device)
    control = dist.new_group(backend="gloo")
    group = dist.new_group(list(range(world)))
    paths = {mode: SymmAllReduce.create(group, device, control, mode=mode) for mode in MODES[1:]}
    rows_list = [r for r in args.rows if r * args.hidden * 2 <= BUFFER_BYTES]
    results = []
    for rows in rows_list:
        gen = torch.Generator(device=device).manual_seed(1000 + rank)
        x = torch.randn(rows, args.hidden, device=device, generator=gen).to(torch.bfloat16)
        ref = x.clone()
        dist.all_reduce(ref, group=group)
        row = {"rows": rows, "hidden": args.hidden, "bytes": x.numel() * 2}
        for mode in MODES:
            path = paths.get(mode)
            if mode != "nccl" and path is None:
                row[mode + "_us"] = None
                continue

            def once(inp=x, path=path):
                if path is None:
                    y = inp.clone()
                    dist.all_reduce(y, group=group)
                    return y
                return path(inp)

            if mode != "nccl":
                got = once()
                torch.cuda.synchronize()
                row[mode + "_equal"] = bool(torch.equal(got, ref))
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                for _ in range(3):
                    once()
            torch.cuda.current_stream().wait_stream(stream)
            dist.barrier(group=control)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, capture_error_mode="thread_local"):
                for _ in range(args.calls):
                    once()
            dist.barrier(group=control)
            graph.replay()
            torch.cuda.synchronize()
            dist.barrier(group=control)
            row[mode + "_us"] = round(_time_graph(graph, args.calls), 2)
            del graph
        results.append(row)
        dist.barrier(group=control)
    if rank == 0:
        queue.put(results)
    dist.barrier(group=control)
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gpus", type=int, default=2, help="ranks, one GPU each")
    parser.add_argument("--hidden", type=int, nargs="+", default=[1024, 4096],
                        help="hidden sizes (Qwen3-0.6B: 1024, Llama-3-8B: 4096)")
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 8, 32, 64, 128, 256, 512, 1024])
    parser.add_argument("--calls", type=int, default=20, help="all-reduces per captured graph")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
    import torch
    import torch.multiprocessing as mp
    if torch.cuda.device_count() < args.gpus:
        sys.exit(f"error: needs {args.gpus} CUDA devices, {torch.cuda.device_count()} visible")
    table = []
    ctx = mp.get_context("spawn")
    for hidden in args.hidden:
        queue = ctx.Queue()
        sub = argparse.Namespace(**{**vars(args), "hidden": hidden})
        port = _free_port()
        procs = [ctx.Process(target=rank_main, args=(r, args.gpus, port, sub, queue)) for r in range(args.gpus)]
        for p in procs:
            p.start()
        try:
            table.extend(queue.get(timeout=300))
        except Exception:
            pass
        for p in procs:
            p.join(timeout=60)
            if p.is_alive():
                p.kill()
        if any(p.exitcode != 0 for p in procs):
            sys.exit(f"error: a rank failed (exit codes {[p.exitcode for p in procs]})")
    print(f"{'hidden':>6} {'rows':>5} {'KiB':>7} " + " ".join(f"{m + ' us':>12}" for m in MODES) + "  equal")
    for row in table:
        cells = " ".join(f"{row[m + '_us'] if row[m + '_us'] is not None else '-':>12}" for m in MODES)
        eq = "/".join(str(row.get(m + "_equal", "-")) for m in MODES[1:])
        print(f"{row['hidden']:>6} {row['rows']:>5} {row['bytes'] / 1024:>7.0f} {cells}  {eq}")
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            json.dump({"gpus": args.gpus, "calls": args.calls, "rows": table}, f, indent=1)


if __name__ == "__main__":
    main()
