"""What the GPU did over a profiled window: busy time per stream, copies, overlap and gaps.

Reads a Chrome trace written by `torch.profiler` (`prof.export_chrome_trace`) and sums, per
CUDA stream, the union of its kernel and memcpy intervals; the bytes and time of host<->device
copies; how long the busiest (compute) stream sat idle in gaps of at least `--gap-ms`; how much
of the copy time overlapped compute; and the host time spent inside CUDA runtime calls that can
block (synchronize, event waits, memcpy). Used by bench/host_tier.py `--trace` to see whether
host-tier copies overlap the forward or stall it.

  python bench/gpu_timeline.py trace.json [--gap-ms 0.5] [--top 12] [--json summary.json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections import defaultdict

_BLOCKING_CALLS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize",
                   "cudaMemcpyAsync", "cudaMemcpy", "cudaStreamWaitEvent", "cudaGraphLaunch",
                   "cudaLaunchKernel", "cuLaunchKernel", "cudaHostRegister")


def _union(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    merged: list[list[float]] = []
    for s, e in sorted(intervals):
        if merged and s <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], e)
        else:
            merged.append([s, e])
    return [(s, e) for s, e in merged]


def _length(intervals) -> float:
    return sum(e - s for s, e in intervals)


def _intersection(a, b) -> float:
    i = j = 0
    total = 0.0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if hi > lo:
            total += hi - lo
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total


def summarise(trace: dict, gap_ms: float = 0.5, top_kernels: int = 12) -> dict:
    """Times in ms; `top_kernels`: how many of the compute stream's costliest kernels to list. `trace` is the parsed Chrome trace (timestamps in us)."""
    events = [e for e in trace.get("traceEvents", []) if e.get("ph") == "X" and "dur" in e]
    gpu = [e for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    per_stream: dict[str, list] = defaultdict(list)
    kinds: dict[str, dict] = defaultdict(lambda: defaultdict(float))
    copies: dict[str, dict] = defaultdict(lambda: {"ms": 0.0, "bytes": 0.0, "count": 0})
    for e in gpu:
        stream = str(e.get("args", {}).get("stream", e.get("tid")))
        s, d = float(e["ts"]), float(e["dur"])
        per_stream[stream].append((s, s + d))
        kinds[stream][e["cat"]] += d / 1e3
        if e["cat"] == "gpu_memcpy":
            name = e.get("name", "memcpy")
            c = copies[name]
            c["ms"] += d / 1e3
            c["bytes"] += float(e.get("args", {}).get("bytes", 0) or 0)
            c["count"] += 1
    if not gpu:
        return {"error": "no GPU events in the trace"}
    start = min(s for iv in per_stream.values() for s, _ in iv)
    end = max(e for iv in per_stream.values() for _, e in iv)
    unions = {k: _union(v) for k, v in per_stream.items()}
    compute = max(unions, key=lambda k: kinds[k].get("kernel", 0.0))
    cu = unions[compute]
    gaps = [(b[0] - a[1]) / 1e3 for a, b in zip(cu, cu[1:]) if (b[0] - a[1]) / 1e3 >= gap_ms]
    by_name: dict[str, list] = defaultdict(lambda: [0.0, 0])
    for e in gpu:
        if e["cat"] == "kernel" and str(e.get("args", {}).get("stream", e.get("tid"))) == compute:
            entry = by_name[e.get("name", "?")[:70]]
            entry[0] += float(e["dur"]) / 1e3
            entry[1] += 1
    top = sorted(by_name.items(), key=lambda kv: -kv[1][0])[:top_kernels]
    from bench.step_kernels import family
    families: dict[str, float] = defaultdict(float)
    for name, (ms, _) in by_name.items():
        families[family(name)] += ms
    causes = _gap_causes(events, gpu, compute)
    copy_iv = _union([(float(e["ts"]), float(e["ts"]) + float(e["dur"])) for e in gpu if e["cat"] == "gpu_memcpy"])
    host = defaultdict(lambda: {"ms": 0.0, "count": 0, "max_ms": 0.0})
    for e in events:
        if e.get("cat") == "cuda_runtime" or e.get("cat") == "cuda_driver":
            name = e.get("name", "")
            if name in _BLOCKING_CALLS:
                h = host[name]
                h["ms"] += float(e["dur"]) / 1e3
                h["count"] += 1
                h["max_ms"] = max(h["max_ms"], float(e["dur"]) / 1e3)
    return {
        "window_ms": (end - start) / 1e3,
        "compute_stream": compute,
        "streams": {k: {"busy_ms": _length(v) / 1e3, **{c: round(ms, 3) for c, ms in kinds[k].items()}}
                    for k, v in unions.items()},
        "compute_idle_ms": ((end - start) - _length(cu)) / 1e3,
        "compute_gaps": {"min_gap_ms": gap_ms, "count": len(gaps), "total_ms": sum(gaps),
                         "largest_ms": sorted(gaps, reverse=True)[:10]},
        "copies": {k: {**v, "GB_per_s": (v["bytes"] / 1e9) / (v["ms"] / 1e3) if v["ms"] else None}
                   for k, v in copies.items()},
        "copy_busy_ms": _length(copy_iv) / 1e3,
        "copy_overlapping_compute_ms": _intersection(copy_iv, cu) / 1e3,
        "host_runtime_calls": {k: dict(v) for k, v in host.items()},
        "top_compute_kernels": [{"name": k, "ms": round(v[0], 3), "count": v[1]} for k, v in top],
        "compute_families_ms": {k: round(v, 3) for k, v in sorted(families.items(), key=lambda kv: -kv[1])},
        "gap_causes": causes,
    }


def _gap_causes(events, gpu, compute: str, min_gap_ms: float = 0.2) -> dict:
    """Why the compute stream sat idle: for each gap of at least `min_gap_ms`, the op that
    ended it and the host call that queued that op (matched by correlation id). Queued after the
    gap began, that part of the gap is the host's ("host_late"); the rest the op waited on the
    device (an event from another stream, or a copy engine busy with other copies: "queued"),
    by op name."""
    launches = {}
    for e in events:
        if e.get("cat") in ("cuda_runtime", "cuda_driver"):
            corr = e.get("args", {}).get("correlation")
            if corr is not None:
                launches[corr] = float(e["ts"])
    ops = sorted((e for e in gpu if str(e.get("args", {}).get("stream", e.get("tid"))) == compute),
                 key=lambda e: float(e["ts"]))
    out = {"host_late": {"count": 0, "ms": 0.0}, "queued": {"count": 0, "ms": 0.0, "by_next_op": {}},
           "largest": []}
    threshold = min_gap_ms * 1e3  # us
    end = None
    prev_name = None
    pairs: dict[str, list] = {}
    for e in ops:
        ts, dur = float(e["ts"]), float(e["dur"])
        if end is not None and ts - end >= threshold:
            gap = (ts - end) / 1e3
            queued_at = launches.get(e.get("args", {}).get("correlation"), end)
            late = min(gap, max(0.0, (queued_at - end) / 1e3))  # the host had not queued it yet
            if late > 0:
                out["host_late"]["count"] += 1
                out["host_late"]["ms"] += late
            if gap - late > 0:  # queued, yet it waited on the device
                q = out["queued"]
                q["count"] += 1
                q["ms"] += gap - late
                name = e.get("name", "?")[:50]
                entry = q["by_next_op"].setdefault(name, [0, 0.0])
                entry[0] += 1
                entry[1] += gap - late
            out["largest"].append((round(gap, 3), round(late, 3), str(prev_name)[:40], e.get("name", "?")[:40]))
        if end is not None and ts - end >= 20:  # every gap of 20 us or more, by the ops around it
            key = f"{str(prev_name)[:36]} -> {e.get('name', '?')[:36]}"
            pair = pairs.setdefault(key, [0, 0.0])
            pair[0] += 1
            pair[1] += (ts - end) / 1e3
        if end is None or ts + dur >= end:
            prev_name = e.get("name", "?")
        end = ts + dur if end is None else max(end, ts + dur)
    q = out["queued"]
    q["by_next_op"] = dict(sorted(q["by_next_op"].items(), key=lambda kv: -kv[1][1])[:6])
    out["largest"] = sorted(out["largest"], reverse=True)[:12]  # (gap ms, host-late ms, op before, op after)
    out["gaps_by_ops"] = dict(sorted(pairs.items(), key=lambda kv: -kv[1][1])[:10])  # >= 20 us
    return out


def print_summary(s: dict) -> None:
    if "error" in s:
        print(s["error"])
        return
    print(f"window {s['window_ms']:.1f} ms; compute stream {s['compute_stream']} idle "
          f"{s['compute_idle_ms']:.1f} ms; gaps >= {s['compute_gaps']['min_gap_ms']} ms: "
          f"{s['compute_gaps']['count']} totalling {s['compute_gaps']['total_ms']:.1f} ms "
          f"(largest {', '.join(f'{g:.2f}' for g in s['compute_gaps']['largest_ms'][:5])})")
    for k, v in s["streams"].items():
        print(f"  stream {k}: " + ", ".join(f"{a} {b:.1f}" if isinstance(b, float) else f"{a} {b}"
                                          for a, b in v.items()))
    for k, v in s["copies"].items():
        rate = f"{v['GB_per_s']:.1f} GB/s" if v["GB_per_s"] else "-"
        print(f"  {k}: {v['count']} copies, {v['bytes'] / 1e9:.2f} GB, {v['ms']:.1f} ms ({rate})")
    print(f"  copies busy {s['copy_busy_ms']:.1f} ms, of which overlapping compute "
          f"{s['copy_overlapping_compute_ms']:.1f} ms")
    for k, v in sorted(s["host_runtime_calls"].items(), key=lambda kv: -kv[1]["ms"]):
        print(f"  host in {k}: {v['ms']:.1f} ms over {v['count']} calls (max {v['max_ms']:.2f})")
    gc = s.get("gap_causes")
    if gc:
        print(f"  compute idle gaps: host late {gc['host_late']['count']} ({gc['host_late']['ms']:.1f} ms), "
              f"queued on the device {gc['queued']['count']} ({gc['queued']['ms']:.1f} ms): "
              + ", ".join(f"{n} {c}x {ms:.1f} ms" for n, (c, ms) in gc["queued"]["by_next_op"].items()))
    fams = s.get("compute_families_ms")
    if fams:
        busy = sum(fams.values()) or 1.0
        print("  compute kernels by family: " + ", ".join(f"{k} {v:.1f} ms ({v / busy:.0%})" for k, v in fams.items()))
    for k, (c, ms) in (gc or {}).get("gaps_by_ops", {}).items():
        print(f"  gaps >= 20 us {ms:8.1f} ms {c:6d}x  {k}")
    for g in (gc or {}).get("largest", [])[:8]:
        print(f"  gap {g[0]:.2f} ms (host late {g[1]:.2f}): after {g[2]} -> {g[3]}")
    for k in s.get("top_compute_kernels", []):
        print(f"  kernel {k['ms']:9.1f} ms {k['count']:6d}x  {k['name']}")


class ProfileWindow:
    """Profile the block with torch.profiler when `trace_dir` is set (a no-op otherwise); on exit
    write the Chrome trace as DIR/NAME.json, print its summary and save it as NAME.summary.json.
    Used by bench/host_tier.py and bench/throughput.py `--trace`."""

    def __init__(self, trace_dir, name: str):
        self.trace_dir, self.name, self.prof = trace_dir, name, None

    def __enter__(self):
        if self.trace_dir:
            import torch
            from torch.profiler import ProfilerActivity, profile
            # CUDA only: recording CPU ops too would slow the host 2x (without a GPU: CPU ops)
            cuda = torch.cuda.is_available()
            self.prof = profile(activities=[ProfilerActivity.CUDA if cuda else ProfilerActivity.CPU])
            self.prof.__enter__()
        return self

    def __exit__(self, *exc):
        if self.prof is None:
            return False
        self.prof.__exit__(*exc)
        os.makedirs(self.trace_dir, exist_ok=True)
        path = os.path.join(self.trace_dir, f"{self.name}.json")
        self.prof.export_chrome_trace(path)
        with open(path) as f:
            summary = summarise(json.load(f))
        print(f"--- GPU timeline, {self.name}")
        print_summary(summary)
        with open(path.replace(".json", ".summary.json"), "w") as f:
            json.dump(summary, f, indent=1)
        return False


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("trace")
    ap.add_argument("--gap-ms", type=float, default=0.5)
    ap.add_argument("--top", type=int, default=12, help="how many of the costliest compute kernels to list")
    ap.add_argument("--json", default=None, metavar="PATH", help="also write the summary as JSON")
    args = ap.parse_args(argv)
    with open(args.trace) as f:
        s = summarise(json.load(f), args.gap_ms, args.top)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(s, f, indent=1)
    print_summary(s)
    return 0


if __name__ == "__main__":
    sys.exit(main())
