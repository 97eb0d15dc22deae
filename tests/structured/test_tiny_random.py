"""Structured outputs on `tiny-random`: with random weights only the grammar's mask keeps the
output valid, so every output must parse and validate whatever the model prefers. JSON schemas
of ten shapes (greedy and sampled), json_object, regex, choice and EBNF; a batch mixing
constrained and free rows; max_tokens mid-structure; preemption and a resumed request (the
matcher rebuilt from the tokens); logprobs of the masked distribution; bad specs refused with
`InvalidRequestError` naming the field before any token."""

import json
import re

import jsonschema
import pytest

from infer_cluster.protocol import InvalidRequestError, SamplingParams, StructuredOutputsParams
from infer_cluster.worker import LLM

from tests.structured.schemas import BOUNDED

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def llm():
    return LLM("tiny-random", num_kv_blocks=64, block_size=16, max_model_len=512)


def so(max_tokens=80, temperature=1.0, seed=None, logprobs=None, **kind):
    return SamplingParams(temperature=temperature, max_tokens=max_tokens, seed=seed,
                          logprobs=logprobs, structured_outputs=kind)


@pytest.mark.parametrize("name", list(BOUNDED))
def test_json_schemas_validate(llm, name):
    schema = BOUNDED[name]
    params = [so(json=schema, temperature=0)] + [so(json=schema, seed=s) for s in range(3)]
    outs = llm.generate(["Hello", "a b c", "{", "The answer"], params, use_tqdm=False)
    for o in outs:
        assert o.finish_reason == "stop", (name, o.text)
        jsonschema.validate(json.loads(o.text), schema)


def test_json_object(llm):
    outs = llm.generate(["x"] * 3, [so(json_object=True, seed=s, max_tokens=200) for s in range(3)],
                        use_tqdm=False)
    done = [o for o in outs if o.finish_reason == "stop"]
    assert done, [o.text for o in outs]  # random weights may ramble on; those that end parse
    for o in done:
        assert isinstance(json.loads(o.text), dict)


def test_regex_choice_and_grammar(llm):
    pattern = r"[a-c]{3}-\d{2}(!|\?)"
    outs = llm.generate(["x"] * 4, [so(regex=pattern, seed=s) for s in range(4)], use_tqdm=False)
    assert all(o.finish_reason == "stop" and re.fullmatch(pattern, o.text) for o in outs), \
        [o.text for o in outs]
    choices = ["red", "green", 'say "hi"\n', "ünï"]
    outs = llm.generate(["x"] * 6, [so(choice=choices, seed=s) for s in range(6)], use_tqdm=False)
    assert all(o.text in choices and o.finish_reason == "stop" for o in outs), [o.text for o in outs]
    grammar = 'root ::= "(" num (" + " num)* ")"\nnum ::= [1-9] [0-9]?'
    outs = llm.generate(["x"] * 3, [so(grammar=grammar, seed=s, max_tokens=100) for s in range(3)],
                        use_tqdm=False)
    for o in outs:
        if o.finish_reason == "stop":
            assert re.fullmatch(r"\([1-9][0-9]?( \+ [1-9][0-9]?)*\)", o.text), o.text


def test_mixed_batch_leaves_free_rows_alone(llm):
    free = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    alone = llm.generate("Hello world", free, use_tqdm=False)[0]
    schema = BOUNDED["flat"]
    outs = llm.generate(["Hello world", "x", "Hello world"], [free, so(json=schema, seed=1), free],
                        use_tqdm=False)
    assert outs[0].token_ids == alone.token_ids == outs[2].token_ids
    jsonschema.validate(json.loads(outs[1].text), schema)


def test_an_lm_head_wider_than_the_tokenizer():
    """small-random-151k: a 512-id tokenizer over a 151,936-row LM head (random weights, so
    most of the mass is on ids without text). The grammar covers the tokenizer's 512 ids only
    (xgrammar would count each id without text as a special token and check it on every accept
    and mask); the ids past it are never drawn, greedy or sampled, batched or not."""
    wide = LLM("small-random-151k", num_kv_blocks=64, block_size=16, max_model_len=256)
    try:
        schema = BOUNDED["flat"]
        params = [so(json=schema, temperature=0), so(json=schema, seed=1)]
        outs = wide.generate(["Hello", "a b c"], params, use_tqdm=False)
        for o in outs:
            assert max(o.token_ids) < 512, o.token_ids
            assert o.finish_reason == "stop", o.text
            jsonschema.validate(json.loads(o.text), schema)
        one = wide.generate("Hello", so(json=schema, temperature=0), use_tqdm=False)[0]
        assert one.token_ids == outs[0].token_ids  # a row's mask alone (no batched fill) agrees
        compiled = wide.engine.structured.pool.compile(StructuredOutputsParams(json=schema))
        assert compiled.tokenizer_info.vocab_size == 512 < wide.engine.spec.vocab_size
    finally:
        wide.close()


def test_max_tokens_mid_structure_ends_length(llm):
    o = llm.generate("x", so(json=BOUNDED["nested"], max_tokens=5, seed=0), use_tqdm=False)[0]
    assert o.finish_reason == "length" and len(o.token_ids) == 5
    assert o.text.startswith("{")


