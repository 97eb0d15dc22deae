"""Host-side timeline of a scheduler: where each request's time goes and what each step ran.

Owns: `SchedTimeline(scheduler)`, a context manager that wraps one `Scheduler` instance's
methods (never the class) with wall-clock recorders, and `summary()`:
  * per request: admitted (its host-tier load issued) -> load landed -> first computed step ->
    finished, as mean milliseconds of each phase;
  * per `schedule` call: rows computed, loads in flight, requests waiting for a load, and the
    share of steps with no load in flight (the copy stream idle, as far as the host knows);
  * blocking waits (`wait_load`) and their time.
Used by bench/host_tier.py `--timeline` to see why the tier-on run is slower than its copies.
Bench-only instrumentation: restores the instance on exit; the engine never imports it.
"""

from __future__ import annotations

import time
from statistics import mean


class SchedTimeline:
    def __init__(self, scheduler):
        self.s = scheduler
        self.t0 = time.perf_counter()
        self.admit, self.land, self.first, self.finish = {}, {}, {}, {}
        self.steps: list[tuple[float, int, int, int, int]] = []
        self.wait_time = 0.0
        self.num_waits = 0
        self._saved = []

    def _wrap(self, name, before=None, after=None):
        fn = getattr(self.s, name)
        self._saved.append(name)

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
        s.wait_load = timed_wait
        self._saved.append("wait_load")
        return self

    def __exit__(self, *exc):
        for name in self._saved:
            self.s.__dict__.pop(name, None)
        return False

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
