"""Waits for the device that a failed rank group cannot hang.

Owns: `wait_event` (block until a CUDA event ran, or give up when a check says the group
failed), `drained` (the same for the work queued so far on a device's stream), `StuckWatch`
(rank 0's device under a group whose failure may leave it stuck: the check for the waits and
the one bounded drain after a failure) and `keep_until_exit` (device state that must never be
freed).

Why: with the tensor-parallel all-reduce on torch's symmetric memory
(`INFER_CLUSTER_TP_ALLREDUCE`, worker/distributed/symm_allreduce.py) a rank waits for its peers
inside a kernel, at a signal-pad barrier. When a peer dies, that kernel never ends and the NCCL
abort does not reach it, so every later kernel on rank 0's stream waits behind it. A blocking
`Event.synchronize()` or `torch.cuda.synchronize()` then never returns, and rank 0 lives in the
engine's own process (docs/parallel.md, "Failure handling"). The runner hands its failure check
(`StuckWatch.gave_up`, as `DistributedRunner.wait_gave_up`) to the waits on its steps. Those
waits poll the event. They return once the event ran, or as soon as the check is true. Runners whose device always drains
(one GPU; NCCL, whose abort ends its kernels) pass no check and keep the blocking wait.

A device that did not drain keeps its state: freeing a graph, a symmetric buffer or a process
group synchronizes the device or waits for its kernels, which would hang the caller. The runner
gives such state to `keep_until_exit`, so neither a later garbage collection nor the interpreter's
teardown frees it (torch frees a symmetric buffer with a `cudaDeviceSynchronize()`, and a process
group that was not aborted aborts its communicators); the driver reclaims the device when the
process ends.

Must never: hold the GIL between polls (the rank monitor thread records the failure), or call
anything that synchronizes the device.
To extend: a new blocking wait on a rank group's device goes through `wait_event`.
"""

from __future__ import annotations

import ctypes
import logging
import time
from typing import Callable, Optional

import torch

log = logging.getLogger(__name__)


def wait_event(event: torch.cuda.Event, gave_up: Optional[Callable[[], bool]] = None,
               timeout_s: Optional[float] = None) -> bool:
    """Block until `event` ran; True then. With `gave_up` or `timeout_s`, poll instead and
    return False once `gave_up()` is true or `timeout_s` passed without the event running."""
    if gave_up is None and timeout_s is None:
        event.synchronize()
        return True
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while not event.query():
        if gave_up is not None and gave_up():
            return False
        if deadline is not None and time.monotonic() > deadline:
            return False
        time.sleep(0)  # releases the GIL: the monitor thread may record the failure
    return True


def drained(device: torch.device, timeout_s: Optional[float] = None,
            gave_up: Optional[Callable[[], bool]] = None) -> bool:
    """Whether the work queued so far on `device`'s current stream finishes (`wait_event`'s
    rules: within `timeout_s`, before `gave_up()`; blocking with neither)."""
    event = torch.cuda.Event()
    event.record(torch.cuda.current_stream(device))
    return wait_event(event, gave_up, timeout_s)


class StuckWatch:
    """Rank 0's device under a rank group. `may_get_stuck` (CUDA with a symmetric-memory
    all-reduce): `gave_up` is the group's failure check `failed` for the waits on its steps,
    else None (the waits block). `settled()` after a failure: whether the device finished its
    queued work, checked once, for up to `drain_s`; `stuck` is True once it did not."""

    def __init__(self, device: Optional[torch.device] = None, may_get_stuck: bool = False,
                 failed: Optional[Callable[[], bool]] = None, drain_s: float = 0.0):
        self.gave_up = failed if may_get_stuck else None
        self.stuck = False
        self._device, self._drain_s = device, drain_s
        self._checked = False

    def settled(self) -> bool:
        if self.gave_up is None:
            return True
        if not self._checked:
            self._checked = True
            self.stuck = not drained(self._device, self._drain_s)
            if self.stuck:
                log.error("rank 0's device did not finish its queued work within %g s of the "
                          "failure (a symmetric-memory all-reduce waits for the dead rank); its "
                          "graphs, process group and buffers stay until this process exits, which "
                          "should be through os._exit (a normal exit may abort in torch's NCCL "
                          "watchdog)", self._drain_s)
        return not self.stuck


def keep_until_exit(obj) -> None:
    """Never free `obj` (a runner's shard, torch's process-group registry: state on a stuck
    device), not even at interpreter exit: one reference is added that nothing removes."""
    if obj is not None:
        ctypes.pythonapi.Py_IncRef(ctypes.py_object(obj))