def test_ignore_eos_still_ends_where_the_grammar_does(llm):
    p = SamplingParams(temperature=1.0, seed=2, max_tokens=60, ignore_eos=True,
                       structured_outputs={"choice": ["yes", "no"]})
    o = llm.generate("x", p, use_tqdm=False)[0]
    assert o.finish_reason == "stop" and o.text in ("yes", "no")


def test_logprobs_are_of_the_masked_distribution(llm):
    p = SamplingParams(temperature=0, max_tokens=20, logprobs=5,
                       structured_outputs={"choice": ["alpha", "beta"]})
    o = llm.generate("x", p, use_tqdm=False)[0]
    assert o.text in ("alpha", "beta")
    first = o.logprobs[0]
    allowed = {t for t in first[1] if first[1][t] > float("-inf")}
    texts = {llm.tokenizer.decode([t]) for t in allowed}
    assert all("alpha".startswith(t) or "beta".startswith(t) for t in texts), texts


def test_preempted_requests_stay_valid():
    small = LLM("tiny-random", num_kv_blocks=12, block_size=8, max_model_len=512)
    schema = BOUNDED["array_of_objects"]
    prompts = [[5, 6, 7, 8, 9, 10, 11, 12] * 3 for _ in range(6)]
    params = [so(json=schema, seed=s, max_tokens=60) for s in range(6)]
    outs = small.generate(prompts, params, use_tqdm=False)
    assert small.stats()["num_preemptions"] > 0
    for o in outs:
        assert o.finish_reason == "stop", o.text
        jsonschema.validate(json.loads(o.text), schema)


def test_resumed_request_rebuilds_its_matcher(llm):
    schema = BOUNDED["nested"]
    full = llm.generate("Hello", so(json=schema, temperature=0), use_tqdm=False)[0]
    cut = len(full.token_ids) // 2
    engine = llm.engine
    rid = engine.add_request("Hello", so(json=schema, temperature=0),
                             resume_token_ids=full.token_ids[:cut])
    tokens, reason = [], None
    while reason is None:
        for d in llm.step():
            if d.request_id == rid:
                tokens += d.token_ids
                reason = d.finish_reason or reason
    assert reason == "stop"
    assert full.token_ids[:cut] + tokens == full.token_ids
    jsonschema.validate(json.loads(llm.tokenizer.decode(full.token_ids[:cut] + tokens,
                                                        skip_special_tokens=True)), schema)


@pytest.mark.parametrize("kind, spec", [
    ("json", {"type": "object", "properties": {"a": {"type": "frobnicate"}}}),
    ("regex", "(ab"),
    ("grammar", "root ::= undefined_rule"),
])
def test_bad_specs_are_refused_before_any_token(llm, kind, spec):
    before = llm.stats()["num_generated_tokens"] if "num_generated_tokens" in llm.stats() else None
    with pytest.raises(InvalidRequestError, match=f"structured_outputs\\.{kind}"):
        llm.generate("x", so(**{kind: spec}), use_tqdm=False)
    assert not llm.engine.has_unfinished_requests()
    if before is not None:
        assert llm.stats()["num_generated_tokens"] == before
    ok = llm.generate("x", so(choice=["fine"]), use_tqdm=False)[0]  # and the engine still serves
    assert ok.text == "fine"


def test_compiles_are_cached(llm):
    pool = llm.engine.structured.pool
    schema = {"type": "object", "properties": {"z": {"type": "boolean"}}, "required": ["z"]}
    llm.generate("x", so(json=schema, seed=0), use_tqdm=False)
    n = pool.num_compiled
    llm.generate(["x", "y"], [so(json=dict(schema), seed=1), so(json=json.dumps(schema), seed=2)],
                 use_tqdm=False)
    assert pool.num_compiled == n


def test_async_scheduling_gives_the_same_outputs(monkeypatch):
    """Under async scheduling a step with a constrained row queues its forward at once (its
    input ids read from the step before, on the device) and draws once that step's ids are on
    the host, so the grammar's mask is filled while the forward runs. Same outputs either way."""
    from infer_cluster.worker.engine.inflight import InFlightSteps
    deferred = []
    real = InFlightSteps.launch

    def spy(self, out, runner, sampler, requests, eos, defer_draw=False):
        if defer_draw:
            deferred.append(sum(s.pending_input for s in out.requests))
        return real(self, out, runner, sampler, requests, eos, defer_draw)
    monkeypatch.setattr(InFlightSteps, "launch", spy)
    schema = BOUNDED["optional"]
    prompts = ["Hello", [5, 6, 7], "x y", [9] * 20]
    params = [so(json=schema, seed=1), SamplingParams(temperature=0.7, seed=4, max_tokens=15, ignore_eos=True),
              so(regex=r"\d{3}", temperature=0), so(choice=["up", "down"], seed=3, logprobs=2)]
    kw = dict(num_kv_blocks=64, block_size=16, max_model_len=512)
    want = [(o.token_ids, o.finish_reason) for o in
            LLM("tiny-random", async_scheduling=False, **kw).generate(prompts, params, use_tqdm=False)]
    fast = LLM("tiny-random", async_scheduling=True, **kw)
    assert fast.engine.async_scheduling
    got = [(o.token_ids, o.finish_reason) for o in fast.generate(prompts, params, use_tqdm=False)]
    assert got == want
    assert deferred and sum(deferred) > 0  # deferred draws, with inputs pending on the device


