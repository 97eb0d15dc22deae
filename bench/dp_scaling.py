"""Data-parallel scaling: the real cluster (`infer-cluster serve -dp N`: a coordinator and N
replica processes, one GPU each on CUDA) against one replica, with the same workload sent
through `InferenceClient`, in one run.

For each N in --dp (default 1 then 2): start `serve` as a child process on free ports, wait
for its ready line (every replica registered and warmed up), send --rounds rounds of the
workload (every request at once; the first round also warms the cluster's paths and is
reported but not timed unless --rounds 1), stop it with SIGTERM (the coordinator drains) and
make sure every process is gone. Reports output tokens/s per N and the ratio to the first N;
issue 11's target is -dp 2 >= 1.9x one replica on 2 GPUs. Writes JSON.

Two ways to size the load. By default every N gets the same --num-requests (a fixed job:
how much faster N replicas finish it). Too few requests leave each of N replicas a part batch
whose round ends with its longest request; a deep backlog makes one replica's steps mix
prefills into full decode batches. `--per-replica` sends N x --num-requests to N replicas
instead (the same load per GPU), which isolates what a replica loses to the cluster around it.

    python bench/dp_scaling.py --model qwen3-0.6b-shape --load-format dummy --dtype bfloat16 \
        --num-requests 256 --input-len 100:1024 --output-len 100:1024 --max-model-len 4096

On a CPU machine replicas share the cores (`serve` gives each its share of threads), so a
ratio there says nothing about GPUs; the CPU run checks the script end to end.
"""

from __future__ import annotations

import argparse
import json
import os
import selectors
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.report import run_info  # noqa: E402
from bench.serving import _free_port as free_port  # noqa: E402
from infer_cluster.loadgen import Workload, parse_range, run_load, summarize  # noqa: E402

READY = "infer-cluster serving"


class Cluster:
    """`infer-cluster serve` as a child process in its own process group."""

    def __init__(self, dp: int, engine_args: list[str], log_dir: Path, ready_timeout: float):
        self.port = free_port()
        self.address = f"tcp://127.0.0.1:{self.port}"
        log_dir.mkdir(parents=True, exist_ok=True)
        argv = [sys.executable, "-m", "infer_cluster", "serve", "-dp", str(dp), "--port", str(self.port),
                "--replica-port", str(free_port()), "--no-restart", "--log-dir", str(log_dir),
                "--ready-timeout", str(ready_timeout), *engine_args]
        self.proc = subprocess.Popen(argv, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True, start_new_session=True)
        self.output: list[str] = []
        self._wait_ready(ready_timeout + 30)

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        sel = selectors.DefaultSelector()
        sel.register(self.proc.stdout, selectors.EVENT_READ)
        try:
            while time.monotonic() < deadline:
                if not sel.select(timeout=1.0):
                    continue
                line = self.proc.stdout.readline()
                if not line:
                    raise RuntimeError(f"serve exited (code {self.proc.wait()}) before it was ready:\n"
                                       + "".join(self.output[-20:]))
                self.output.append(line)
                if line.startswith(READY):
                    return
            raise RuntimeError(f"serve was not ready after {timeout:g} s")
        finally:
            sel.close()

    def stop(self, timeout: float = 60.0) -> int:
        """SIGTERM (drain, then stop every child); SIGKILL the group if it outlives `timeout`."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
        try:  # children that ignored the drain (none should) go with the group
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        rest = self.proc.stdout.read() if self.proc.stdout else ""
        self.output.append(rest)
        return self.proc.returncode


def run_rounds(address: str, requests: list, rounds: int) -> list[dict]:
    from infer_cluster.client import InferenceClient
    results = []
    with InferenceClient(address, name="dp-bench", connect_timeout=30.0) as client:
        for _ in range(rounds):
            summary = summarize(run_load(client, requests))
            if summary["num_failed"]:
                raise RuntimeError(f"{summary['num_failed']} of {summary['num_requests']} requests failed")
            results.append(summary)
    return results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dp", type=int, nargs="+", default=[1, 2], help="replica counts, in run order")
    ap.add_argument("--num-requests", type=int, default=256)
    ap.add_argument("--per-replica", action="store_true",
                    help="send N x --num-requests to N replicas (the same load per replica)")
    ap.add_argument("--input-len", default="100:1024", help="prompt tokens, LO:HI (uniform)")
    ap.add_argument("--output-len", default="100:1024", help="output tokens, LO:HI (uniform, ignore_eos)")
    ap.add_argument("--token-id-range", default="10:30000")
    ap.add_argument("--rounds", type=int, default=2, help="rounds per N; the first is a warm-up when > 1")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--ready-timeout", type=float, default=600.0)
    ap.add_argument("--log-dir", default=str(REPO / "bench" / "results" / "dp_logs"))
    ap.add_argument("--out", default=str(REPO / "bench" / "results" / "dp_scaling.json"))
    args, engine_args = ap.parse_known_args()  # the rest goes to `infer-cluster serve`
    if any(n < 1 for n in args.dp) or args.rounds < 1:
        ap.error("--dp values and --rounds must be >= 1")

    def requests_for(dp: int) -> list:
        n = args.num_requests * (dp if args.per_replica else 1)
        return Workload(n, parse_range(args.input_len), parse_range(args.output_len),
                        parse_range(args.token_id_range), args.seed).build()

    runs = []
    for dp in args.dp:
        requests = requests_for(dp)
        print(f"--- -dp {dp}: {len(requests)} requests a round; starting serve {' '.join(engine_args)}",
              flush=True)
        started = time.monotonic()
        cluster = Cluster(dp, engine_args, Path(args.log_dir) / f"dp{dp}", args.ready_timeout)
        ready_s = time.monotonic() - started
        try:
            rounds = run_rounds(cluster.address, requests, args.rounds)
        finally:
            code = cluster.stop()
        timed = rounds[1:] or rounds
        best = max(timed, key=lambda r: r["output_tokens_per_s"])
        runs.append(dict(dp=dp, num_requests=len(requests), ready_s=round(ready_s, 1), rounds=rounds,
                         serve_exit_code=code,
                         serve_pid=cluster.proc.pid,
                         output_tokens_per_s=best["output_tokens_per_s"]))
        print(f"-dp {dp}: ready in {ready_s:.1f} s; output tok/s per round "
              f"{[r['output_tokens_per_s'] for r in rounds]}; serve exited {code}", flush=True)
    base = runs[0]["output_tokens_per_s"]
    for r in runs:
        r["ratio"] = round(r["output_tokens_per_s"] / base, 3)
    print(f"\n{'replicas':<10}{'requests':>9}{'output tok/s':>14}{'ratio':>8}")
    for r in runs:
        print(f"{r['dp']:<10}{r['num_requests']:>9}{r['output_tokens_per_s']:>14,.1f}{r['ratio']:>8.2f}")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(dict(bench="dp_scaling", run=run_info(use_torch=False),
                                   workload=vars(args) | dict(serve_args=engine_args), runs=runs), indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
