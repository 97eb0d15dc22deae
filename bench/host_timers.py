"""`HostTimers`: wall-clock timers around named functions of the engine and its sampler, for one
timed run (`bench/throughput.py --host-timers`). Each one's calls, seconds, ms a step and µs a call.

Why: cProfile slows every Python call, so where the host and the device are close it misstates
where a step's host time goes. A timer around a few dozen functions adds well under a
microsecond a call. On an H200 with int8 KV (2026-12-01, f23eb9f, penalties) it put
`philox_uniforms` (the uniforms' launch, since folded into `random_columns`) at 91 µs a call
inside the engine, against 19 µs alone. That led to the text thread's GIL take-over
(bench/RESULTS.md, "Request kinds"). Launches are asynchronous, so a function's time is its
host time: Python, torch's dispatch, Triton's launcher, and any wait.
Times are inclusive: a timed function that calls another counts both.

Owns: replacing each named function or method with its timed wrapper, and each module of the
package that imported such a function by name. On exit it restores every one of them. Bench
only: nothing under worker/ imports it.
"""

from __future__ import annotations

import functools
import importlib
import sys
import time

# (module, qualified name) of what `bench/throughput.py --host-timers` times
TARGETS = [
    ("infer_cluster.worker.engine.engine", "DynamicEngine.step"),
    ("infer_cluster.worker.engine.engine", "DynamicEngine._schedule_next"),
    ("infer_cluster.worker.engine.engine", "DynamicEngine._launch"),
    ("infer_cluster.worker.engine.engine", "DynamicEngine._collect"),
    ("infer_cluster.worker.engine.engine", "DynamicEngine._emit_all"),
    ("infer_cluster.worker.engine.inflight", "LaunchedStep.wait"),
    ("infer_cluster.worker.runner.model_runner", "ModelRunner.execute"),
    ("infer_cluster.worker.runner.graph_inputs", "GraphInputs.stage"),
    ("infer_cluster.worker.sched.scheduler", "Scheduler.schedule"),
    ("infer_cluster.worker.sched.scheduler", "Scheduler.update"),
    ("infer_cluster.worker.text.text_stage", "TextStage.process"),
    ("infer_cluster.worker.text.logprob_rows", "resolve_logprobs"),
    ("infer_cluster.worker.sampling.sampler", "Sampler.classify"),
    ("infer_cluster.worker.sampling.sampler", "Sampler.draw"),
    ("infer_cluster.worker.sampling.sampler", "Sampler.finish"),
    ("infer_cluster.worker.sampling.sampler", "Sampler._penalise"),
    ("infer_cluster.worker.sampling.random_params", "random_params"),
    ("infer_cluster.worker.sampling.random_params", "random_plan"),
    ("infer_cluster.worker.sampling.sampler", "Sampler._graph_draw"),
    ("infer_cluster.worker.sampling.state", "SamplingState.entry"),
    ("infer_cluster.worker.sampling.state", "SamplingState.apply_penalties"),
    ("infer_cluster.worker.sampling.state", "SamplingState.append"),
    ("infer_cluster.worker.sampling.ops", "draw_random_rows"),
    ("infer_cluster.worker.sampling.logprob_pack", "lse_and_block_maxima"),
    ("infer_cluster.worker.sampling.logprob_pack", "logprob_pack"),
    ("infer_cluster.worker.device.upload", "dma_upload"),
    ("infer_cluster.kernels.sample", "candidate_draw"),
    ("infer_cluster.kernels.sample", "full_draw"),
    ("infer_cluster.kernels.sample", "random_columns"),
    ("infer_cluster.kernels.sample", "float32_copy"),
    ("infer_cluster.kernels.sample", "apply_penalties"),
    ("infer_cluster.kernels.sample", "append_tokens"),
    ("infer_cluster.kernels.sample", "topk_select"),
    ("infer_cluster.kernels.row_stats", "block_maxima"),
    ("infer_cluster.kernels.argmax", "row_argmax"),
]
STEP = "DynamicEngine.step"  # the per-step figures divide by its calls


class HostTimers:
    def __init__(self, targets=TARGETS, package: str = "infer_cluster"):
        self.targets = list(targets)
        self.package = package
        self.records: dict[str, list] = {}   # name -> [calls, seconds]
        self._undo: list = []                # (owner, attribute, original)

    def __enter__(self) -> "HostTimers":
        wrapped = {}  # id(original) -> wrapper
        for module, qualname in self.targets:
            owner = importlib.import_module(module)
            *path, attr = qualname.split(".")
            for part in path:
                owner = getattr(owner, part)
            original = owner.__dict__[attr] if isinstance(owner, type) else getattr(owner, attr)
            wrapper = self._wrap(qualname, original)
            self._undo.append((owner, attr, original))
            setattr(owner, attr, wrapper)
            wrapped[id(original)] = wrapper
        for name, mod in list(sys.modules.items()):  # names imported with `from x import f`
            if mod is None or not (name == self.package or name.startswith(self.package + ".")):
                continue
            for attr, value in list(vars(mod).items()):
                wrapper = wrapped.get(id(value))
                if wrapper is not None and value is not wrapper:
                    self._undo.append((mod, attr, value))
                    setattr(mod, attr, wrapper)
        return self

    def __exit__(self, *exc) -> None:
        for owner, attr, original in reversed(self._undo):
            setattr(owner, attr, original)
        self._undo.clear()

    def _wrap(self, name: str, fn):
        record = self.records.setdefault(name, [0, 0.0])
        clock = time.perf_counter

        @functools.wraps(fn)
        def timed(*args, **kwargs):
            t = clock()
            try:
                return fn(*args, **kwargs)
            finally:
                record[0] += 1
                record[1] += clock() - t
        return timed

    def table(self) -> list[dict]:
        """The timed functions that ran, slowest first: calls, seconds, ms a step, µs a call."""
        steps = self.records.get(STEP, [0])[0] or 1
        rows = [{"name": name, "calls": calls, "seconds": round(sec, 4),
                 "ms_per_step": round(sec / steps * 1e3, 4), "us_per_call": round(sec / calls * 1e6, 1)}
                for name, (calls, sec) in self.records.items() if calls]
        return sorted(rows, key=lambda r: -r["seconds"])

    def print(self, title: str) -> None:
        steps = self.records.get(STEP, [0])[0]
        print(f"--- host timers, {title} ({steps} engine steps; inclusive wall-clock time)")
        print(f"{'function':<36}{'calls':>9}{'s':>9}{'ms/step':>10}{'us/call':>10}")
        for r in self.table():
            print(f"{r['name']:<36}{r['calls']:>9}{r['seconds']:>9.3f}{r['ms_per_step']:>10.3f}"
                  f"{r['us_per_call']:>10.1f}")
