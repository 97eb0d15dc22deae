"""`StepChannel`: how the packed step (`step_codec`) gets from rank 0 to every rank.

Owns: two broadcasts from rank 0. First a fixed-size int32 message on the `wait` group (gloo,
CPU tensors, no practical timeout): the header, followed by the payload itself when it fits
`inline_capacity` values. Otherwise the payload follows on the `data` group (the device group:
NCCL on CUDA, so it goes device to device; gloo on CPU). Ranks 1..N-1 block in the first
broadcast between steps; that is where an idle replica waits, so it needs no doorbell, and
the wait group has no timeout to dodge (a dead rank 0 is seen by the rank's heartbeat thread
and a dead peer by rank 0's monitor, which kills the group; see launcher.py).

Why the header is on a CPU group even on CUDA: a rank needs the sizes on the host before it
can allocate the payload or pick a graph, and reading a header that arrived on the GPU costs a
device sync that also waits for the rank's own previous step; an NCCL wait while the replica
is idle would spin a GPU kernel and trip the NCCL watchdog after its timeout.

Async scheduling (`PendingIds`): a step may be sent before the previous step's sampled ids
reached the host. Rank 0 then copies the payload to its device together with the rows to fill,
writes those ids in on the device (queued after the draw that makes them, so no host sync), and
broadcasts the device payload; every rank, rank 0 included, runs from the filled copy. On the
CPU (gloo, payload inline in the header message) the draw is already done and the same code
fills the host copy.

Must never decide anything: it moves rank 0's bytes. To change the transport (e.g. a shared
memory ring), keep `send` / `recv` and their results.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np
import torch
import torch.distributed as dist

from infer_cluster.worker.distributed.step_codec import HEADER_LEN, Op, StepHeader


@dataclass(frozen=True)
class PendingIds:
    """Input ids still on rank 0's device: payload offset `offsets[i]` takes `ids[rows[i]]`."""
    offsets: Sequence[int]
    ids: torch.Tensor
    rows: Sequence[int]

    @classmethod
    def pair(cls, fill: Sequence[int], prev_ids: Optional[torch.Tensor],
             prev_rows: Sequence[int]) -> Optional["PendingIds"]:
        """The payload offsets `fill` (from `pack_step_pending`) paired with the previous
        draw's rows; None when no row waits."""
        if len(fill) != len(prev_rows) or (fill and prev_ids is None):
            raise ValueError(f"{len(fill)} rows wait for a pending token but {len(prev_rows)} "
                             f"previous rows were given")
        return cls(fill, prev_ids, prev_rows) if fill else None


def to_device(host: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A host tensor on `device` (pinned, non-blocking on CUDA; itself on the CPU)."""
    if device.type == "cuda":
        return host.pin_memory().to(device, non_blocking=True)
    return host


def payload_on_device(payload: np.ndarray, pending: Optional[PendingIds], device: torch.device) -> torch.Tensor:
    """`payload` on `device` with the `pending` ids written in: one transfer carries the
    payload, the offsets and the rows, and the fill runs on the device (queued after the draw
    that made the ids, so nothing waits on the host)."""
    k = 0 if pending is None else len(pending.offsets)
    if not k:
        return to_device(torch.from_numpy(payload), device)
    n = len(payload)
    flat = to_device(torch.from_numpy(np.concatenate(
        [payload, np.asarray(pending.offsets, dtype=np.int32), np.asarray(pending.rows, dtype=np.int32)])), device)
    data = flat[:n]
    data[flat[n:n + k].long()] = pending.ids[flat[n + k:].long()].to(torch.int32)
    return data


class StepChannel:
    def __init__(self, wait_group, data_group, device: torch.device, inline_capacity: int):
        self.wait_group = wait_group
        self.data_group = data_group
        self.device = device
        self.inline_capacity = inline_capacity
        self._first = torch.zeros(HEADER_LEN + inline_capacity, dtype=torch.int32)

    def _to_device(self, host: torch.Tensor) -> torch.Tensor:
        return to_device(host, self.device)

    def send(self, header: StepHeader, payload: Optional[np.ndarray] = None,
             pending: Optional[PendingIds] = None) -> Optional[torch.Tensor]:
        """Rank 0: broadcast `header` and `payload` (with the `pending` ids written in); returns
        the payload on this rank's device (None for a payload-less op such as STOP)."""
        n = 0 if payload is None else len(payload)
        first = self._first
        first[:HEADER_LEN] = torch.from_numpy(header.to_array())
        inline = n <= self.inline_capacity
        data = None
        if n and inline:  # the CPU path (no inline payload on CUDA): the copy below is no sync
            data = self._on_device(payload, pending)
            first[HEADER_LEN:HEADER_LEN + n] = data.cpu()
        dist.broadcast(first, src=0, group=self.wait_group)
        if not n:
            return None
        if not inline:
            data = self._on_device(payload, pending)
            dist.broadcast(data, src=0, group=self.data_group)
        return data

    def _on_device(self, payload: np.ndarray, pending: Optional[PendingIds]) -> torch.Tensor:
        return payload_on_device(payload, pending, self.device)

    def recv(self) -> tuple[StepHeader, Optional[torch.Tensor]]:
        """Ranks 1..N-1: wait for the next step; returns its header and payload (on device)."""
        first = self._first
        dist.broadcast(first, src=0, group=self.wait_group)
        header = StepHeader.from_values(first[:HEADER_LEN].tolist())
        n = header.payload_len if header.op is not Op.STOP else 0
        if not n:
            return header, None
        if n <= self.inline_capacity:  # a copy: the buffer is reused by the next recv
            return header, self._to_device(first[HEADER_LEN:HEADER_LEN + n].clone())
        data = torch.empty(n, dtype=torch.int32, device=self.device)
        dist.broadcast(data, src=0, group=self.data_group)
        return header, data
