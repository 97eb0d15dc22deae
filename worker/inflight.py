"""`LaunchedStep`: one engine step whose forward and draw are queued on the device, and whose
sampled ids are on their way to the host.

Owns: the step's `SchedulerOutput`, the row of each sampled request, the `DeviceDraw` (its
`token_ids` feed the next step's `pending_input` rows), and the copy of the draw to the host:
into pinned memory with `non_blocking=True`, then a CUDA event recorded right after it.
`wait()` blocks on that event only, then builds the `SamplerOutput`. On the CPU the copy is
an ordinary one and there is no event, but the same code runs.
Must never: touch the scheduler or requests (the engine applies the result), or sync the
device anywhere but `wait()` / `abandon()`.
To extend (more steps in flight): keep one `LaunchedStep` per step, collected in order.
"""

from __future__ import annotations

from typing import Optional

import torch

from .sampler import DeviceDraw, Sampler, SamplerOutput
from .scheduler import SchedulerOutput


def _to_host(t: torch.Tensor) -> torch.Tensor:
    """A non-blocking copy of `t` into pinned host memory (a plain copy on the CPU)."""
    if t.device.type != "cuda":
        return t.clone()
    host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
    host.copy_(t, non_blocking=True)
    return host


class LaunchedStep:
    def __init__(self, out: SchedulerOutput, row_ids: list[str], draw: DeviceDraw):
        self.out = out
        self.row_ids = row_ids
        self.row_of = {rid: i for i, rid in enumerate(row_ids)}
        self.draw = draw
        self._ids = _to_host(draw.transfer)
        self._values = _to_host(draw.values) if draw.values is not None else None
        self._event: Optional[torch.cuda.Event] = None
        if draw.transfer.device.type == "cuda":
            self._event = torch.cuda.Event()
            self._event.record()

    @property
    def token_ids(self) -> torch.Tensor:
        """The draw's ids on the device (the next step's pending inputs read them)."""
        return self.draw.token_ids

    def wait(self, sampler: Sampler) -> tuple[dict[str, int], dict[str, object]]:
        """Block until the ids are on the host; returns {request id: token id} and
        {request id: logprob entry (deferred) or None}."""
        if self._event is not None:
            self._event.synchronize()
        values = self._values.flatten().tolist() if self._values is not None else None
        result: SamplerOutput = sampler.finish(self.draw, self._ids.tolist(), values,
                                               defer_logprobs=True)
        return dict(zip(self.row_ids, result.token_ids)), dict(zip(self.row_ids, result.logprobs))

    def abandon(self) -> None:
        """A failure: wait (ignoring device errors) until the device is done with the step, so
        its blocks can be freed."""
        try:
            if self._event is not None:
                self._event.synchronize()
        except Exception:  # the device fault is reported by the step that raised
            pass
