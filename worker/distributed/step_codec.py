"""What rank 0 tells the other ranks each step, as bytes: the doorbell frame and the step.

Owns: `Command` (the doorbell's one-byte kinds), `pack_doorbell` / `unpack_doorbell` (the
fixed 9-byte frame rank 0 writes to each rank's stdin pipe: command + payload length), and
`encode_step` / `decode_step` (a `SchedulerOutput` as msgpack, which rank 0 then broadcasts
as a uint8 tensor). Never pickle, never torch: ranks rebuild their own tensors from the
decoded `SchedulerOutput` with `DynamicContext.prepare`, so every rank derives identical
inputs from identical bytes.

To add a field to the step: append it to the per-request list in `encode_step`, read it in
`decode_step`, and bump `STEP_FORMAT` (all ranks of a replica run the same code, so no
compatibility shims are needed beyond a clear error on mismatch).
"""

from __future__ import annotations

import enum
import struct

import msgpack

from ..scheduler import ScheduledRequest, SchedulerOutput

STEP_FORMAT = 1
_DOORBELL = struct.Struct("<BQ")
DOORBELL_SIZE = _DOORBELL.size


class Command(enum.IntEnum):
    STEP = 1      # a step payload of the given length follows on the control group
    SHUTDOWN = 2  # leave the loop, tear down the group, exit 0


class StepFormatError(ValueError):
    """The bytes are not a step this code understands (a bug, or mixed code versions)."""


def pack_doorbell(command: Command, payload_len: int = 0) -> bytes:
    return _DOORBELL.pack(int(command), payload_len)


def unpack_doorbell(frame: bytes) -> tuple[Command, int]:
    if len(frame) != DOORBELL_SIZE:
        raise StepFormatError(f"doorbell frame has {len(frame)} bytes, expected {DOORBELL_SIZE}")
    kind, length = _DOORBELL.unpack(frame)
    try:
        return Command(kind), length
    except ValueError:
        raise StepFormatError(f"unknown doorbell command {kind}") from None


def encode_step(out: SchedulerOutput) -> bytes:
    """Only what the tensors need: request ids stay on rank 0 (it alone samples)."""
    rows = [[r.token_ids, r.start_position, r.block_ids, r.needs_sample] for r in out.requests]
    return msgpack.packb([STEP_FORMAT, out.num_batched_tokens, rows], use_bin_type=True)


def decode_step(data: bytes) -> SchedulerOutput:
    try:
        version, num_tokens, rows = msgpack.unpackb(data, raw=False)
    except Exception as exc:
        raise StepFormatError(f"cannot decode a step payload of {len(data)} bytes: {exc}") from None
    if version != STEP_FORMAT:
        raise StepFormatError(f"step format {version} from rank 0, this rank speaks {STEP_FORMAT}")
    requests = [ScheduledRequest(str(i), list(ids), int(start), list(blocks), bool(sample))
                for i, (ids, start, blocks, sample) in enumerate(rows)]
    return SchedulerOutput(requests=requests, num_batched_tokens=num_tokens)
