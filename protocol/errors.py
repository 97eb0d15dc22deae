"""Typed errors shared by every process.

Owns: the error classes a user can see, each with a stable `code` string so an error can cross
the wire (as `{"code": ..., "message": ...}`, plus `"param"` when the error names the request
field at fault) and be raised again as the same type on the other side. Never imports torch.

To add an error: subclass `InferClusterError`, give it a unique `code`; `error_from_code` finds
it through the registry built below.
"""

from __future__ import annotations

from typing import Optional


class InferClusterError(Exception):
    """Base of every error this project raises on purpose."""

    code = "internal"

    def __init__(self, message: str, param: Optional[str] = None):
        super().__init__(message)
        self.message = message
        self.param = param  # the request field at fault ("prompt", "max_tokens"), if one is

    def to_dict(self) -> dict:
        d = {"code": self.code, "message": self.message}
        if self.param:
            d["param"] = self.param
        return d


class InvalidRequestError(InferClusterError, ValueError):
    """The request (prompt, sampling params, ids) is malformed or out of range."""

    code = "invalid_request"


class ConfigError(InvalidRequestError):
    """An engine or cluster option is out of range or inconsistent."""

    code = "invalid_config"


class ModelNotFoundError(InferClusterError, FileNotFoundError):
    """The model name or directory cannot be resolved to a checkpoint."""

    code = "model_not_found"


class OutOfMemoryError(InferClusterError, MemoryError):
    """The request can never fit in the KV pool, or the pool cannot be allocated."""

    code = "out_of_memory"


class ProtocolError(InferClusterError):
    """Bytes on a socket are not a valid message of this protocol version."""

    code = "protocol"


class OverloadedError(InferClusterError):
    """The coordinator's admission limit is reached; retry later."""

    code = "overloaded"


class NoReplicaError(InferClusterError):
    """No live replica is left to serve the request."""

    code = "no_replica"


class UnreachableError(InferClusterError, ConnectionError):
    """The coordinator did not answer in time, or refused the connection (wrong port or key)."""

    code = "unreachable"


class RequestTimeoutError(InferClusterError, TimeoutError):
    """The request's deadline passed before it finished."""

    code = "timeout"


class EngineError(InferClusterError):
    """The engine failed while running a request (a bug or a device fault)."""

    code = "engine"


def _all_subclasses(cls):
    for sub in cls.__subclasses__():
        yield sub
        yield from _all_subclasses(sub)


ERRORS_BY_CODE: dict[str, type[InferClusterError]] = {"internal": InferClusterError}
for _cls in _all_subclasses(InferClusterError):
    if _cls.code in ERRORS_BY_CODE:
        raise RuntimeError(f"duplicate error code {_cls.code!r}")
    ERRORS_BY_CODE[_cls.code] = _cls


# Codes of a replica refusing the request itself (bad or too long, can never fit the KV pool):
# the client's fault, not a failure of the cluster (the coordinator counts them apart).
REFUSAL_CODES = frozenset(cls.code for cls in (InvalidRequestError, ConfigError, OutOfMemoryError))


def error_from_code(code: str, message: str, param: Optional[str] = None) -> InferClusterError:
    """Rebuild a typed error from its wire form; unknown codes become the base class."""
    return ERRORS_BY_CODE.get(code, InferClusterError)(message, param=param or None)
