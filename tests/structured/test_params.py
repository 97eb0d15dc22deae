"""`StructuredOutputsParams` inside `SamplingParams`: exactly one kind, each checked with an
`InvalidRequestError` naming its field, and a round trip through the wire codec."""

import json

import pytest

from infer_cluster.protocol import InvalidRequestError, SamplingParams, StructuredOutputsParams
from infer_cluster.protocol.messages import SubmitRequest
from infer_cluster.protocol.codec import decode, encode


def test_each_kind_and_its_key():
    so = StructuredOutputsParams(json={"type": "object", "properties": {"b": {}, "a": {}}})
    assert so.kind == "json" and json.loads(so.spec)["type"] == "object"
    # the text is re-serialised (one key for any spacing), key order kept (the output's order)
    same = StructuredOutputsParams(json='{"type":"object",  "properties": {"b": {}, "a": {}}}')
    assert so.cache_key() == same.cache_key()
    other = StructuredOutputsParams(json={"type": "object", "properties": {"a": {}, "b": {}}})
    assert so.cache_key() != other.cache_key()
    assert StructuredOutputsParams(json_object=True).kind == "json_object"
    assert StructuredOutputsParams(regex=r"\d+").spec == r"\d+"
    assert StructuredOutputsParams(choice=("yes", "no")).choice == ["yes", "no"]
    assert StructuredOutputsParams(grammar='root ::= "a"').kind == "grammar"
    assert StructuredOutputsParams(regex="a").cache_key() != StructuredOutputsParams(grammar="a").cache_key()


@pytest.mark.parametrize("kwargs, names", [
    ({}, ["none"]),
    ({"json": {"type": "object"}, "regex": "a"}, ["structured_outputs.json", "structured_outputs.regex"]),
    ({"choice": ["a"], "grammar": "x", "json_object": True},
     ["structured_outputs.json_object", "structured_outputs.choice", "structured_outputs.grammar"]),
])
def test_exactly_one_kind(kwargs, names):
    with pytest.raises(InvalidRequestError, match="exactly one") as err:
        StructuredOutputsParams(**kwargs)
    for n in names:
        assert n in str(err.value)


@pytest.mark.parametrize("kwargs, field", [
    ({"json": "{not json"}, "structured_outputs.json"),
    ({"json": [1, 2]}, "structured_outputs.json"),
    ({"json": 5}, "structured_outputs.json"),
    ({"json": {"x": float("nan")}}, "structured_outputs.json"),
    ({"regex": 5}, "structured_outputs.regex"),
    ({"grammar": ["x"]}, "structured_outputs.grammar"),
    ({"choice": []}, "structured_outputs.choice"),
    ({"choice": ["a", 3]}, "structured_outputs.choice"),
    ({"choice": "ab"}, "structured_outputs.choice"),
    ({"json_object": "yes"}, "structured_outputs.json_object"),
    ({"regex": "a" * 300_000}, "structured_outputs.regex"),
])
def test_bad_values_name_the_field(kwargs, field):
    with pytest.raises(InvalidRequestError, match=field.replace(".", r"\.")):
        StructuredOutputsParams(**kwargs)


def test_sampling_params_carry_it_as_a_map():
    p = SamplingParams(max_tokens=8, structured_outputs={"json": {"type": "integer"}})
    assert isinstance(p.structured_outputs, StructuredOutputsParams)
    d = p.to_dict()
    assert d["structured_outputs"] == {"json": '{"type": "integer"}'}
    back = SamplingParams.from_dict(d)
    assert back == p
    assert SamplingParams().to_dict()["structured_outputs"] is None
    assert SamplingParams.from_dict(SamplingParams().to_dict()) == SamplingParams()


def test_unknown_and_bad_shapes():
    with pytest.raises(InvalidRequestError, match="unknown structured_outputs field"):
        SamplingParams(structured_outputs={"json_schema": {}})
    with pytest.raises(InvalidRequestError, match="structured_outputs must be a map"):
        SamplingParams(structured_outputs="json")


def test_wire_round_trip_of_a_deep_schema():
    schema = {"type": "object", "properties": {"a": {"type": "object", "properties": {
        "b": {"type": "object", "properties": {"c": {"type": "array", "items": {
            "type": "object", "properties": {"d": {"type": "integer"}}}}}}}}}}
    p = SamplingParams(structured_outputs={"json": schema})
    msg = SubmitRequest(request_id="r1", prompt="hi", sampling_params=p.to_dict())
    back = decode(encode(msg))
    assert SamplingParams.from_dict(back.sampling_params).structured_outputs == p.structured_outputs
