"""Bytes <-> messages: msgpack with a version, a kind and a size cap. Never pickle.

Owns: `encode(message) -> bytes` and `decode(bytes) -> Message`, the frame size cap, and the
multipart framing helpers (`[identity..., b"", payload]`). Whatever bytes arrive, `decode` either
returns a validated `Message` or raises `ProtocolError` with a message a person can act on; it
never executes anything from the wire (msgpack only builds plain data; ext types are refused).

To change the encoding: do it here only, bump `PROTOCOL_VERSION` in `protocol/kinds.py`.
"""

from __future__ import annotations

from typing import Optional, Sequence

import msgpack

from .errors import ProtocolError
from .kinds import PROTOCOL_VERSION
from .messages import Message

# One frame may not be larger than this unless the process is configured otherwise. A long
# prompt (1M tokens as msgpack ints) is ~5 MiB, so 16 MiB leaves room without letting one peer
# make the coordinator buffer gigabytes.
DEFAULT_MAX_FRAME_BYTES = 16 * 1024 * 1024
EMPTY = b""


def _refuse_ext(code, data):
    raise ProtocolError(f"msgpack extension type {code} is not part of this protocol")


def encode(message: Message, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> bytes:
    """Serialise one message; refuses to build a frame the peer would reject for size."""
    try:
        payload = msgpack.packb(message.to_wire(), use_bin_type=True)
    except (OverflowError, TypeError, ValueError) as exc:  # e.g. an int past 64 bits
        raise ProtocolError(f"{message.KIND.name} message cannot be encoded: {exc}") from None
    if len(payload) > max_frame_bytes:
        raise ProtocolError(f"{message.KIND.name} message is {len(payload)} bytes, over the "
                            f"frame cap of {max_frame_bytes} bytes; send a shorter prompt")
    return payload


def decode_map(payload, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> dict:
    """Bytes -> the raw map (version and kind not yet checked)."""
    try:
        size = len(payload)
    except TypeError:
        raise ProtocolError(f"a frame must be bytes, got {type(payload).__name__}") from None
    if size > max_frame_bytes:
        raise ProtocolError(f"frame of {size} bytes is over the cap of {max_frame_bytes} bytes")
    if size == 0:
        raise ProtocolError("empty frame; expected a msgpack map")
    try:
        data = msgpack.unpackb(payload, raw=False, use_list=True, strict_map_key=False,
                               ext_hook=_refuse_ext)
    except ProtocolError:
        raise
    except Exception as exc:  # msgpack raises many types for malformed input; all mean "bad frame"
        raise ProtocolError(f"frame is not valid msgpack ({type(exc).__name__}: {exc})") from None
    if not isinstance(data, dict):
        raise ProtocolError(f"a message must be a msgpack map, got {type(data).__name__}")
    return data


def decode(payload, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> Message:
    """Bytes -> a validated message, or `ProtocolError`."""
    return Message.from_wire(decode_map(payload, max_frame_bytes))


def peek_request_id(data) -> Optional[str]:
    """Best-effort request id of a map that failed validation (so the error reply can name it)."""
    if isinstance(data, dict):
        rid = data.get("request_id")
        if isinstance(rid, str) and 0 < len(rid) <= 256:
            return rid
    return None


def split_envelope(frames: Sequence[bytes]) -> tuple[list[bytes], bytes]:
    """ROUTER frames `[identity..., b"", payload]` -> (identity frames, payload)."""
    if len(frames) < 3 or frames[-2] != EMPTY:
        raise ProtocolError(f"expected frames [identity, '', payload], got {len(frames)} frame(s) "
                            "without the empty delimiter; use a DEALER socket and send [b'', payload]")
    return list(frames[:-2]), frames[-1]


__all__ = ["encode", "decode", "decode_map", "peek_request_id", "split_envelope",
           "DEFAULT_MAX_FRAME_BYTES", "PROTOCOL_VERSION"]
