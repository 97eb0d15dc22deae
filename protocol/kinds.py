"""Message kinds: the number in every frame's `"k"` field.

Owns: one `IntEnum` per family of messages, each in its own numeric range, and
`PROTOCOL_VERSION`. A kind's number never changes once released; the import-time check below
refuses overlapping ranges, a kind outside its family's range and duplicate numbers, so a
collision is a crash at import instead of a silent mis-dispatch on the wire.
Never imports anything but the stdlib.

To add a kind: append a member to the right family with the next free number in its range, add
its struct to `protocol/messages.py` (the import-time check there fails until you do), and a
handler where it is received.
"""

from __future__ import annotations

import enum

# Bump only for changes an old peer cannot ignore (a field's meaning changes, a kind is removed).
# Adding a field with a default or a new kind does not need a bump.
PROTOCOL_VERSION = 1


class ConnectionKind(enum.IntEnum):
    """Who is on the other end, and is it still alive."""

    HELLO = 1            # replica -> coordinator: register (name, capacity)
    HELLO_ACK = 2        # coordinator -> replica/client: registered, here are my settings
    HEARTBEAT = 3        # replica -> coordinator: still alive, with load
    HEARTBEAT_ACK = 4    # coordinator -> replica: I still know you
    CLIENT_HELLO = 5     # client -> coordinator: a client connects
    PING = 6             # client -> coordinator: client still alive
    PONG = 7             # coordinator -> client: coordinator still alive
    GOODBYE = 8          # client/replica -> coordinator: leaving on purpose
    REREGISTER = 9       # coordinator -> replica: I do not know you (any more); send HELLO


class RequestKind(enum.IntEnum):
    """Work going towards an engine."""

    SUBMIT = 100         # client -> coordinator
    CANCEL = 101         # client -> coordinator
    DISPATCH = 102       # coordinator -> replica (may carry tokens to resume from)
    ABORT = 103          # coordinator -> replica


class ReplyKind(enum.IntEnum):
    """Results flowing back."""

    DELTA = 200          # coordinator -> client: one request's new tokens / final
    STEP_OUTPUT = 201    # replica -> coordinator: every delta of one engine step
    ERROR = 202          # anyone -> sender of a bad message
    STATUS_REPLY = 203   # coordinator -> client: cluster status
    CONTROL_REPLY = 204  # coordinator -> client: result of an operator action


class ControlKind(enum.IntEnum):
    """Operator actions and queries."""

    PAUSE = 300          # coordinator -> replica: stop stepping, keep requests
    RESUME = 301         # coordinator -> replica: step again / accept again
    DRAIN = 302          # coordinator -> replica: finish in-flight work, accept nothing new
    SHUTDOWN = 303       # coordinator -> replica: exit (after draining when graceful)
    STATUS = 304         # client -> coordinator: ask for the cluster status
    CONTROL = 305        # client -> coordinator: pause/resume/drain/shutdown some replicas
    RESIZE = 306         # client -> coordinator: new KV pool size / dtype for one replica
    RESIZE_KV = 307      # coordinator -> replica: apply a resize between steps


class LifecycleKind(enum.IntEnum):
    """A replica telling the coordinator its state changed."""

    REPLICA_STATE = 400  # replica -> coordinator
    RESIZE_DONE = 401    # replica -> coordinator: a RESIZE_KV's outcome and the new capacity


# family -> (first, last) number, inclusive. Ranges must not overlap.
KIND_RANGES: dict[type[enum.IntEnum], tuple[int, int]] = {
    ConnectionKind: (1, 99),
    RequestKind: (100, 199),
    ReplyKind: (200, 299),
    ControlKind: (300, 399),
    LifecycleKind: (400, 499),
}


def _build_kind_table() -> dict[int, enum.IntEnum]:
    """Check ranges and numbers; return number -> kind member for decoding."""
    spans = sorted(KIND_RANGES.items(), key=lambda item: item[1][0])
    for (fam_a, (_, hi_a)), (fam_b, (lo_b, _)) in zip(spans, spans[1:]):
        if lo_b <= hi_a:
            raise RuntimeError(f"kind ranges of {fam_a.__name__} and {fam_b.__name__} overlap")
    table: dict[int, enum.IntEnum] = {}
    for family, (lo, hi) in KIND_RANGES.items():
        # IntEnum silently turns a duplicate value into an alias; aliases are collisions here.
        if len(family.__members__) != len(list(family)):
            raise RuntimeError(f"{family.__name__} has two names for one number")
        for member in family:
            if not lo <= member.value <= hi:
                raise RuntimeError(
                    f"{family.__name__}.{member.name}={member.value} is outside {lo}..{hi}")
            if member.value in table:
                raise RuntimeError(f"kind number {member.value} used twice")
            table[member.value] = member
    return table


KINDS_BY_NUMBER: dict[int, enum.IntEnum] = _build_kind_table()
ALL_KINDS: tuple[enum.IntEnum, ...] = tuple(KINDS_BY_NUMBER.values())


def kind_from_number(number: int) -> enum.IntEnum | None:
    """The kind member for a wire number, or None when this version does not know it."""
    return KINDS_BY_NUMBER.get(number)
