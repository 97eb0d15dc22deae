"""Per-step host cost of getting a step from rank 0 to another rank and rebuilding its inputs
there, on the CPU (gloo, two processes, one thread each), without the model.

Two transports, each timed as a round trip on rank 0 (send the step, rank 1 rebuilds its
`StepInputs`, a one-value all-reduce on a third group acknowledges, as the model's first
TP all-reduce would), minus the cost of that all-reduce alone:

- `msgpack`: the previous design, reproduced here as the baseline: rank 0 builds its own
  inputs with `DynamicContext.prepare`, msgpacks the `SchedulerOutput`, writes a 9-byte
  doorbell to rank 1's pipe and broadcasts the bytes as a uint8 tensor; rank 1 reads the
  doorbell, receives, decodes and runs `prepare`.
- `packed`: the step tensor (`worker/distributed/step_codec.py`) through `StepChannel`: rank 0
  packs once and unpacks views; rank 1 receives header (+ inline payload) and unpacks views.

Reports the median wall-clock round trip and each rank's CPU time per step (all threads of the
process, so gloo's too), and, in one process without any transport, the Python work each side
does per step (rank 0: build and encode; rank 1: decode and rebuild). On a busy machine the
round trips swing with gloo's thread wake-ups; the host-work figures are the steady ones.

    python bench/step_transport.py --batch 1 32 256 --out bench/results/step_transport.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import socket
import statistics
import struct
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

DOORBELL = struct.Struct("<BQ")
BLOCK = 16


def make_step(batch: int, context: int):
    from infer_cluster.worker.sched.output import ScheduledRequest, SchedulerOutput

    per_seq = -(-(context + 1) // BLOCK)
    return SchedulerOutput([ScheduledRequest(f"r{i}", [7 + i % 100], context,
                                             list(range(i * per_seq, (i + 1) * per_seq)), True)
                            for i in range(batch)], batch)


def context_for(batch: int, context: int):
    import torch

    from infer_cluster.worker.runner.context import DynamicContext

    blocks = batch * -(-(context + 1) // BLOCK) + 1
    return DynamicContext(1, blocks, BLOCK, 1, 8, torch.float32, torch.device("cpu"))


def encode(out) -> bytes:
    import msgpack

    rows = [[r.token_ids, r.start_position, r.block_ids, r.needs_sample] for r in out.requests]
    return msgpack.packb([1, out.num_batched_tokens, rows], use_bin_type=True)


def decode(data: bytes):
    import msgpack

    from infer_cluster.worker.sched.output import ScheduledRequest, SchedulerOutput

    _, n, rows = msgpack.unpackb(data, raw=False)
    return SchedulerOutput([ScheduledRequest(str(i), list(t), int(s), list(b), bool(x))
                            for i, (t, s, b, x) in enumerate(rows)], n)


def read_exact(fd: int, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = os.read(fd, n - len(data))
        if not chunk:
            raise EOFError("doorbell pipe closed")
        data += chunk
    return data


def rank_main(rank: int, port: int, pipe_fd: int, args) -> None:
    import torch
    import torch.distributed as dist

    from infer_cluster.worker.distributed.channel import StepChannel
    from infer_cluster.worker.distributed.shard import CPU_INLINE_CAPACITY
    from infer_cluster.worker.distributed.step_codec import pack_step, unpack_step

    torch.set_num_threads(1)
    timeout = datetime.timedelta(seconds=60)
    store = dist.TCPStore("127.0.0.1", port, 2, is_master=rank == 0, timeout=timeout)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=2, timeout=timeout)
    wait = dist.new_group(backend="gloo", timeout=timeout)
    inline = CPU_INLINE_CAPACITY if args.inline is None else args.inline
    channel = StepChannel(wait, dist.group.WORLD, torch.device("cpu"), inline)
    # The acknowledgement stands for the model's first collective, which is on the TP group:
    # a group of its own, as in a replica (switching gloo groups has a cost of its own).
    ack_group = dist.new_group(backend="gloo", timeout=timeout)
    ack = torch.zeros(1)
    results = []
    for batch in args.batch:
        out = make_step(batch, args.context)
        ctx = context_for(batch, args.context)

        def msgpack_step():
            if rank == 0:
                ctx.prepare(out)
                data = encode(out)
                os.write(pipe_fd, DOORBELL.pack(1, len(data)))
                dist.broadcast(torch.frombuffer(bytearray(data), dtype=torch.uint8), src=0)
            else:
                _, length = DOORBELL.unpack(read_exact(pipe_fd, DOORBELL.size))
                buf = torch.empty(length, dtype=torch.uint8)
                dist.broadcast(buf, src=0)
                ctx.prepare(decode(buf.numpy().tobytes()))

        def packed_step():
            if rank == 0:
                header, payload = pack_step(out, BLOCK)
                unpack_step(header, channel.send(header, payload))
            else:
                unpack_step(*channel.recv())

        row = {"batch": batch}
        bodies = {"ack_only": lambda: None, "msgpack": msgpack_step, "packed": packed_step}
        times = {name: [] for name in bodies}
        cpu = {name: torch.zeros(2, dtype=torch.float64) for name in bodies}
        for body in bodies.values():
            for _ in range(args.warmup):
                body()
                dist.all_reduce(ack, group=ack_group)
        # Rounds alternate the transports so that a busy machine's drift hits all alike.
        per_round = max(1, args.steps // args.rounds)
        for _ in range(args.rounds):
            for name, body in bodies.items():
                cpu0 = time.process_time()
                for _ in range(per_round):
                    t0 = time.perf_counter()
                    body()
                    dist.all_reduce(ack, group=ack_group)
                    times[name].append(time.perf_counter() - t0)
                # CPU time of this process (all its threads, gloo's included)
                cpu[name][rank] += time.process_time() - cpu0
        for name in bodies:
            dist.all_reduce(cpu[name])
            row[name + "_us"] = statistics.median(times[name]) * 1e6
            row[name + "_cpu_us"] = (cpu[name] / (per_round * args.rounds) * 1e6).tolist()
        for name in ("msgpack", "packed"):
            row[name + "_net_us"] = row[name + "_us"] - row["ack_only_us"]
            row[name + "_net_cpu_us"] = [a - b for a, b in zip(row[name + "_cpu_us"], row["ack_only_cpu_us"])]
        results.append(row)
    if rank == 0:
        print(json.dumps(results), flush=True)
    dist.destroy_process_group()


def host_work(batch: int, context: int, repeat: int = 200) -> dict:
    """In-process Python work per step on each side (no transport): median microseconds."""
    import torch

    from infer_cluster.worker.distributed.step_codec import pack_step, unpack_step

    out, ctx = make_step(batch, context), context_for(batch, context)
    data = encode(out)
    header, payload = pack_step(out, BLOCK)

    def pack_and_unpack():
        h, p = pack_step(out, BLOCK)
        unpack_step(h, torch.from_numpy(p))

    def timed(fn):
        times = []
        for _ in range(repeat):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        return statistics.median(times) * 1e6

    return {"msgpack_rank0_us": timed(lambda: (ctx.prepare(out), encode(out))),
            "msgpack_rank1_us": timed(lambda: ctx.prepare(decode(data))),
            "packed_rank0_us": timed(pack_and_unpack),
            "packed_rank1_us": timed(lambda: unpack_step(header, torch.from_numpy(payload)))}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 32, 256])
    ap.add_argument("--context", type=int, default=1024, help="tokens already in each sequence")
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--warmup", type=int, default=40)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--inline", type=int, default=None,
                    help="payload values carried in the header broadcast (default: the shard's)")
    ap.add_argument("--out", default="bench/results/step_transport.json")
    ap.add_argument("--rank", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--pipe-fd", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.rank is not None:
        return rank_main(args.rank, args.port, args.pipe_fd, args)

    from bench.report import write_json

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    read_fd, write_fd = os.pipe()
    common = [sys.executable, os.path.abspath(__file__), "--port", str(port), "--context", str(args.context),
              "--steps", str(args.steps), "--warmup", str(args.warmup), "--rounds", str(args.rounds),
              *(["--inline", str(args.inline)] if args.inline is not None else []), "--batch", *map(str, args.batch)]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    procs = [subprocess.Popen(common + ["--rank", "0", "--pipe-fd", str(write_fd)], pass_fds=(write_fd,),
                              stdout=subprocess.PIPE, env=env, text=True),
             subprocess.Popen(common + ["--rank", "1", "--pipe-fd", str(read_fd)], pass_fds=(read_fd,), env=env)]
    os.close(read_fd)
    os.close(write_fd)
    try:
        stdout = procs[0].communicate(timeout=600)[0]
        procs[1].wait(timeout=30)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    rows = json.loads(stdout.strip().splitlines()[-1])
    for r in rows:
        r.update(host_work(r["batch"], args.context))
        print(f"batch={r['batch']:4d} context={args.context} host work per step, rank 0 / rank 1: "
              f"msgpack {r['msgpack_rank0_us']:6.1f} / {r['msgpack_rank1_us']:6.1f} us, "
              f"packed {r['packed_rank0_us']:6.1f} / {r['packed_rank1_us']:6.1f} us")
        for name, label in (("msgpack", "msgpack+doorbell"), ("packed", "packed tensor")):
            cpu = r[name + "_net_cpu_us"]
            print(f"batch={r['batch']:4d} context={args.context} {label:17s}: round trip {r[name + '_net_us']:7.1f} us, "
                  f"CPU rank 0 {cpu[0]:7.1f} us, rank 1 {cpu[1]:7.1f} us per step "
                  f"(the ack all-reduce's {r['ack_only_us']:.0f} us / CPU subtracted)")
    write_json(args.out, {"context": args.context, "steps": args.steps, "inline": args.inline, "rows": rows})


if __name__ == "__main__":
    main()
