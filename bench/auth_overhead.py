"""What CURVE authentication costs: the same workload through a cluster with auth on and off.

Starts two clusters on loopback (coordinator + --replicas replica processes each), one with
`--auth DIR` (keys from `infer-cluster keygen`, the client uses the client key) and one
without, and sends the same token-id workload (greedy, ignore_eos, all at once) through each,
alternating for --rounds so both see the same machine load. Reports, per round, output tokens/s
(wall clock) and output tokens per CPU second of every cluster process (coordinator, replicas
and this client), and the median ratios auth/off of both (goal >= 0.97). The CPU-time ratio is
the one to trust on a shared machine: other load changes wall time, not the CPU work each
token costs. Prints one table and writes JSON.

    python bench/auth_overhead.py --num-requests 200 --rounds 5
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.serving import _free_port, _proc_cpu_seconds, _self_cpu_seconds  # noqa: E402
from infer_cluster.loadgen import Workload, parse_range, run_load, summarize  # noqa: E402


class Cluster:
    def __init__(self, args, auth_dir):
        from infer_cluster.client import InferenceClient
        from infer_cluster.launcher import ClusterLauncher, python_module_argv
        port, rport = _free_port(), _free_port()
        self.address = f"tcp://127.0.0.1:{port}"
        auth = ["--auth", auth_dir] if auth_dir else []
        engine = ["--model", args.model, "--num-kv-blocks", str(args.num_kv_blocks),
                  "--max-num-seqs", str(args.max_num_seqs)]
        env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS=str(args.threads))
        env.pop("INFER_CLUSTER_AUTH", None)
        self.launcher = ClusterLauncher(
            python_module_argv("infer_cluster", "--log-level", "WARNING", "coordinator", "--port",
                               str(port), "--replica-port", str(rport), *auth),
            [python_module_argv("infer_cluster.worker", "--coordinator", f"tcp://127.0.0.1:{rport}",
                                "--name", f"replica-{i}", "--log-level", "WARNING", *auth, *engine)
             for i in range(args.replicas)],
            self.address, env=env, auth=auth_dir)
        try:
            self.launcher.start(ready_timeout=300)
            self.client = InferenceClient(self.address, name="bench", auth=auth_dir)
        except BaseException:
            self.launcher.stop(drain_timeout=5)
            raise

    def _cpu(self) -> tuple[float, float]:
        """CPU seconds so far: (coordinator, all cluster processes incl. this client)."""
        coord = _proc_cpu_seconds(self.launcher.coordinator.proc.pid)
        replicas = sum(_proc_cpu_seconds(r.proc.pid) for r in self.launcher.replicas)
        return coord, coord + replicas + _self_cpu_seconds()

    def run(self, requests) -> tuple[float, float, float]:
        """(output tokens/s, output tokens per CPU second, coordinator CPU seconds) of one
        pass over `requests`."""
        c0, t0 = self._cpu()
        result = run_load(self.client, requests)
        c1, t1 = self._cpu()
        summary = summarize(result)
        if summary["num_completed"] != len(requests):
            raise RuntimeError(f"only {summary['num_completed']} of {len(requests)} completed")
        tokens = sum(len(o.token_ids) for o in result.outputs)
        return summary["output_tokens_per_s"], tokens / (t1 - t0), c1 - c0

    def close(self) -> None:
        self.client.close()
        self.launcher.stop(drain_timeout=5)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="tiny-random")
    p.add_argument("--num-requests", type=int, default=200)
    p.add_argument("--input-len", default="16:64")
    p.add_argument("--output-len", default="16:64")
    p.add_argument("--replicas", type=int, default=1)
    p.add_argument("--threads", type=int, default=1, help="torch threads per replica")
    p.add_argument("--num-kv-blocks", type=int, default=4096)
    p.add_argument("--max-num-seqs", type=int, default=256)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default=str(REPO / "bench" / "results" / "auth_overhead.json"))
    args = p.parse_args(argv)
    requests = Workload(num_requests=args.num_requests, input_len=parse_range(args.input_len),
                        output_len=parse_range(args.output_len), seed=args.seed).build()
    with tempfile.TemporaryDirectory() as tmp:
        keys = os.path.join(tmp, "keys")
        subprocess.run([sys.executable, "-m", "infer_cluster", "keygen", keys], check=True,
                       env=dict(os.environ, PYTHONPATH=str(REPO)), stdout=subprocess.DEVNULL)
        off, on = Cluster(args, None), None
        try:
            on = Cluster(args, keys)
            for c in (off, on):
                c.run(requests[:16])  # warm-up
            rows = {"off": [], "on": []}
            for _ in range(args.rounds):
                rows["off"].append(off.run(requests))
                rows["on"].append(on.run(requests))
        finally:
            off.close()
            if on is not None:
                on.close()
    med = statistics.median
    ratios = [a[0] / b[0] for a, b in zip(rows["on"], rows["off"])]
    cpu_ratios = [a[1] / b[1] for a, b in zip(rows["on"], rows["off"])]
    result = {"args": vars(args), "tokens_per_s_off": [r[0] for r in rows["off"]],
              "tokens_per_s_auth": [r[0] for r in rows["on"]], "ratio_per_round": ratios,
              "ratio_median": med(ratios),
              "tokens_per_cpu_s_off": [r[1] for r in rows["off"]],
              "tokens_per_cpu_s_auth": [r[1] for r in rows["on"]],
              "cpu_ratio_per_round": cpu_ratios, "cpu_ratio_median": med(cpu_ratios),
              "coordinator_cpu_s_off": med(r[2] for r in rows["off"]),
              "coordinator_cpu_s_auth": med(r[2] for r in rows["on"])}
    print(f"auth overhead: {args.num_requests} requests x {args.rounds} rounds, "
          f"{args.replicas} replica(s), model {args.model}")
    print(f"  {'':28}{'off':>10}{'auth':>10}{'ratio':>8}")
    for label, key in (("output tokens/s (wall)", "tokens_per_s"),
                       ("output tokens / CPU s", "tokens_per_cpu_s")):
        off_m, on_m = med(result[f"{key}_off"]), med(result[f"{key}_auth"])
        print(f"  {label:28}{off_m:10.1f}{on_m:10.1f}{on_m / off_m:8.3f}")
    print(f"  {'coordinator CPU s / round':28}{result['coordinator_cpu_s_off']:10.3f}"
          f"{result['coordinator_cpu_s_auth']:10.3f}")
    print(f"  median of per-round ratios: wall {result['ratio_median']:.3f}, CPU "
          f"{result['cpu_ratio_median']:.3f} (goal >= 0.97; wall rounds "
          f"{', '.join(f'{r:.2f}' for r in ratios)})")
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