def _slow_compiles(monkeypatch, llm, seconds, fail=False):
    """Every new compile on the pool takes `seconds` (and fails when `fail`)."""
    import time as _time
    pool = llm.engine.structured.pool
    real = pool._compile

    def slow(kind, grammar):
        _time.sleep(seconds)
        if fail:
            raise InvalidRequestError("structured_outputs.json cannot be compiled: test",
                                      param="structured_outputs.json")
        return real(kind, grammar)
    monkeypatch.setattr(pool, "_compile", slow)


def test_a_compiling_request_does_not_hold_up_the_batch(llm, monkeypatch):
    llm.generate("x", so(choice=["warm"]), use_tqdm=False)  # the pool exists
    _slow_compiles(monkeypatch, llm, 0.5)
    engine = llm.engine
    free = engine.add_request("Hello", SamplingParams(temperature=0, max_tokens=40, ignore_eos=True))
    schema = {"type": "object", "properties": {"parked": {"type": "boolean"}}, "required": ["parked"]}
    rid = engine.add_request("x", so(json=schema, seed=0))
    assert engine.request_phase(rid) == "waiting" or rid in engine.structured.parked
    free_tokens_while_parked, text, reason = 0, [], None
    while reason is None:
        parked = rid in engine.structured.parked
        for d in engine.step():
            if d.request_id == free and parked:
                free_tokens_while_parked += len(d.token_ids)
            if d.request_id == rid:
                text += d.token_ids
                reason = d.finish_reason or reason
    assert free_tokens_while_parked > 0  # the free request kept decoding meanwhile
    assert reason == "stop"
    assert json.loads(llm.tokenizer.decode(text, skip_special_tokens=True))["parked"] in (True, False)
    while engine.has_unfinished_requests():
        engine.step()


def test_parked_requests_abort_and_fail_cleanly(llm, monkeypatch):
    llm.generate("x", so(choice=["warm"]), use_tqdm=False)
    engine = llm.engine
    _slow_compiles(monkeypatch, llm, 0.3)
    rid = engine.add_request("x", so(json={"type": "object", "properties": {"aborted": {"type": "null"}}}))
    assert rid in engine.structured.parked and engine.prompt_token_ids(rid)
    assert engine.abort(rid)
    finals = [d for d in engine.step() if d.request_id == rid]
    assert [d.finish_reason for d in finals] == ["abort"]
    _slow_compiles(monkeypatch, llm, 0.05, fail=True)
    rid = engine.add_request("x", so(json={"type": "object", "properties": {"failing": {"type": "null"}}}))
    finals = []
    while engine.has_unfinished_requests():
        finals += [d for d in engine.step() if d.request_id == rid]
    assert [d.finish_reason for d in finals] == ["error"]
    assert finals[0].error["code"] == "invalid_request" and "structured_outputs.json" in finals[0].error["message"]


def test_with_penalties_logprobs_stop_strings_and_top_k(llm):
    schema = BOUNDED["array_of_objects"]
    ps = [SamplingParams(temperature=0.8, top_k=20, top_p=0.9, seed=1, max_tokens=80,
                         repetition_penalty=1.3, presence_penalty=0.5, frequency_penalty=0.3,
                         structured_outputs={"json": schema}),
          SamplingParams(temperature=0, max_tokens=80, logprobs=3, no_repeat_ngram_size=3,
                         structured_outputs={"json": schema}),
          SamplingParams(temperature=1.0, seed=5, max_tokens=80, min_tokens=3,
                         structured_outputs={"json": schema})]
    for o in llm.generate(["x", "y", "z"], ps, use_tqdm=False):
        assert o.finish_reason == "stop", o.text
        jsonschema.validate(json.loads(o.text), schema)
    # a stop string ends the text inside the structure, as it would any text
    o = llm.generate("x", SamplingParams(temperature=0, max_tokens=80, stop=['"k"'],
                                         structured_outputs={"json": schema}), use_tqdm=False)[0]
    assert o.finish_reason == "stop" and o.text == "[{"


def test_bans_go_through_the_mask_and_never_empty_it(llm):
    # min_tokens holds EOS back while the grammar can go on ...
    o = llm.generate("x", SamplingParams(temperature=0, max_tokens=30, min_tokens=4,
                                         structured_outputs={"regex": "a{1,8}"}), use_tqdm=False)[0]
    assert o.finish_reason == "stop" and re.fullmatch("a{1,8}", o.text) and len(o.token_ids) >= 4
    # ... but not where the grammar allows only the end: the grammar wins
    o = llm.generate("x", SamplingParams(temperature=0, max_tokens=30, min_tokens=10,
                                         structured_outputs={"choice": ["x"]}), use_tqdm=False)[0]
    assert o.finish_reason == "stop" and o.text == "x"
