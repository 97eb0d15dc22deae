"""`StructuredOutputsParams`: the output of a request constrained to a JSON schema, any JSON
object, a regular expression, one of a list of strings, or an EBNF grammar (vLLM's names).

Owns: the request's constraint and its validation; every check raises `InvalidRequestError`
naming the field (`structured_outputs.<kind>`). Exactly one kind per request. Whether a schema,
regex or grammar is well formed is the replica's compiler's to say (worker/structured/), since
only it knows the grammar dialect; here only shapes and sizes are checked. Never imports torch or
xgrammar.

On the wire the schema travels as a JSON string (`json`), so the map stays shallow whatever the
schema's depth; that text (re-serialised, key order kept: it is the output's property order) is
part of the compile cache's key.
To extend with a kind: add a field, list it in `KINDS`, and teach the replica's compiler it.
"""

from __future__ import annotations

import dataclasses
import json as _json
from dataclasses import dataclass
from typing import Any, Optional, Union

from .errors import InvalidRequestError

KINDS = ("json", "json_object", "regex", "choice", "grammar")
MAX_SPEC_CHARS = 256 * 1024  # a schema, regex or grammar: larger ones are refused, not compiled
MAX_CHOICES = 1024


@dataclass
class StructuredOutputsParams:
    """One constraint on the generated text. `json`: a JSON schema (a map, or its JSON text);
    `json_object`: any JSON object; `regex`: the whole output matches it; `choice`: the output
    is one of these strings; `grammar`: an EBNF grammar (xgrammar's dialect, rule `root`)."""

    json: Optional[Union[str, dict, bool]] = None
    json_object: Optional[bool] = None
    regex: Optional[str] = None
    choice: Optional[list[str]] = None
    grammar: Optional[str] = None

    def __post_init__(self):
        given = [k for k in KINDS if getattr(self, k) not in (None, False)]
        if len(given) != 1:
            what = ", ".join(f"structured_outputs.{k}" for k in given) if given else "none"
            raise InvalidRequestError(
                f"structured_outputs needs exactly one of {', '.join(KINDS)}; got {what}")
        if self.json is not None:
            self.json = _schema_text(self.json)
        if self.json_object is not None and not isinstance(self.json_object, bool):
            raise InvalidRequestError(
                f"structured_outputs.json_object must be true or false, got {self.json_object!r}")
        for name in ("regex", "grammar"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value):
                raise InvalidRequestError(f"structured_outputs.{name} must be a non-empty string, "
                                          f"got {value!r}")
            if value is not None and len(value) > MAX_SPEC_CHARS:
                raise InvalidRequestError(f"structured_outputs.{name} has {len(value)} characters; "
                                          f"at most {MAX_SPEC_CHARS}")
        if self.choice is not None:
            c = self.choice
            if (not isinstance(c, (list, tuple)) or not c
                    or not all(isinstance(s, str) and s for s in c)):
                raise InvalidRequestError(f"structured_outputs.choice must be a non-empty list of "
                                          f"non-empty strings, got {c!r}")
            if len(c) > MAX_CHOICES or sum(map(len, c)) > MAX_SPEC_CHARS:
                raise InvalidRequestError(f"structured_outputs.choice is too large (at most "
                                          f"{MAX_CHOICES} strings, {MAX_SPEC_CHARS} characters)")
            self.choice = list(c)

    @property
    def kind(self) -> str:
        return next(k for k in KINDS if getattr(self, k) not in (None, False))

    @property
    def spec(self) -> Any:
        """The constraint of `kind`: schema text, True, regex, choice list or grammar."""
        return getattr(self, self.kind)

    def cache_key(self) -> str:
        """(kind, spec) as one string: equal constraints compile once."""
        return self.kind + "\0" + _json.dumps(self.spec, ensure_ascii=False)

    def to_dict(self) -> dict:
        return {k: v for k, v in dataclasses.asdict(self).items() if v is not None}

    @classmethod
    def from_value(cls, data: Any) -> Optional["StructuredOutputsParams"]:
        """None, an instance, or a wire/user map; unknown keys are an error."""
        if data is None or isinstance(data, cls):
            return data
        if not isinstance(data, dict):
            raise InvalidRequestError(f"structured_outputs must be a map, got {type(data).__name__}")
        unknown = sorted(str(k) for k in data if k not in KINDS)
        if unknown:
            raise InvalidRequestError(f"unknown structured_outputs field(s): {', '.join(unknown)}; "
                                      f"expected one of {', '.join(KINDS)}")
        return cls(**data)


def _schema_text(schema: Any) -> str:
    """A schema given as a map, a boolean or JSON text -> compact JSON text."""
    if isinstance(schema, str):
        if len(schema) > MAX_SPEC_CHARS:
            raise InvalidRequestError(f"structured_outputs.json has {len(schema)} characters; "
                                      f"at most {MAX_SPEC_CHARS}")
        try:
            schema = _json.loads(schema)
        except ValueError as exc:
            raise InvalidRequestError(f"structured_outputs.json is not valid JSON: {exc}") from None
    if not isinstance(schema, (dict, bool)):
        raise InvalidRequestError(f"structured_outputs.json must be a JSON schema (an object), "
                                  f"got {type(schema).__name__}")
    try:
        # Key order kept: a schema's property order is the order the output writes them in.
        text = _json.dumps(schema, ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise InvalidRequestError(f"structured_outputs.json is not JSON-serialisable: {exc}") from None
    if len(text) > MAX_SPEC_CHARS:
        raise InvalidRequestError(f"structured_outputs.json has {len(text)} characters; "
                                  f"at most {MAX_SPEC_CHARS}")
    return text
