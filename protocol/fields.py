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


def _w(where) -> str:
    """Format a field path. Paths are built as nested tuples and only turned into text when an
    error is raised: formatting them for every field of every delta would dominate decoding."""
    if isinstance(where, tuple):
        parent, part = where
        return f"{_w(parent)}[{part}]" if isinstance(part, int) else f"{_w(parent)}.{part}"
    return where


def string(max_len: int = MAX_TEXT_CHARS, min_len: int = 0) -> Checker:
    def check(value, where):
        if not isinstance(value, str):
            raise ProtocolError(f"{_w(where)} must be a string, got {_type_name(value)}")
        if not min_len <= len(value) <= max_len:
            raise ProtocolError(f"{_w(where)} must have {min_len}..{max_len} characters, got {len(value)}")
        return value
    return check


def integer(lo: int | None = None, hi: int | None = None) -> Checker:
    def check(value, where):
        if isinstance(value, bool) or not isinstance(value, int):
            raise ProtocolError(f"{_w(where)} must be an integer, got {_type_name(value)}")
        if (lo is not None and value < lo) or (hi is not None and value > hi):
            raise ProtocolError(f"{_w(where)} must be in {lo}..{hi}, got {value}")
        return value
    return check


def number(lo: float | None = None, hi: float | None = None) -> Checker:
    def check(value, where):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ProtocolError(f"{_w(where)} must be a number, got {_type_name(value)}")
        if not math.isfinite(value):
            raise ProtocolError(f"{_w(where)} must be finite, got {value}")
        if (lo is not None and value < lo) or (hi is not None and value > hi):
            raise ProtocolError(f"{_w(where)} must be in {lo}..{hi}, got {value}")
        return float(value)
    return check


def boolean() -> Checker:
    def check(value, where):
        if not isinstance(value, bool):
            raise ProtocolError(f"{_w(where)} must be true or false, got {_type_name(value)}")
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
            raise ProtocolError(f"{_w(where)} must be one of {sorted(allowed_set)}, got {value!r}")
        return value
    return check


def token_ids(max_len: int = MAX_TOKEN_IDS) -> Checker:
    def check(value, where):
        if not isinstance(value, list):
            raise ProtocolError(f"{_w(where)} must be a list of token ids, got {_type_name(value)}")
        if len(value) > max_len:
            raise ProtocolError(f"{_w(where)} has {len(value)} token ids; at most {max_len}")
        for t in value:
            if type(t) is not int or not 0 <= t <= MAX_TOKEN_ID:
                raise ProtocolError(f"{_w(where)} must hold integers in 0..{MAX_TOKEN_ID}, found {t!r}")
        return value
    return check


def list_of(inner: Checker, max_len: int = MAX_LIST_ITEMS) -> Checker:
    def check(value, where):
        if not isinstance(value, list):
            raise ProtocolError(f"{_w(where)} must be a list, got {_type_name(value)}")
        if len(value) > max_len:
            raise ProtocolError(f"{_w(where)} has {len(value)} items; at most {max_len}")
        return [inner(item, (where, i)) for i, item in enumerate(value)]
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
                raise ProtocolError(f"{_w(where)} is a list of {len(v)} items; too long")
            for item in v:
                check_value(item, where, depth + 1)
            return
        if isinstance(v, dict) and nested and depth < 4:
            check_map(v, where, depth + 1)
            return
        raise ProtocolError(f"{_w(where)} holds an unsupported value of type {_type_name(v)}")

    def check_map(value, where, depth=0):
        if not isinstance(value, dict):
            raise ProtocolError(f"{_w(where)} must be a map, got {_type_name(value)}")
        if len(value) > max_items:
            raise ProtocolError(f"{_w(where)} has {len(value)} keys; at most {max_items}")
        for k, v in value.items():
            if not isinstance(k, str):
                raise ProtocolError(f"{_w(where)} keys must be strings, got {_type_name(k)}")
            check_value(v, (where, k), depth)
        return value

    return check_map


def struct(cls: type["Struct"]) -> Checker:
    def check(value, where):
        return cls.from_dict(value, where)
    return check


def wire(check: Checker, **field_kwargs) -> Any:
    """Declare a dataclass field with the checker `from_dict` applies to its wire value."""
    return dataclasses.field(metadata={"check": check}, **field_kwargs)


_MISSING = object()


class Struct:
    """Base of validated wire structs (subclasses are `@dataclass(kw_only=True)`).

    Missing fields take their default (peers only ever add fields with defaults); a missing field
    without default is an error; unknown keys are ignored so a newer peer can add fields.
    """

    @classmethod
    def _fields(cls):
        """(name -> checker, required names, names whose default is None), cached per class."""
        cached = cls.__dict__.get("_field_specs")
        if cached is None:
            fields = dataclasses.fields(cls)
            cached = ({f.name: f.metadata["check"] for f in fields},
                      tuple(f.name for f in fields if f.default is dataclasses.MISSING
                            and f.default_factory is dataclasses.MISSING),
                      frozenset(f.name for f in fields if f.default is None))
            cls._field_specs = cached
        return cached

    @classmethod
    def from_dict(cls, data: Any, where=None):
        where = where or cls.__name__
        if type(data) is not dict:
            raise ProtocolError(f"{_w(where)} must be a map, got {_type_name(data)}")
        checks, required, _ = cls._fields()
        kwargs = {}
        for name, value in data.items():  # deltas carry few of their fields: walk what is there
            check = checks.get(name)
            if check is not None:  # unknown keys (a newer peer's fields, "v", "k") are skipped
                kwargs[name] = check(value, (where, name))
        for name in required:
            if name not in kwargs:
                raise ProtocolError(f"{_w(where)} is missing the required field {name!r}")
        obj = cls(**kwargs)
        if cls.validate is not Struct.validate:
            obj.validate()
        return obj

    def validate(self) -> None:
        """Cross-field rules; override and raise `ProtocolError`."""

    def to_dict(self) -> dict:
        checks, _, none_default = self._fields()
        out = {}
        for name in checks:
            value = getattr(self, name)
            if value is None and name in none_default:
                continue  # absent decodes to the same None, and keeps hot messages small
            out[name] = _plain(value)
        return out


def _plain(value):
    # Lists in wire structs are homogeneous: either structs or plain data (token ids, text), and
    # plain data is passed through untouched (walking every token id here would be slow).
    if isinstance(value, Struct):
        return value.to_dict()
    if type(value) is list and value and isinstance(value[0], Struct):
        return [v.to_dict() for v in value]
    return value
