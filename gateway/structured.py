"""Structured outputs over HTTP: OpenAI's `response_format`, vLLM's extra-body
`structured_outputs` and its older `guided_json` / `guided_regex` / `guided_choice` /
`guided_grammar`, mapped onto `SamplingParams.structured_outputs`.

Owns: which request field carries the constraint (one source at most, else a 400 naming both),
the shape checks of `response_format`, and the names a replica's error about the constraint
(`param` "structured_outputs.<kind>", e.g. a schema xgrammar cannot compile) takes in the
client's words (`param_names`). Never imports torch or xgrammar.
"""

from __future__ import annotations

from typing import Optional

from infer_cluster.protocol import InvalidRequestError, StructuredOutputsParams
from infer_cluster.protocol.structured import KINDS

from .errors import APIError

_IGNORED = ("disable_any_whitespace", "disable_additional_properties", "whitespace_pattern")
_GUIDED = {"guided_json": "json", "guided_regex": "regex", "guided_choice": "choice",
           "guided_grammar": "grammar"}


def _bad(field: str, why: str) -> APIError:
    return APIError(f"{field}: {why}", "invalid_request", field)


def _from_response_format(rf: dict) -> Optional[dict]:
    kind = rf.get("type")
    if kind in (None, "text"):
        return None
    if kind == "json_object":
        return {"json_object": True}
    if kind == "json_schema":
        js = rf.get("json_schema")
        if not isinstance(js, dict):
            raise _bad("response_format", 'type "json_schema" needs a "json_schema" object '
                       '({"name", "schema", "strict"})')
        schema = js.get("schema", js.get("json_schema"))
        if not isinstance(schema, (dict, bool)):
            raise _bad("response_format", "json_schema.schema must be a JSON schema object")
        name = js.get("name")
        if name is not None and not isinstance(name, str):
            raise _bad("response_format", "json_schema.name must be a string")
        return {"json": schema}
    raise _bad("response_format", f'type must be "text", "json_object" or "json_schema", got {kind!r}')


def _sources(req) -> list[tuple[str, dict]]:
    sources: list[tuple[str, dict]] = []
    rf = getattr(req, "response_format", None)
    if rf:
        spec = _from_response_format(rf)
        if spec is not None:
            sources.append(("response_format", spec))
    if req.structured_outputs is not None:
        # vLLM's whitespace / additional-properties switches change nothing here: dropped
        so = {k: v for k, v in req.structured_outputs.items()
              if v is not None and k not in _IGNORED}
        sources.append(("structured_outputs", so))
    for field, kind in _GUIDED.items():
        value = getattr(req, field)
        if value is not None:
            sources.append((field, {kind: value}))
    return sources


def structured_outputs(req) -> Optional[StructuredOutputsParams]:
    """The request's constraint, or None; raises `APIError` (400) naming the field at fault."""
    sources = _sources(req)
    if not sources:
        return None
    if len(sources) > 1:
        names = ", ".join(s for s, _ in sources)
        raise APIError(f"{names}: give at most one of response_format, structured_outputs and "
                       f"guided_*", "invalid_request", sources[1][0])
    field, spec = sources[0]
    try:
        return StructuredOutputsParams.from_value(spec)
    except InvalidRequestError as exc:
        raise APIError(f"{field}: {exc.message}", "invalid_request", field) from None


def param_names(req) -> dict:
    """A replica's error about the constraint names "structured_outputs.<kind>" (a schema
    xgrammar cannot compile): the field the client used instead. Call after
    `structured_outputs` accepted the request."""
    sources = _sources(req)
    if not sources or sources[0][0] == "structured_outputs":
        return {}
    return {f"structured_outputs.{k}": sources[0][0] for k in KINDS}
