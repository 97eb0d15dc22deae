"""`HostIdle`: tells the text thread when the engine's thread is idle, so that text runs then.

Why: `LLM.generate()` and a replica run text (detokenization, stop strings, logprob entries) on
a `TextWorker` thread. Python runs one thread at a time, and the engine's thread gives the GIL
away at every call that releases it. Each Triton launch releases it. A text thread that waits
for the GIL takes it there, in the middle of the step's launches, and the launches wait for it
to finish. Measured on an H200 with int8 KV (workload A, 2026-12-01, f23eb9f):
- greedy: the launch phase took 1.24 s with the text thread free, and 0.72 s with the same text
  work done on the engine's thread;
- with penalties: 2.44 s and 1.92 s.
The device waits for the host less when the text runs while the engine's thread waits anyway:
on the device, once a step, when it collects the oldest step in flight, or on the text thread
itself (`TextWorker.wait_until_behind`, `flush`).

Cost: a step's text goes out at the engine's next wait instead of at once, at most one launch
phase later (about 1 ms a 256-row step on an H200), and at most `TextWorker.IDLE_WAIT_S` later
when the engine never waits.

Owns: one flag, open while the engine's thread is inside `idle()`. A helper calls
`wait_open(timeout)` before each piece of work; the timeout bounds the delay when the engine
never waits (a host-bound step, or no requests at all), so the helper is never starved.
Must never: block the engine's thread (opening and closing the flag never waits).
"""

from __future__ import annotations

import contextlib
import threading


class HostIdle:
    def __init__(self):
        self._open = threading.Event()

    @contextlib.contextmanager
    def idle(self):
        """Open the flag for the duration of a wait of the engine's thread."""
        self._open.set()
        try:
            yield
        finally:
            self._open.clear()

    def wait_open(self, timeout: float) -> bool:
        """Block until the engine's thread is idle, or `timeout` seconds; whether it is idle."""
        return self._open.wait(timeout)
