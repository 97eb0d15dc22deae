"""Fuzz: whatever bytes arrive, decoding returns a valid message or raises ProtocolError.

Three sources of input: arbitrary bytes, truncations / bit flips of real frames, and
well-formed msgpack maps with a valid version and kind but random field values (the case that
exercises every validator). Any other exception type is a crash waiting to happen in the
coordinator's loop.
"""

from __future__ import annotations

import msgpack
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from infer_cluster.protocol import ProtocolError
from infer_cluster.protocol import codec
from infer_cluster.protocol.kinds import ALL_KINDS, PROTOCOL_VERSION
from infer_cluster.protocol.messages import MESSAGE_TYPES, Message

from .test_protocol_messages import EXAMPLES

SETTINGS = settings(max_examples=250, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow])
REAL_FRAMES = [codec.encode(m) for m in EXAMPLES.values()]

scalars = st.one_of(st.none(), st.booleans(), st.integers(-2**63, 2**64 - 1),
                    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=20),
                    st.binary(max_size=20))
values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=5),
    st.dictionaries(st.one_of(st.text(max_size=8), st.integers(-5, 5)), inner, max_size=5)),
    max_leaves=20)


def _decode_only_protocol_errors(payload) -> None:
    try:
        msg = codec.decode(payload)
    except ProtocolError:
        return
    # Accepted: it must be a real message that survives its own round trip.
    assert isinstance(msg, Message)
    assert codec.decode(codec.encode(msg)) == msg


@SETTINGS
@given(st.binary(max_size=512))
def test_random_bytes(payload):
    _decode_only_protocol_errors(payload)


@SETTINGS
@given(st.sampled_from(REAL_FRAMES), st.data())
def test_truncated_real_frames(frame, data):
    cut = data.draw(st.integers(0, len(frame) - 1))
    with_suffix = data.draw(st.booleans())
    payload = frame[:cut] + (data.draw(st.binary(max_size=8)) if with_suffix else b"")
    _decode_only_protocol_errors(payload)


@SETTINGS
@given(st.sampled_from(REAL_FRAMES), st.data())
def test_bit_flipped_real_frames(frame, data):
    buf = bytearray(frame)
    for _ in range(data.draw(st.integers(1, 4))):
        i = data.draw(st.integers(0, len(buf) - 1))
        buf[i] ^= 1 << data.draw(st.integers(0, 7))
    _decode_only_protocol_errors(bytes(buf))


field_names = sorted({f for cls in MESSAGE_TYPES.values() for f in cls.__dataclass_fields__})


@SETTINGS
@given(st.sampled_from(ALL_KINDS),
       st.dictionaries(st.sampled_from(field_names), values, max_size=8))
def test_random_fields_with_valid_header(kind, fields):
    data = dict(fields, v=PROTOCOL_VERSION, k=int(kind))
    _decode_only_protocol_errors(msgpack.packb(data, use_bin_type=True))


@SETTINGS
@given(st.sampled_from(list(EXAMPLES.values())), st.data())
def test_one_field_of_a_valid_message_replaced(msg, data):
    wire = msg.to_wire()
    name = data.draw(st.sampled_from(sorted(wire)))
    wire[name] = data.draw(values)
    _decode_only_protocol_errors(msgpack.packb(wire, use_bin_type=True))
