"""`StepTicket`: a pipeline micro-batch that rank 0 submitted and has not collected yet.

Owns: what `DistributedRunner.submit` hands back (the buffer the last stage's logits land in,
the receive that fills it, the step's request ids) and `take`, the rule that a step's logits
are collected once. The runner keeps its uncollected tickets in submit order; STOP waits for
their receives (runner.py). To extend: a new per-step result travels as a field here.
"""

from __future__ import annotations

import dataclasses

import torch


def take(ticket: "StepTicket") -> None:
    """A step's logits are taken once (`collect` or `collect_queued`)."""
    if ticket.done:
        raise RuntimeError("this step was already collected")
    ticket.done = True


@dataclasses.dataclass(eq=False)  # compared by identity (`in`, `remove` on the uncollected list)
class StepTicket:
    """A submitted micro-batch: the buffer its logits land in and the receive filling it."""
    logits: torch.Tensor
    work: object  # the logits' receive (None: the step samples nothing)
    request_ids: list[str]
    done: bool = False
