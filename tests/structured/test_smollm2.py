"""Structured outputs on the real SmolLM2-135M-Instruct (the packaged GGUF): ten JSON schemas of
different shapes, plus free-text fields the model fills with its own words, each answer parsed
and validated with `jsonschema`; regex full match and choice through the chat template. One
module-scoped `LLM`; json_object, preemption and resumption are tested on tiny-random
(test_tiny_random.py), where the mask alone keeps the output valid."""

import json
import re

import jsonschema
import pytest

from infer_cluster.protocol import SamplingParams
from infer_cluster.worker import LLM

from tests.structured.schemas import BOUNDED

pytestmark = pytest.mark.timeout(600)

MODEL = "smollm2-135m-instruct"

FREE_TEXT = {
    "person": {"type": "object", "properties": {
        "name": {"type": "string", "maxLength": 40}, "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "hobbies": {"type": "array", "items": {"type": "string", "maxLength": 30}, "minItems": 1, "maxItems": 3}},
        "required": ["name", "age", "hobbies"], "additionalProperties": False},
    "city": {"type": "object", "properties": {
        "city": {"type": "string", "maxLength": 40}, "country": {"type": "string", "maxLength": 40},
        "population_millions": {"type": "number"}},
        "required": ["city", "country"], "additionalProperties": False},
}


@pytest.fixture(scope="module")
def llm():
    return LLM(MODEL, num_kv_blocks=256, block_size=16, max_model_len=1024)


def ask(text):
    return [{"role": "user", "content": text}]


def constrained(max_tokens=120, temperature=0.0, seed=None, **kind):
    return SamplingParams(temperature=temperature, max_tokens=max_tokens, seed=seed,
                          structured_outputs=kind)


def test_ten_schemas_validate(llm):
    names = list(BOUNDED)
    assert len(names) == 10
    convs = [ask(f"Answer in JSON with this schema: {json.dumps(BOUNDED[n])}") for n in names]
    params = [constrained(json=BOUNDED[n], max_tokens=60) for n in names]
    outs = llm.chat(convs, params, use_tqdm=False)
    for name, o in zip(names, outs):
        assert o.finish_reason == "stop", (name, o.text)
        jsonschema.validate(json.loads(o.text), BOUNDED[name])


def test_free_text_fields(llm):
    convs = [ask("Describe a made-up person as JSON: name, age and hobbies."),
             ask("Give the capital of France as JSON.")]
    schemas = [FREE_TEXT["person"], FREE_TEXT["city"]]
    outs = llm.chat(convs, [constrained(json=s, max_tokens=80) for s in schemas], use_tqdm=False)
    for schema, o in zip(schemas, outs):
        assert o.finish_reason == "stop", o.text
        jsonschema.validate(json.loads(o.text), schema)
    assert "paris" in json.loads(outs[1].text)["city"].lower()


def test_regex_and_choice(llm):
    outs = llm.chat([ask("What is today's date? Answer as YYYY-MM-DD."),
                     ask("Is the sky blue? Answer yes or no.")],
                    [constrained(regex=r"\d{4}-\d{2}-\d{2}", max_tokens=20),
                     constrained(choice=["yes", "no"], max_tokens=5)], use_tqdm=False)
    assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", outs[0].text) and outs[0].finish_reason == "stop"
    assert outs[1].text in ("yes", "no") and outs[1].finish_reason == "stop"


def test_chat_with_tools(llm):
    """`LLM.chat(tools=)`: SmolLM2's template ignores tools, so they come as a system
    instruction; a regex makes the model write a call, which the gateway's parser reads."""
    from infer_cluster.gateway.tool_parser import parse_tool_calls
    weather = {"type": "function", "function": {
        "name": "get_weather", "description": "Current weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                       "required": ["city"]}}}
    conv = ask("What is the weather in Paris?")
    plain = llm.chat(conv, SamplingParams(max_tokens=1), use_tqdm=False)[0]
    regex = r'<tool_call>\n\{"name": "get_weather", "arguments": \{"city": "[A-Z][a-z]{1,12}"\}\}\n</tool_call>'
    (out,) = llm.chat(conv, constrained(regex=regex, max_tokens=48), use_tqdm=False, tools=[weather])
    prompt = llm.tokenizer.decode(out.prompt_token_ids)
    assert json.dumps(weather) in prompt and len(out.prompt_token_ids) > len(plain.prompt_token_ids) + 50
    content, calls = parse_tool_calls(out.text, {"get_weather"})
    assert out.finish_reason == "stop" and content is None, out.text
    (call,) = calls
    assert json.loads(call["function"]["arguments"]) == {"city": "Paris"}
