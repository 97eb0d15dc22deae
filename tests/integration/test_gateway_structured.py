"""Structured outputs through the real gateway and cluster (tiny-random, whose random weights
leave the mask alone to keep the output valid), asked by the real `openai` client:
`response_format` json_object and json_schema, vLLM's `structured_outputs` and `guided_*` extra
body on chat and completions, streaming; bad ones are a 400 naming the field, whether the
gateway sees the fault (shape) or the replica's compiler does (a schema xgrammar refuses).
And `logit_bias`, whose ids past the vocabulary the replica refuses."""

from __future__ import annotations

import json
import re

import jsonschema
import openai
import pytest

from infer_cluster.client import InferenceClient
from infer_cluster.protocol import SamplingParams

from tests.structured.schemas import BOUNDED

pytestmark = pytest.mark.timeout(300)

MODEL = "tiny-random"
CHAT = [{"role": "user", "content": "Give me JSON."}]


@pytest.fixture(scope="module")
def oai(gateway_cluster):
    client = openai.OpenAI(base_url=f"{gateway_cluster.url}/v1", api_key="unused", max_retries=0,
                           timeout=60)
    yield client
    client.close()


def test_response_format_json_schema(oai):
    schema = BOUNDED["nested"]
    r = oai.chat.completions.create(
        model=MODEL, messages=CHAT, max_tokens=80, temperature=1.0, seed=3, n=2,
        response_format={"type": "json_schema",
                         "json_schema": {"name": "user", "schema": schema, "strict": True}})
    assert len(r.choices) == 2
    for c in r.choices:
        assert c.finish_reason == "stop", c.message.content
        jsonschema.validate(json.loads(c.message.content), schema)


def test_response_format_json_object_streamed(oai):
    stream = oai.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=120, temperature=0,
                                         response_format={"type": "json_object"}, stream=True)
    text, reason = "", None
    for chunk in stream:
        for c in chunk.choices:
            text += c.delta.content or ""
            reason = c.finish_reason or reason
    assert text.startswith("{")
    if reason == "stop":
        assert isinstance(json.loads(text), dict)


def test_vllm_extra_body(oai):
    schema = BOUNDED["enum"]
    r = oai.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=40, temperature=0.9,
                                    seed=1, extra_body={"structured_outputs": {"json": schema}})
    jsonschema.validate(json.loads(r.choices[0].message.content), schema)
    r = oai.completions.create(model=MODEL, prompt="Color:", max_tokens=10, temperature=1.0, seed=2,
                               extra_body={"guided_choice": ["red", "green", "blue"]})
    assert r.choices[0].text in ("red", "green", "blue") and r.choices[0].finish_reason == "stop"
    r = oai.completions.create(model=MODEL, prompt="Id:", max_tokens=20, temperature=1.0, seed=2,
                               extra_body={"guided_regex": r"[A-Z]{2}-\d{3}"})
    assert re.fullmatch(r"[A-Z]{2}-\d{3}", r.choices[0].text)
    r = oai.completions.create(model=MODEL, prompt="Sum:", max_tokens=30, temperature=1.0, seed=5,
                               extra_body={"guided_grammar": 'root ::= [1-9] " + " [1-9]'})
    assert re.fullmatch(r"[1-9] \+ [1-9]", r.choices[0].text)
    r = oai.completions.create(model=MODEL, prompt="x", max_tokens=60, temperature=0,
                               extra_body={"guided_json": BOUNDED["flat"]})
    jsonschema.validate(json.loads(r.choices[0].text), BOUNDED["flat"])


def _bad(call) -> openai.BadRequestError:
    with pytest.raises(openai.BadRequestError) as err:
        call()
    return err.value


@pytest.mark.parametrize("kwargs, param", [
    (dict(response_format={"type": "json_schema"}), "response_format"),
    (dict(response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": 3}}),
     "response_format"),
    (dict(response_format={"type": "xml"}), "response_format"),
    (dict(extra_body={"structured_outputs": {"regex": "a", "choice": ["a"]}}), "structured_outputs"),
    (dict(extra_body={"guided_choice": []}), "guided_choice"),
    (dict(response_format={"type": "json_object"}, extra_body={"guided_regex": "a"}), "guided_regex"),
    # refused by the replica's compiler: named in the words of the request
    (dict(response_format={"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"type": "object", "properties": {"a": {"type": "nope"}}}}}),
     "response_format"),
    (dict(extra_body={"guided_regex": "(unclosed"}), "guided_regex"),
    (dict(extra_body={"structured_outputs": {"grammar": "root ::= missing"}}), "structured_outputs.grammar"),
])
def test_bad_constraints_are_400_naming_the_field(oai, kwargs, param):
    err = _bad(lambda: oai.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=5, **kwargs))
    body = err.body if isinstance(err.body, dict) else {}
    got = body.get("param") or body.get("error", {}).get("param")
    assert got == param, (err.body, err.message)


def test_logit_bias(oai, gateway_cluster):
    r = oai.completions.create(model=MODEL, prompt="Hello", max_tokens=5, temperature=0,
                               logit_bias={"42": 100}, extra_body={"ignore_eos": True})
    with InferenceClient(gateway_cluster.address, name="test-logit-bias") as c:
        ref = c.submit("Hello", SamplingParams(temperature=0, max_tokens=5, ignore_eos=True,
                                               logit_bias={42: 100})).result(timeout=60)
    assert ref.token_ids == [42] * 5 and r.choices[0].text == ref.text
    err = _bad(lambda: oai.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=5,
                                                   logit_bias={"99999999": 5}))
    assert (err.body.get("param") if isinstance(err.body, dict) else None) == "logit_bias", err.body
