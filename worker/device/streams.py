"""`CurrentStream`: a device's current CUDA stream, without `torch.cuda.current_stream()`'s cost.

Why: `Event.record()` with no stream calls `torch.cuda.current_stream()`, which builds a new
Python `Stream` each time. On the H200 host that made a record cost ~30 us (2026-11-29, timers
around each part of `GraphInputs.stage`), and a decode step records several. The raw handle of
the current stream is one C call; the `Stream` object is fetched again only when it changed
(a `torch.cuda.stream(...)` block), so a record always lands on the stream that is current.

Owns nothing but that cache; one per owner that records on a device (no module state).
"""

from __future__ import annotations

import torch


class CurrentStream:
    def __init__(self, device: torch.device):
        self.index = device.index if device.index is not None else torch.cuda.current_device()
        self._raw: int = -1
        self._stream = None

    def get(self) -> torch.cuda.Stream:
        """The current stream of the device (the same object while it stays current)."""
        raw = torch._C._cuda_getCurrentRawStream(self.index)
        if raw != self._raw:
            self._stream = torch.cuda.current_stream(self.index)
            self._raw = raw
        return self._stream

    def record(self, event: torch.cuda.Event) -> None:
        """`event.record()` on the current stream."""
        event.record(self.get())


class StreamRecorder:
    """Records events on the current stream of the device each one is for, with one
    `CurrentStream` per device (an engine's launched steps may live on its draft's device too)."""

    def __init__(self):
        self._by_index: dict[int, CurrentStream] = {}

    def record(self, event: torch.cuda.Event, device: torch.device) -> None:
        current = self._by_index.get(device.index)
        if current is None:
            current = self._by_index[device.index] = CurrentStream(device)
        current.record(event)

    def recorded(self, device: torch.device) -> torch.cuda.Event:
        """A new event, recorded now on `device`'s current stream."""
        event = torch.cuda.Event()
        self.record(event, device)
        return event
