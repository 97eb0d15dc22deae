"""How long a user waits for a GGUF model: cold (converted into an empty cache) and cached.

Each measurement is a new process, as a user's start is: it imports torch and infer_cluster,
then builds `LLM(model)` and reports both times. `cold` runs once with an empty temporary cache
(the conversion included); `cached` runs `--repeats` times over the folder that run wrote, and
the table gives their median and range. The figure of interest is `LLM(...)` ready, imports
apart; `total` adds them.

Example (the embedded real model, CPU):
  python bench/gguf_load.py --model smollm2-135m-instruct --repeats 5
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.report import run_info, write_json  # noqa: E402

_CHILD = """
import json, sys, time
started = time.perf_counter()
import torch
from infer_cluster import LLM
imported = time.perf_counter()
llm = LLM(sys.argv[1])
ready = time.perf_counter()
print(json.dumps({"import_s": imported - started, "ready_s": ready - imported,
                  "transformers_config": "transformers.models.auto.configuration_auto" in sys.modules}))
"""


def measure(model: str, cache: str) -> dict:
    env = dict(os.environ, INFER_CLUSTER_CACHE=cache)
    proc = subprocess.run([sys.executable, "-c", _CHILD, model], env=env, capture_output=True,
                          text=True, timeout=600)
    if proc.returncode != 0:
        raise SystemExit(f"the load failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2-135m-instruct",
                    help="an embedded name, a .gguf file, or a folder holding one")
    ap.add_argument("--repeats", type=int, default=5, help="cached starts to time")
    ap.add_argument("--out", default="bench/results/gguf_load.json")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="gguf-load-") as cache:
        cold = measure(args.model, cache)
        cached = [measure(args.model, cache) for _ in range(args.repeats)]
    ready = [c["ready_s"] for c in cached]
    total = [c["ready_s"] + c["import_s"] for c in cached]
    result = {**run_info(use_torch=False), "model": args.model, "cold": cold, "cached": cached,
              "cached_ready_median_s": statistics.median(ready),
              "cached_total_median_s": statistics.median(total)}
    print(f"{'start':<8} {'LLM() ready s':>14} {'with imports s':>15}")
    print(f"{'cold':<8} {cold['ready_s']:>14.2f} {cold['ready_s'] + cold['import_s']:>15.2f}")
    print(f"{'cached':<8} {statistics.median(ready):>14.2f} {statistics.median(total):>15.2f}"
          f"   (median of {len(cached)}; ready {min(ready):.2f}-{max(ready):.2f} s)")
    print("transformers' config classes imported once cached:",
          any(c["transformers_config"] for c in cached))
    write_json(args.out, result)


if __name__ == "__main__":
    main()
