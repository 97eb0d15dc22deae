"""Where one decode step's time goes at batch 1: host phases against the GPU's own time.

Drives one request (prompt `--prompt-len`, `--output-len` tokens of the `--sampling` kind)
through the offline engine's step API and splits each step's wall time into the engine's phases (schedule,
`ModelRunner.execute` = input prep + graph launch, the sampler's device half `draw`, `wait` for
the step's ids (the device sync), update, text; with `--async-scheduling on` the wait overlaps
the next step), then times the batch-1 decode CUDA graph alone with events (the GPU floor per step).
TPOT minus the graph time is what host work adds. Writes JSON.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.report import write_json  # noqa: E402
from bench.throughput import SAMPLING_KINDS, sampling_params  # noqa: E402


def _timed(obj, name, acc):
    real = getattr(obj, name)

    def wrapper(*a, **k):
        t = time.perf_counter()
        try:
            return real(*a, **k)
        finally:
            acc[name] = acc.get(name, 0.0) + time.perf_counter() - t
    setattr(obj, name, wrapper)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", default="qwen3-0.6b-shape")
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=256)
    ap.add_argument("--async-scheduling", default="auto", choices=["on", "off", "auto"])
    ap.add_argument("--sampling", default="greedy", choices=list(SAMPLING_KINDS),
                    help="the request's kind (bench/throughput.py's SAMPLING_KINDS)")
    ap.add_argument("--out", default="bench/results/step_profile.json")
    args = ap.parse_args(argv)

    import torch

    from infer_cluster.worker import LLM

    llm = LLM(args.model, load_format="dummy", dtype="bfloat16", max_num_seqs=8, num_kv_blocks=256,
              max_model_len=2048,
              async_scheduling={"on": True, "off": False, "auto": "auto"}[args.async_scheduling])
    eng = llm.engine
    params = sampling_params(args.sampling, [args.output_len], seed=0)[0]
    acc: dict[str, float] = {}
    _timed(eng.runner, "execute", acc)
    _timed(eng.sampler, "draw", acc)
    _timed(eng.scheduler, "schedule", acc)
    _timed(eng.scheduler, "update", acc)
    tpots = []
    for r in range(2):
        acc.clear()
        phases0 = dict(eng.stats()["step_seconds"])
        prompt = [(r * 131 + j * 7) % (eng.spec.vocab_size - 10) + 10 for j in range(args.prompt_len)]
        rid = llm.add_request(prompt, params)
        stamps = []
        while llm.has_unfinished_requests():
            for d in llm.step():
                if d.request_id == rid:
                    stamps.append(time.perf_counter())
        if r == 1:
            tpots = [b - a for a, b in zip(stamps[1:], stamps[2:])]
    steps = len(tpots) + 2
    per_step_us = {k: v / steps * 1e6 for k, v in acc.items()}
    per_step_us["wait (ids to host)"] = (eng.stats()["step_seconds"].get("wait", 0.0)
                                         - phases0.get("wait", 0.0)) / steps * 1e6
    graph_ms = None
    graphs = getattr(eng.runner, "graphs", None)
    if graphs is not None and 1 in graphs.graphs:
        g = graphs.graphs[1]
        for _ in range(20):
            g.replay()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
        for _ in range(200):
            g.replay()
        end.record()
        torch.cuda.synchronize()
        graph_ms = start.elapsed_time(end) / 200
    tpot = statistics.median(tpots) * 1e3
    res = {"model": args.model, "sampling": args.sampling, "async_scheduling": eng.async_scheduling, "tpot_ms_p50": tpot, "graph_replay_ms": graph_ms,
           "host_phase_us_per_step": per_step_us}
    print(f"{args.sampling}: batch-1 TPOT p50 {tpot:.3f} ms; decode graph alone {graph_ms if graph_ms is None else round(graph_ms, 3)} ms")
    print("per step (us):", {k: round(v, 1) for k, v in per_step_us.items()})
    write_json(args.out, res)
    llm.close()


if __name__ == "__main__":
    main()
