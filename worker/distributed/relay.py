"""`StageRelay`: how a pipeline micro-batch travels between stages (P > 1, micro-batches on).

Owns: one rank's point-to-point messages with its pipeline neighbours (the same TP rank of the
previous and the next stage) and the sends it still has in flight:

- the step itself: its header (`HEADER_LEN` int32) on the `wait` group, then its payload on
  the `data` group (the device group: NCCL on CUDA, gloo on CPU). Each stage passes the step on
  to the next before it runs its own share, so stage s > 0 gets its step from stage s-1 and
  never waits in a world-wide broadcast, where stage 0 would wait for the last stage to finish
  its previous step. A stage idles in the header `recv`, on the wait group, whose timeout is a
  year (like `StepChannel`: an idle replica must not trip the collective timeout);
- the activations `(hidden, residual)` as one `[2, tokens, hidden]` tensor, on the data group;
- the sampled rows' logits from the last stage's TP leader to rank 0, which posted a
  non-blocking receive for them when it submitted the step (`post_logits`).

Every send is non-blocking (`isend`): a stage does not wait for the next one to take its
message before it computes the next micro-batch. A step's sends are kept (handles and tensors)
until `keep` later steps were sent, then waited for (bounded by `timeout`), so memory stays
bounded; `flush` waits for all of them (at STOP). Messages of one kind between two ranks are
matched in the order they were posted, and every rank posts them in step order, so no step id
is needed. Rank 0's logits receive is posted after its activations send (on NCCL the p2p ops
between two ranks run in issue order).

Must never decide anything: both sides derive every size from the header. To send something
more per step, post it on both sides in the same position and keep sends non-blocking.
"""

from __future__ import annotations

import datetime
from collections import deque
from typing import Optional

import torch
import torch.distributed as dist

from infer_cluster.worker.distributed.step_codec import HEADER_LEN, Op, StepHeader
from infer_cluster.worker.distributed.topology import RankLayout


class StageRelay:
    def __init__(self, layout: RankLayout, wait_group, data_group, device: torch.device,
                 timeout_s: float, keep: int):
        self.layout = layout
        self.wait_group = wait_group
        self.data_group = data_group
        self.device = device
        self.timeout = datetime.timedelta(seconds=timeout_s)
        self.keep = max(1, keep)
        self._step: list = []  # (work, tensor) of the step being sent
        self._sent: deque[list] = deque()  # earlier steps' sends, oldest first

    # -- the step -----------------------------------------------------------------------------

    def recv_step(self) -> tuple[StepHeader, Optional[torch.Tensor]]:
        """Stage s > 0: wait for the next step from the previous stage."""
        values = torch.empty(HEADER_LEN, dtype=torch.int32)
        dist.recv(values, src=self.layout.prev_rank, group=self.wait_group)
        header = StepHeader.from_values(values.tolist())
        n = header.payload_len if header.op is not Op.STOP else 0
        if not n:
            return header, None
        payload = torch.empty(n, dtype=torch.int32, device=self.device)
        dist.recv(payload, src=self.layout.prev_rank, group=self.data_group)
        return header, payload

    def forward_step(self, header: StepHeader, payload: Optional[torch.Tensor]) -> None:
        """Pass the step on to the next stage (not on the last stage)."""
        nxt = self.layout.next_rank
        self._isend(torch.from_numpy(header.to_array()), nxt, self.wait_group)
        if payload is not None and header.op is not Op.STOP:
            self._isend(payload, nxt, self.data_group)

    # -- activations and logits -----------------------------------------------------------------

    def recv_activations(self, num_tokens: int, hidden_size: int, dtype: torch.dtype) -> torch.Tensor:
        buf = torch.empty(2, num_tokens, hidden_size, dtype=dtype, device=self.device)
        dist.recv(buf, src=self.layout.prev_rank, group=self.data_group)
        return buf

    def send_activations(self, hidden: torch.Tensor, residual: torch.Tensor) -> None:
        self._isend(torch.stack([hidden, residual]), self.layout.next_rank, self.data_group)

    def recv_into(self, buf: torch.Tensor) -> None:
        """A stage's graph input (`[rows, 2, hidden]`, a decode step replayed from graphs)."""
        dist.recv(buf, src=self.layout.prev_rank, group=self.data_group)

    def send_packed(self, packed: torch.Tensor) -> None:
        """A stage graph's `[rows, 2, hidden]` output to the next stage."""
        self._isend(packed, self.layout.next_rank, self.data_group)

    def send_logits(self, logits: torch.Tensor) -> None:
        """The last stage's TP leader: the sampled rows' logits to rank 0."""
        self._isend(logits.contiguous(), 0, self.data_group)

    def post_logits(self, num_sampled: int, vocab_size: int, dtype: torch.dtype):
        """Rank 0: a non-blocking receive of a step's logits; returns (buffer, work)."""
        buf = torch.empty(num_sampled, vocab_size, dtype=dtype, device=self.device)
        return buf, dist.irecv(buf, src=self.layout.last_stage_leader, group=self.data_group)

    def wait(self, work) -> None:
        """Wait for one receive or send, bounded by the collective timeout."""
        work.wait(self.timeout)

    # -- sends in flight ----------------------------------------------------------------------

    def _isend(self, tensor: torch.Tensor, dst: int, group) -> None:
        self._step.append((dist.isend(tensor, dst=dst, group=group), tensor))

    def end_step(self) -> None:
        """This step's sends are posted; wait for those of the step `keep` steps back."""
        if self._step:
            self._sent.append(self._step)
            self._step = []
        while len(self._sent) > self.keep:
            for work, _ in self._sent.popleft():
                self.wait(work)

    def flush(self) -> None:
        """Wait for every send still in flight (the STOP step: the process exits next)."""
        self.end_step()
        while self._sent:
            for work, _ in self._sent.popleft():
                self.wait(work)
