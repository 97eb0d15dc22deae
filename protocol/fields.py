"""Field checkers for wire structs: small functions `check(value, where) -> value`.

Owns: the type / range / size rules a decoded field must meet, and `Struct`, the dataclass base
whose `from_dict` runs each field's checker and whose `to_dict` writes plain msgpack-able maps.
Every failure raises `ProtocolError` naming the message, the field and what was expected, so a
person reading a log line knows which peer sent what. Never imports torch, never evaluates or
unpickles anything from the wire.

To add a rule: write a function returning a checker closure; keep it cheap (it runs on every
token delta that crosses the coordinator).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable

from .errors import ProtocolError

Checker = Callable[[Any, str], Any]

# Size limits. The frame cap (codec) bounds the total; these bound single fields so one field
# cannot make a struct expensive to validate or store.
MAX_ID_CHARS = 256
MAX_NAME_CHARS = 256
MAX_TEXT_CHARS = 8 * 1024 * 1024
MAX_TOKEN_IDS = 1 << 20
MAX_TOKEN_ID = (1 << 31) - 1
MAX_LIST_ITEMS = 1 << 16
MAX_MAP_ITEMS = 256


def _type_name(value: Any) -> str:
    return "nil" if value is None else type(value).__name__


def string(max_len: int = MAX_TEXT_CHARS, min_len: int = 0) -> Checker:
    def check(value, where):
        if not isinstance(value, str):
            raise ProtocolError(f"{where} must be a string, got {_type_name(value)}")
        if not min_len <= len(value) <= max_len:
            raise ProtocolError(f"{where} must have {min_len}..{max_len} characters, got {len(value)}")
        return value
    return check


def integer(lo: int | None = None, hi: int | None = None) -> Checker:
    def check(value, where):
        if isinstance(value, bool) or not isinstance(value, int):
            raise ProtocolError(f"{where} must be an integer, got {_type_name(value)}")
        if (lo is not None and value < lo) or (hi is not None and value > hi):
            raise ProtocolError(f"{where} must be in {lo}..{hi}, got {value}")
        return value
    return check


def number(lo: float | None = None, hi: float | None = None) -> Checker:
    def check(value, where):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ProtocolError(f"{where} must be a number, got {_type_name(value)}")
        if not math.isfinite(value):
            raise ProtocolError(f"{where} must be finite, got {value}")
        if (lo is not None and value < lo) or (hi is not None and value > hi):
            raise ProtocolError(f"{where} must be in {lo}..{hi}, got {value}")
        return float(value)
    return check


def boolean() -> Checker:
    def check(value, where):
        if not isinstance(value, bool):
            raise ProtocolError(f"{where} must be true or false, got {_type_name(value)}")
        return value
    return check


def optional(inner: Checker) -> Checker:
    def check(value, where):
        return None if value is None else inner(value, where)
    return check


def one_of(*allowed: str) -> Checker:
    allowed_set = frozenset(allowed)

    def check(value, where):
        if not isinstance(value, str) or value not in allowed_set:
            raise ProtocolError(f"{where} must be one of {sorted(allowed_set)}, got {value!r}")
        return value
    return check


def token_ids(max_len: int = MAX_TOKEN_IDS) -> Checker:
    def check(value, where):
        if not isinstance(value, list):
            raise ProtocolError(f"{where} must be a list of token ids, got {_type_name(value)}")
        if len(value) > max_len:
            raise ProtocolError(f"{where} has {len(value)} token ids; at most {max_len}")
        for t in value:
            if type(t) is not int or not 0 <= t <= MAX_TOKEN_ID:
                raise ProtocolError(f"{where} must hold integers in 0..{MAX_TOKEN_ID}, found {t!r}")
        return value
    return check


def list_of(inner: Checker, max_len: int = MAX_LIST_ITEMS) -> Checker:
    def check(value, where):
        if not isinstance(value, list):
            raise ProtocolError(f"{where} must be a list, got {_type_name(value)}")
        if len(value) > max_len:
            raise ProtocolError(f"{where} has {len(value)} items; at most {max_len}")
        return [inner(item, f"{where}[{i}]") for i, item in enumerate(value)]
    return check


_SCALARS = (str, int, float, bool, type(None))


def plain_map(max_items: int = MAX_MAP_ITEMS, nested: bool = True) -> Checker:
    """A map with string keys whose values are scalars, lists of scalars or (if nested) such
    maps: free-form data (stats, sampling params before their own validation)."""
    def check_value(v, where, depth):
        if isinstance(v, _SCALARS):
            return
        if isinstance(v, list):
            if len(v) > MAX_TOKEN_IDS:
                raise ProtocolError(f"{where} is a list of {len(v)} items; too long")
            for item in v:
                check_value(item, where, depth + 1)
            return
        if isinstance(v, dict) and nested and depth < 4:
            check_map(v, where, depth + 1)
            return
        raise ProtocolError(f"{where} holds an unsupported value of type {_type_name(v)}")

    def check_map(value, where, depth=0):
        if not isinstance(value, dict):
            raise ProtocolError(f"{where} must be a map, got {_type_name(value)}")
        if len(value) > max_items:
            raise ProtocolError(f"{where} has {len(value)} keys; at most {max_items}")
        for k, v in value.items():
            if not isinstance(k, str):
                raise ProtocolError(f"{where} keys must be strings, got {_type_name(k)}")
            check_value(v, f"{where}.{k}", depth)
        return value

    return check_map


def struct(cls: type["Struct"]) -> Checker:
    def check(value, where):
        return cls.from_dict(value, where)
    return check


def wire(check: Checker, **field_kwargs) -> Any:
    """Declare a dataclass field with the checker `from_dict` applies to its wire value."""
    return dataclasses.field(metadata={"check": check}, **field_kwargs)


class Struct:
    """Base of validated wire structs (subclasses are `@dataclass(kw_only=True)`).

    Missing fields take their default (peers only ever add fields with defaults); a missing field
    without default is an error; unknown keys are ignored so a newer peer can add fields.
    """

    @classmethod
    def _fields(cls):
        cached = cls.__dict__.get("_field_specs")
        if cached is None:
            cached = tuple((f.name, f.metadata["check"],
                            f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING)
                           for f in dataclasses.fields(cls))
            cls._field_specs = cached
        return cached

    @classmethod
    def from_dict(cls, data: Any, where: str | None = None):
        where = where or cls.__name__
        if not isinstance(data, dict):
            raise ProtocolError(f"{where} must be a map, got {_type_name(data)}")
        kwargs = {}
        for name, check, required in cls._fields():
            if name in data:
                kwargs[name] = check(data[name], f"{where}.{name}")
            elif required:
                raise ProtocolError(f"{where} is missing the required field {name!r}")
        obj = cls(**kwargs)
        obj.validate()
        return obj

    def validate(self) -> None:
        """Cross-field rules; override and raise `ProtocolError`."""

    def to_dict(self) -> dict:
        out = {}
        for name, _, _ in self._fields():
            out[name] = _plain(getattr(self, name))
        return out


def _plain(value):
    if isinstance(value, Struct):
        return value.to_dict()
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value
