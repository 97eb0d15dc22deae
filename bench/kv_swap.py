"""GPU micro-benchmark of the host KV tier's copies (issue 14): GB/s of swap-ins and swap-outs
between a Qwen3-0.6B-shaped device pool and a page-locked host pool, per copy path.

Pool: 28 layers, 8 KV heads, head 128, block 16, bf16 (1.75 MiB per block) and int8 (+ float32
scales, 0.9 MiB per block); host pool of `--host-gib` GiB. Cases: `--num-blocks` random
non-consecutive host blocks into random device blocks, and one consecutive run of as many, each
`--repeats` times with fresh blocks every repeat. Paths (`HostKVPool.copy_mode`):
  kernel  the zero-copy Triton kernel (one launch per direction), at several `--chunk-bytes`
  runs    DMA per run of consecutive host blocks via a device staging buffer (no CPU gather)
  gather  the first implementation: CPU gather into pinned staging, one DMA, per-layer scatter
plus `memcpy`, one contiguous pinned->device (and back) copy of the same bytes: the link's rate.
Every path is first checked against the same data (every byte of the copied blocks). A
"GB/s" is bytes of KV moved / wall time of the repeats, host issue included (synchronized).

  python bench/kv_swap.py                       # the full table (~1 min on an H100)
  python bench/kv_swap.py --dtypes bf16 --repeats 4 --host-gib 2   # quicker
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=28)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--dtypes", default="bf16,int8")
    ap.add_argument("--host-gib", type=float, default=None, help="default 12 (cuda), 0.25 (cpu)")
    ap.add_argument("--device-blocks", type=int, default=None, help="default 1024 (cuda), 64 (cpu)")
    ap.add_argument("--num-blocks", type=int, default=None, help="blocks per swap; default 250 (cuda), 16 (cpu)")
    ap.add_argument("--repeats", type=int, default=None, help="default 16 (cuda), 2 (cpu)")
    ap.add_argument("--modes", default="kernel,runs,gather")
    ap.add_argument("--chunk-bytes", default="4096,8192,16384", help="kernel path: bytes per program")
    ap.add_argument("--device", default="cuda", help="cpu: a dry run of the script (tiny pools, no meaningful rates)")
    ap.add_argument("--out", default="bench/results/kv_swap.json")
    args = ap.parse_args(argv)
    small = args.device == "cpu"  # a dry run: pools that fit beside everything else on the host
    for name, full, dry in (("host_gib", 12.0, 0.25), ("device_blocks", 1024, 64), ("num_blocks", 250, 16),
                            ("repeats", 16, 2)):
        if getattr(args, name) is None:
            setattr(args, name, dry if small else full)
    return args


def build(args, dtype_name):
    import torch

    from infer_cluster.worker.kv.copy import HostKVPool, host_pool_blocks, staging_blocks
    from infer_cluster.worker.models.decoder import LayerKV
    dev = torch.device(args.device)
    n, shape = args.device_blocks, (args.device_blocks, args.block_size, args.kv_heads, args.head_dim)
    scale = (n, args.kv_heads, args.block_size)
    if dtype_name == "int8":
        kv = [LayerKV(torch.zeros(shape, dtype=torch.int8, device=dev), torch.zeros(shape, dtype=torch.int8, device=dev),
                      torch.zeros(scale, device=dev), torch.zeros(scale, device=dev)) for _ in range(args.layers)]
    else:
        kv = [LayerKV(torch.zeros(shape, dtype=torch.bfloat16, device=dev),
                      torch.zeros(shape, dtype=torch.bfloat16, device=dev)) for _ in range(args.layers)]
    per_block = sum(t[0].numel() * t.element_size() for t in kv[0] if t is not None) * args.layers
    num_host = host_pool_blocks(args.host_gib, per_block)
    t = time.perf_counter()
    pool = HostKVPool(kv, num_host, staging_blocks(num_host, per_block), copy_mode="kernel")
    for h in pool.host:  # fill the pool with a pattern (also faults every page in)
        h.view(torch.uint8).view(-1)[::4096] = 1
    return kv, pool, per_block, time.perf_counter() - t


def check(pool, kv, rng):
    """Every path moves the same bytes: random host data in, then out again, compared."""
    import torch
    host = rng.sample(range(pool.num_blocks), 40)
    for h in pool.host:
        raw = h.view(torch.uint8)
        raw[host] = torch.randint(0, 256, raw[host].shape, dtype=torch.uint8)
    want = [h[host].clone() for h in pool.host]
    for mode in ("kernel", "runs", "gather"):
        pool.set_copy_mode(mode)
        dev = rng.sample(range(len(kv[0].k)), len(host))
        pool.swap([], list(zip(host, dev)))
        pool.wait_loads()
        _sync()
        for j, f in enumerate(pool.fields):
            for layer in range(len(kv)):
                got = kv[layer][f][dev].cpu()
                if not torch.equal(got.view(torch.uint8), want[j][:, layer].contiguous().view(torch.uint8)):
                    raise SystemExit(f"copy path {mode}: swapped-in block data differ from the host pool")
        back = rng.sample(sorted(set(range(pool.num_blocks)) - set(host)), len(host))  # keep `host` intact
        pool.swap(list(zip(dev, back)), [])
        _sync()
        for j in range(len(pool.host)):
            if not torch.equal(pool.host[j][back].view(torch.uint8), want[j].view(torch.uint8)):
                raise SystemExit(f"copy path {mode}: swapped-out block data differ from the device pool")


def _sync():
    import torch
    if torch.cuda.is_initialized():
        torch.cuda.synchronize()


def timed(pool, cases, to_host) -> float:
    _sync()
    t = time.perf_counter()
    for host, dev in cases:
        if to_host:
            pool.swap(list(zip(dev, host)), [])
        else:
            pool.swap([], list(zip(host, dev)))
    pool.wait_loads()
    _sync()
    return time.perf_counter() - t


def main(argv=None):
    args = parse_args(argv)
    import torch

    from bench.report import write_json
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("bench/kv_swap.py measures GPU copies; no CUDA device here (--device cpu: a dry run)")
    rng = random.Random(0)
    results = {"device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu", "rows": []}
    print(f"{'dtype':>5} {'path':>14} {'case':>15} {'in GB/s':>8} {'out GB/s':>9}")
    for dtype_name in args.dtypes.split(","):
        kv, pool, per_block, setup_s = build(args, dtype_name)
        results[f"{dtype_name}_pool"] = {"bytes_per_block": per_block, "num_host_blocks": pool.num_blocks,
                                         "setup_seconds": setup_s,
                                         "device_pointer_equal": pool.device_pointer_equal}
        print(f"{dtype_name}: {per_block / 2**20:.2f} MiB per block, host pool {pool.num_blocks} blocks "
              f"({pool.nbytes / 2**30:.1f} GiB, registered in {setup_s:.1f} s); mapped device pointer "
              f"== host pointer: {pool.device_pointer_equal}")
        check(pool, kv, rng)
        n, nbytes = args.num_blocks, args.num_blocks * per_block * args.repeats
        cases = {
            "random": [(rng.sample(range(pool.num_blocks), n), rng.sample(range(len(kv[0].k)), n))
                       for _ in range(args.repeats + 1)],
            "consecutive": [(list(range(s, s + n)), list(range(d, d + n)))
                            for s, d in ((rng.randrange(pool.num_blocks - n), rng.randrange(len(kv[0].k) - n))
                                         for _ in range(args.repeats + 1))],
        }
        paths = []
        for mode in args.modes.split(","):
            chunks = args.chunk_bytes.split(",") if mode == "kernel" else [None]
            paths += [(mode, int(c) if c else None) for c in chunks]
        for mode, chunk in paths:
            pool.set_copy_mode(mode)
            pool.chunk_bytes = chunk
            for case, pairs in cases.items():
                timed(pool, pairs[:1], False), timed(pool, pairs[:1], True)  # warm-up (compiles)
                rate_in = nbytes / timed(pool, pairs[1:], False) / 1e9
                rate_out = nbytes / timed(pool, pairs[1:], True) / 1e9
                name = mode + (f"/{chunk // 1024}KiB" if chunk else "")
                print(f"{dtype_name:>5} {name:>14} {case:>15} {rate_in:8.1f} {rate_out:9.1f}")
                results["rows"].append({"dtype": dtype_name, "path": mode, "chunk_bytes": chunk, "case": case,
                                        "blocks_per_swap": n, "in_GBps": rate_in, "out_GBps": rate_out})
        # the link itself: one contiguous pinned <-> device copy of the same bytes
        src = pool.host[0].view(-1)[: n * per_block // pool.host[0].element_size()]
        dst = torch.empty_like(src, device=args.device)
        dst.copy_(src, non_blocking=True)
        _sync()
        t = time.perf_counter()
        for _ in range(args.repeats):
            dst.copy_(src, non_blocking=True)
        _sync()
        h2d = nbytes / (time.perf_counter() - t) / 1e9
        t = time.perf_counter()
        for _ in range(args.repeats):
            src.copy_(dst, non_blocking=True)
        _sync()
        d2h = nbytes / (time.perf_counter() - t) / 1e9
        print(f"{dtype_name:>5} {'memcpy':>14} {'contiguous':>15} {h2d:8.1f} {d2h:9.1f}")
        results["rows"].append({"dtype": dtype_name, "path": "memcpy", "case": "contiguous",
                                "in_GBps": h2d, "out_GBps": d2h})
        del dst, src, pool, kv
        torch.cuda.empty_cache()
    write_json(args.out, {"args": vars(args), **results})
    return 0


if __name__ == "__main__":
    sys.exit(main())
