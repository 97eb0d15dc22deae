"""Host-side timeline of a scheduler: where each request's time goes and what each step ran.

Owns: `SchedTimeline(scheduler)`, a context manager that wraps one `Scheduler` instance's
methods (never the class) with wall-clock recorders, and `summary()`:
  * per request: admitted (its host-tier load issued) -> load landed -> first computed step ->
    finished, as mean milliseconds of each phase;
  * per `schedule` call: rows computed, loads in flight, requests waiting for a load, and the
    share of steps with no load in flight (the copy stream idle, as far as the host knows);
  * blocking waits (`wait_load`) and their time;
  * with `engine` (CUDA only), GPU time per step: CUDA events around each step's launch
    (forward + draw) give its device time and the device's idle time between steps, split by
    step kind (decode-only or with prefill rows).
Used by bench/host_tier.py `--timeline` to see why the tier-on run is slower than its copies.
Bench-only instrumentation: restores the instance on exit; the engine never imports it.
To extend: wrap another method in `__enter__` (`_wrap(name, before=, after=)`) and add its
figures to `summary()`.
"""

from __future__ import annotations

import time
from statistics import mean


_ABSENT = object()


class SchedTimeline:
    def __init__(self, scheduler, engine=None):
        self.s = scheduler
        self.engine = engine if engine is not None and engine.runner.device.type == "cuda" else None
        self.gpu_steps: list = []  # (decode only, rows, start event, end event)
        self.t0 = time.perf_counter()
        self.admit, self.land, self.first, self.finish = {}, {}, {}, {}
        self.steps: list[tuple[float, int, int, int, int]] = []
        self.wait_time = 0.0
        self.num_waits = 0
        self._saved = []

    def _wrap(self, name, before=None, after=None):
        fn = getattr(self.s, name)
        self._save(name)

        def wrapped(*a, **k):
            if before:
                before(*a, **k)
            res = fn(*a, **k)
            if after:
                after(res, *a, **k)
            return res
        setattr(self.s, name, wrapped)

    def __enter__(self):
        now = time.perf_counter
        s = self.s

        def on_wait_for(req, loads):
            self.admit.setdefault(req.request_id, now())

        def before_land(landed):  # members are gone after the call: read them first
            t = now()
            for load in list(landed):
                for rid in s.loads.members.get(load, ()):
                    self.land.setdefault(rid, t)

        def on_emit(res, req, num_new, out):
            self.first.setdefault(req.request_id, now())

        def on_finish(res, req, *a, **k):
            self.finish.setdefault(req.request_id, now())

        def on_schedule(out, *a, **k):
            rows = len(out.requests)
            self.steps.append((now(), rows, out.num_batched_tokens, len(s.loads.members), len(s.loads.waits)))

        wait_load = s.wait_load

        def timed_wait(load):
            t = now()
            wait_load(load)
            self.wait_time += now() - t
            self.num_waits += 1

        self._wrap("_wait_for", before=on_wait_for)
        self._wrap("_land", before=before_land)
        self._wrap("_emit", after=on_emit)
        self._wrap("finish", after=on_finish)
        self._wrap("schedule", after=on_schedule)
        self._save("wait_load")
        s.wait_load = timed_wait
        if self.engine is not None:
            import torch
            inflight = self.engine._inflight
            launch = inflight.launch

            def timed_launch(out, *a, **k):
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                res = launch(out, *a, **k)
                end.record()
                decode = all(len(r.token_ids) == 1 for r in out.requests)
                self.gpu_steps.append((decode, len(out.requests), start, end))
                return res
            inflight.launch = timed_launch
        return self

    def _save(self, name):
        """Remember what the scheduler's own __dict__ holds under `name` (an instance attribute,
        such as `wait_load`, must come back; a method wrapper is only removed)."""
        self._saved.append((name, self.s.__dict__.get(name, _ABSENT)))

    def __exit__(self, *exc):
        for name, old in reversed(self._saved):
            if old is _ABSENT:
                self.s.__dict__.pop(name, None)
            else:
                self.s.__dict__[name] = old
        self._saved.clear()
        if self.engine is not None:
            self.engine._inflight.__dict__.pop("launch", None)
        return False

    def gpu_summary(self) -> dict:
        """Device ms per step kind and the device's idle ms between steps (call after a sync);
        `by_kind_and_rows`: the same per (step kind, rows bucket), with the idle time just before
        those steps (the device waiting for the host to queue them)."""
        if not self.gpu_steps:
            return {}
        busy = {True: [], False: []}
        buckets: dict = {}
        idle = 0.0
        prev_end = None
        for decode, rows, start, end in self.gpu_steps:
            ms = start.elapsed_time(end)
            gap = max(0.0, prev_end.elapsed_time(start)) if prev_end is not None else 0.0
            busy[decode].append(ms)
            idle += gap
            size = ">=128" if rows >= 128 else "32-127" if rows >= 32 else "<32"
            b = buckets.setdefault(f"{'decode' if decode else 'mixed'} rows {size}", [0, 0.0, 0.0])
            b[0], b[1], b[2] = b[0] + 1, b[1] + ms, b[2] + gap
            prev_end = end
        span = self.gpu_steps[0][2].elapsed_time(self.gpu_steps[-1][3])
        return {"by_kind_and_rows": {k: {"steps": n, "busy_ms": round(ms, 1), "idle_before_ms": round(gap, 1)}
                                     for k, (n, ms, gap) in sorted(buckets.items())},
                "steps_decode": len(busy[True]), "steps_mixed": len(busy[False]),
                "ms_per_decode_step": round(mean(busy[True]), 3) if busy[True] else None,
                "ms_per_mixed_step": round(mean(busy[False]), 3) if busy[False] else None,
                "gpu_step_ms_total": round(sum(busy[True]) + sum(busy[False]), 1),
                "gpu_idle_between_steps_ms": round(idle, 1), "span_ms": round(span, 1)}

    def summary(self) -> dict:
        def phase(a, b):
            d = [1e3 * (b[r] - a[r]) for r in a if r in b]
            return round(mean(d), 2) if d else None
        loaded = {r for r in self.admit}
        steps = self.steps
        rows = [s[1] for s in steps if s[1]]
        out = {
            "requests": len(self.finish), "loaded_requests": len(loaded),
            "ms_admit_to_land": phase(self.admit, self.land),
            "ms_land_to_first_step": phase({r: t for r, t in self.land.items() if r in self.first}, self.first),
            "ms_first_step_to_finish": phase({r: t for r, t in self.first.items() if r in loaded}, self.finish),
            "ms_admit_to_finish": phase(self.admit, self.finish),
            "steps": len(steps), "mean_rows_per_step": round(mean(rows), 2) if rows else 0,
            "share_steps_no_load_in_flight": round(sum(1 for s in steps if s[3] == 0) / max(len(steps), 1), 3),
            "mean_loads_in_flight": round(mean(s[3] for s in steps), 2) if steps else 0,
            "mean_requests_waiting_for_loads": round(mean(s[4] for s in steps), 2) if steps else 0,
            "load_waits": self.num_waits, "load_wait_s": round(self.wait_time, 3),
        }
        if len(steps) > 1:
            out["ms_per_schedule"] = round(1e3 * (steps[-1][0] - steps[0][0]) / (len(steps) - 1), 3)
        return out
