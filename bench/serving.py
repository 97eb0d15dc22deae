"""Serving benchmark: the cluster (client -> coordinator -> replica) vs the offline engine.

Runs, in one process and one run, the same workload (token-id prompts, lengths uniform in a
range, greedy, ignore_eos):
  1. offline: `worker.LLM.generate` in this process (the baseline);
  2. cluster: a coordinator and --replicas replica processes on loopback, every request
     submitted at once through `InferenceClient`.
Throughput ratio = cluster output tokens/s / (offline tokens/s x replicas); goal >= 0.95 with
one replica (the cluster adds sockets, not compute).
Added latency: the same single-token request one at a time, cluster end-to-end minus offline
(`add_request` + `step` until it ends), p50 over --latency-samples; and the same for the time
per output token of one long stream.
Offline and cluster runs alternate for --rounds (never at the same time, so both see the same
machine load; medians are reported); each engine uses --threads torch threads. Prints one table
and writes JSON.

    python bench/serving.py --num-requests 200 --input-len 16:64 --output-len 16:64
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import socket
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from infer_cluster.loadgen import Workload, format_table, parse_range, run_load, summarize  # noqa: E402
from infer_cluster.protocol import SamplingParams  # noqa: E402


def _proc_cpu_seconds(pid: int) -> float:
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def _self_cpu_seconds() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _engine_options(args) -> dict:
    return {"model": args.model, "num_kv_blocks": args.num_kv_blocks,
            "max_num_seqs": args.max_num_seqs, "max_num_batched_tokens": args.max_num_batched_tokens}


class Offline:
    """The baseline: one engine in this process."""

    def __init__(self, args):
        import torch
        from infer_cluster.worker import LLM
        torch.set_num_threads(args.threads)
        self.llm = LLM(**_engine_options(args))
        self.args = args

    def throughput(self, requests) -> tuple[float, list, float]:
        """(output tokens/s, token ids, CPU seconds used)"""
        c0, t0 = _self_cpu_seconds(), time.perf_counter()
        outs = self.llm.generate([p for p, _ in requests], [sp for _, sp in requests], use_tqdm=False)
        wall, cpu = time.perf_counter() - t0, _self_cpu_seconds() - c0
        return sum(len(o.token_ids) for o in outs) / wall, [o.token_ids for o in outs], cpu

    def one(self, prompt, max_tokens: int) -> tuple[float, float]:
        """(end-to-end seconds, seconds per output token after the first) of one request."""
        engine = self.llm.engine
        t_start = time.perf_counter()
        rid = engine.add_request(prompt, SamplingParams(temperature=0.0, max_tokens=max_tokens,
                                                        ignore_eos=True))
        t_first = None
        while True:
            ds = [d for d in engine.step() if d.request_id == rid]
            if ds and ds[0].token_ids and t_first is None:
                t_first = time.perf_counter()
            if ds and ds[-1].finished:
                t_end = time.perf_counter()
                return t_end - t_start, (t_end - t_first) / max(1, max_tokens - 1)


class Cluster:
    """Coordinator + replicas as processes on loopback, driven through one client."""

    def __init__(self, args):
        from infer_cluster.client import InferenceClient
        from infer_cluster.launcher import ClusterLauncher, python_module_argv
        port, rport = _free_port(), _free_port()
        self.address = f"tcp://127.0.0.1:{port}"
        engine_argv = []
        for k, v in _engine_options(args).items():
            if v is not None:
                engine_argv += ["--" + k.replace("_", "-"), str(v)]
        env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS=str(args.threads))
        self.launcher = ClusterLauncher(
            python_module_argv("infer_cluster", "--log-level", "WARNING", "coordinator", "--port",
                               str(port), "--replica-port", str(rport)),
            [python_module_argv("infer_cluster.worker", "--coordinator", f"tcp://127.0.0.1:{rport}", "--name",
                                f"replica-{i}", "--log-level", "WARNING", *engine_argv)
             for i in range(args.replicas)],
            self.address, log_dir=args.log_dir, env=env)
        try:
            self.launcher.start(ready_timeout=300)
            self.client = InferenceClient(self.address, name="bench")
        except BaseException:
            self.launcher.stop(drain_timeout=5)
            raise
        self.progress = args.progress

    def _cpu(self) -> tuple[float, float, float]:
        """CPU seconds so far of (replicas, coordinator, this client process)."""
        return (sum(_proc_cpu_seconds(r.proc.pid) for r in self.launcher.replicas),
                _proc_cpu_seconds(self.launcher.coordinator.proc.pid), _self_cpu_seconds())

    def throughput(self, requests) -> tuple[float, list, dict]:
        before = self._cpu()
        result = run_load(self.client, requests, progress=self.progress)
        summary = summarize(result)
        summary["cpu_s"] = dict(zip(("replicas", "coordinator", "client"),
                                    (b - a for a, b in zip(before, self._cpu()))))
        return summary["output_tokens_per_s"], [o.token_ids for o in result.outputs], summary

    def one(self, prompt, max_tokens: int) -> tuple[float, float]:
        r = run_load(self.client, [(prompt, SamplingParams(temperature=0.0, max_tokens=max_tokens,
                                                           ignore_eos=True))])
        t = r.timings[0]
        return t.e2e, t.tpot or 0.0

    def close(self) -> dict:
        status = self.client.status()
        self.client.close()
        self.launcher.stop(drain_timeout=5)
        return status


def measure(args, requests, latency_prompt) -> dict:
    """Alternate offline and cluster runs (never concurrently) so both see the same machine
    load; report medians over --rounds."""
    offline = Offline(args)
    cluster = Cluster(args)
    try:
        offline.throughput(requests[:8])  # warm-up both
        cluster.throughput(requests[:8])
        off_tps, clu_tps, summaries, off_cpu = [], [], [], []
        identical = 0
        for _ in range(args.rounds):
            tps, off_ids, cpu = offline.throughput(requests)
            off_tps.append(tps)
            off_cpu.append(cpu)
            tps, clu_ids, summary = cluster.throughput(requests)
            clu_tps.append(tps)
            summaries.append(summary)
            identical = sum(a == b for a, b in zip(off_ids, clu_ids))
        off_e2e, clu_e2e, off_tpot, clu_tpot = [], [], [], []
        for _ in range(args.latency_samples):
            off_e2e.append(offline.one(latency_prompt, 1)[0])
            clu_e2e.append(cluster.one(latency_prompt, 1)[0])
        for _ in range(3):
            off_tpot.append(offline.one(latency_prompt, args.stream_tokens)[1])
            clu_tpot.append(cluster.one(latency_prompt, args.stream_tokens)[1])
    finally:
        status = cluster.close()
    med = statistics.median
    ratios = [c / (o * args.replicas) for o, c in zip(off_tps, clu_tps)]
    return {"offline_tokens_per_s": off_tps, "cluster_tokens_per_s": clu_tps,
            "ratio_per_round": ratios, "ratio_median": med(ratios),
            # least-disturbed run of each (machines shared with other work are noisy)
            "ratio_best": max(clu_tps) / (max(off_tps) * args.replicas),
            "identical_outputs": identical, "cluster_summary": summaries[len(summaries) // 2],
            # CPU seconds per round: immune to other load on the machine, unlike wall time
            "offline_cpu_s": med(off_cpu),
            "replica_cpu_s": med([x["cpu_s"]["replicas"] for x in summaries]),
            "coordinator_cpu_s": med([x["cpu_s"]["coordinator"] for x in summaries]),
            "client_cpu_s": med([x["cpu_s"]["client"] for x in summaries]),
            "offline_e2e_1tok_ms": med(off_e2e) * 1e3, "cluster_e2e_1tok_ms": med(clu_e2e) * 1e3,
            "offline_tpot_ms": med(off_tpot) * 1e3, "cluster_tpot_ms": med(clu_tpot) * 1e3,
            "coordinator": status["coordinator"]}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="tiny-random")
    p.add_argument("--num-requests", type=int, default=200)
    p.add_argument("--input-len", default="16:64")
    p.add_argument("--output-len", default="16:64")
    p.add_argument("--replicas", type=int, default=1)
    p.add_argument("--threads", type=int, default=max(1, (os.cpu_count() or 2) - 1),
                   help="torch threads per engine, offline and each replica (default: all cores "
                        "but one, which the coordinator and the client use)")
    p.add_argument("--num-kv-blocks", type=int, default=4096)
    p.add_argument("--max-num-seqs", type=int, default=256)
    p.add_argument("--max-num-batched-tokens", type=int, default=8192)
    p.add_argument("--rounds", type=int, default=5, help="alternating offline/cluster runs")
    p.add_argument("--latency-samples", type=int, default=30)
    p.add_argument("--stream-tokens", type=int, default=64)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--log-dir", default=None)
    p.add_argument("--progress", action="store_true")
    p.add_argument("--json", default=str(REPO / "bench" / "results" / "serving.json"))
    args = p.parse_args(argv)
    work = Workload(num_requests=args.num_requests, input_len=parse_range(args.input_len),
                    output_len=parse_range(args.output_len), seed=args.seed)
    requests = work.build()
    latency_prompt = requests[0][0][:16]

    m = measure(args, requests, latency_prompt)
    cs = m["cluster_summary"]
    med = statistics.median
    rows = {
        "workload": f"{args.num_requests} requests, in {args.input_len}, out {args.output_len}, "
                    f"{args.model}, {args.threads} thread(s)/engine, {args.rounds} rounds",
        "offline tokens/s (median)": round(med(m["offline_tokens_per_s"]), 1),
        f"cluster tokens/s ({args.replicas} replica(s), median)": round(med(m["cluster_tokens_per_s"]), 1),
        "throughput ratio per round": " ".join(f"{r:.3f}" for r in m["ratio_per_round"]),
        "throughput ratio, median (goal >= 0.95)": round(m["ratio_median"], 3),
        "throughput ratio, best run vs best run": round(m["ratio_best"], 3),
        "outputs identical to offline": f"{m['identical_outputs']}/{args.num_requests}",
        "CPU s per round: offline engine / replicas": f"{m['offline_cpu_s']:.2f} / {m['replica_cpu_s']:.2f}",
        "CPU s per round: coordinator / client": f"{m['coordinator_cpu_s']:.2f} / {m['client_cpu_s']:.2f}",
        "CPU ratio offline / (replicas + coordinator)":
            round(m["offline_cpu_s"] / (m["replica_cpu_s"] + m["coordinator_cpu_s"]), 3),
        "cluster TTFT p50 / p99 ms": f"{cs['ttft_p50_ms']} / {cs['ttft_p99_ms']}",
        "cluster TPOT p50 / p99 ms": f"{cs['tpot_p50_ms']} / {cs['tpot_p99_ms']}",
        "cluster e2e p50 / p99 ms": f"{cs['e2e_p50_ms']} / {cs['e2e_p99_ms']}",
        "1-token request p50 ms (offline / cluster)":
            f"{m['offline_e2e_1tok_ms']:.2f} / {m['cluster_e2e_1tok_ms']:.2f}",
        "added latency per request ms": round(m["cluster_e2e_1tok_ms"] - m["offline_e2e_1tok_ms"], 2),
        "added latency per output token ms": round(m["cluster_tpot_ms"] - m["offline_tpot_ms"], 3),
    }
    print(format_table(rows, title="bench/serving.py: cluster vs offline engine"))
    out = {"args": vars(args), **m, "ratio": m["ratio_median"],
           "added_latency_ms": rows["added latency per request ms"],
           "added_latency_per_token_ms": rows["added latency per output token ms"]}
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(out, indent=2, default=str))
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
