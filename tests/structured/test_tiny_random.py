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


def test_clear_bans_keeps_one_allowed_token():
    import torch

    from infer_cluster.worker.structured.bitmask import _clear_bans
    row = torch.zeros(2, dtype=torch.int32)
    row[0] = (1 << 3) | (1 << 5)  # tokens 3 and 5
    row[1] = 1 << 2  # token 34
    _clear_bans(row, {3, 34, 40}, 64)
    assert row.tolist() == [1 << 5, 0]
    _clear_bans(row, {5}, 64)  # the last allowed token: kept
    assert row.tolist() == [1 << 5, 0]


def test_many_constrained_rows_fill_ahead_with_the_same_outputs(monkeypatch):
    """With async scheduling the matchers of a deferred draw take their new tokens and its
    masks are filled on a helper thread while the next step is scheduled (`GrammarMasks.prefill`,
    from eight rows up); the outputs are those of synchronous decoding, and the filled-ahead
    rows are used."""
    from infer_cluster.worker.structured.bitmask import BATCH_FILL_MIN_ROWS, GrammarMasks
    used = []
    real_prefill, real_join = GrammarMasks.prefill, GrammarMasks.join

    def join(self):
        pre = real_join(self)
        if pre is not None:
            used.append(len(pre[2]))
        return pre
    monkeypatch.setattr(GrammarMasks, "join", join)
    import threading

    import xgrammar as xgr
    fills, real_fill = [], xgr.BatchGrammarMatcher.batch_fill_next_token_bitmask

    import sys
    intervals = set()  # the interpreter's thread switch interval while the helper fills

    def fill(self, *a, **kw):
        fills.append(threading.current_thread() is threading.main_thread())
        if not fills[-1]:
            intervals.add(sys.getswitchinterval())
        return real_fill(self, *a, **kw)
    monkeypatch.setattr(xgr.BatchGrammarMatcher, "batch_fill_next_token_bitmask", fill)
    accepts, real_accept = [], xgr.GrammarMatcher.accept_token

    def accept(self, *a, **kw):  # one token of one row: on the main thread, the rare path
        accepts.append(threading.current_thread() is threading.main_thread())
        return real_accept(self, *a, **kw)
    monkeypatch.setattr(xgr.GrammarMatcher, "accept_token", accept)
    schema = BOUNDED["flat"]
    n = BATCH_FILL_MIN_ROWS + 4
    prompts = [[3 + i, 7, 9 + i] for i in range(n)] + ["free"]
    params = [so(json=schema, seed=i, temperature=0 if i % 3 == 0 else 1.0) for i in range(n)]
    params.append(SamplingParams(temperature=0, max_tokens=20, ignore_eos=True))
    kw = dict(num_kv_blocks=128, block_size=16, max_model_len=512)
    want = [(o.token_ids, o.finish_reason) for o in
            LLM("tiny-random", async_scheduling=False, **kw).generate(prompts, params, use_tqdm=False)]
    fills.clear(), accepts.clear()  # the synchronous engine does both on the main thread
    before = sys.getswitchinterval()
    fast = LLM("tiny-random", async_scheduling=True, **kw)
    got = [(o.token_ids, o.finish_reason) for o in fast.generate(prompts, params, use_tqdm=False)]
    fast.close()
    assert got == want
    assert used and max(used) >= BATCH_FILL_MIN_ROWS
    # the helper filled with the short switch interval; the interpreter's is back afterwards
    from infer_cluster.worker.structured.bitmask import FILL_SWITCH_INTERVAL_S
    assert intervals and all(abs(i - FILL_SWITCH_INTERVAL_S) < 1e-6 for i in intervals), intervals
    assert sys.getswitchinterval() == before
    assert real_prefill is GrammarMasks.prefill
    # the helper advanced the matchers and filled: the draws used its masks as they were
    # and advanced the matchers there too (a token at a time on the main thread only where a
    # stop token may end a grammar, or before the first fill ahead)
    total = sum(len(ids) for ids, _ in got[:n])
    print("batch fills on the main thread / the helper:", fills.count(True), fills.count(False),
          "; accepts one by one on the main thread:", accepts.count(True), "of", total)
    assert fills.count(False) >= 5 and fills.count(True) <= 1, fills
    assert accepts.count(True) <= 2 * n < total, (accepts.count(True), total)


def test_a_fill_ahead_from_stale_states_is_not_used():
    """A state that moved after `prefill` (or a different row count) is filled again in
    `apply`: the mask is always that of the states the draw sees."""
    import torch
    from infer_cluster.worker.sampling.draw_io import SamplingRequestState
    from infer_cluster.worker.structured.bitmask import BATCH_FILL_MIN_ROWS, GrammarMasks
    from infer_cluster.worker.structured.state import GrammarState
    llm = LLM("tiny-random", num_kv_blocks=16, block_size=16, max_model_len=128)
    n = BATCH_FILL_MIN_ROWS
    params = SamplingParams(temperature=0, structured_outputs={"choice": ["alpha", "beta", "gamma"]})
    compiled = llm.engine.structured.compile(params).result()
    states = [GrammarState(compiled) for _ in range(n)]
    outputs = [[] for _ in range(n)]
    first = llm.tokenizer.encode("gamma", add_special_tokens=False)[0]
    rows = [SamplingRequestState(params, [1], outputs[i], None, (0,), f"r{i}", 0, states[i]) for i in range(n)]
    masks = GrammarMasks()
    masks.prefill([(i, states[i], outputs[i]) for i in range(n)], n, torch.device("cpu"))
    outputs[0].append(first)  # row 0 moves on after the fill ahead
    got = torch.zeros(n, llm.engine.spec.vocab_size)
    masks.apply(got, rows, list(range(n)))
    want = torch.zeros(n, llm.engine.spec.vocab_size)
    GrammarMasks().apply(want, rows, list(range(n)))
    assert torch.equal(got.isinf(), want.isinf())
    assert not torch.equal(got[0].isinf(), got[1].isinf())  # row 0's mask is past "g..."
    masks.close()
    llm.close()


def _state_and_mask(llm, spec: dict):
    """(a fresh `GrammarState` for `spec`, a function giving a state's mask as a bool row)."""
    import torch
    from infer_cluster.worker.structured.state import GrammarState
    compiled = llm.engine.structured.compile(SamplingParams(structured_outputs=spec)).result()

    def mask(state) -> torch.Tensor:
        bits = torch.zeros(1, (state.vocab_size + 31) // 32, dtype=torch.int32)
        state.fill(bits, 0)
        return torch.tensor([(int(bits[0, t // 32]) >> (t % 32)) & 1 for t in range(state.vocab_size)], dtype=torch.bool)

    return (lambda: GrammarState(compiled)), mask


def _allowed_path(llm, spec: dict, length: int) -> list[int]:
    """`length` tokens the grammar accepts, each the lowest allowed id after the ones before."""
    new_state, mask = _state_and_mask(llm, spec)
    state, tokens = new_state(), []
    for _ in range(length):
        allowed = [t for t in mask(state).nonzero().flatten().tolist() if t not in state.stop_ids]
        tokens.append(allowed[0])
        assert state.sync(tokens)
    return tokens


def test_a_state_rolls_back_to_where_the_tokens_part(llm):
    """A speculative verify step leaves a request's state after all of its proposals; the next
    sync with the tokens kept rolls the matcher back to where they part (no rebuild) and gives
    the mask a fresh state gives for those tokens. Where they part before the remembered window,
    the state is rebuilt, with the same result."""
    from infer_cluster.worker.structured import state as state_module
    spec = {"regex": r"([ab][cd][ef][gh] ){1,40}"}  # each position its own mask
    new_state, mask = _state_and_mask(llm, spec)
    path = _allowed_path(llm, spec, 90)
    state = new_state()
    assert state.sync(path[:40])
    resets = []
    state.matcher.reset = lambda: resets.append(1)  # a rebuild would call it
    for kept in ([*path[:37], path[2]], path[:30], path[:40]):  # rejected tail, then shorter, longer
        assert state.sync(kept) and state.num_accepted == len(kept)
        fresh = new_state()
        assert fresh.sync(kept)
        assert torch_equal(mask(state), mask(fresh))
    assert not resets
    far = new_state()
    assert far.sync(path[:90])
    assert 90 - state_module.HISTORY > 5
    assert far.sync(path[:5] + [path[40]]) and far.num_accepted == 6  # parts before the window: rebuilt
    fresh = new_state()
    assert fresh.sync(path[:5] + [path[40]])
    assert torch_equal(mask(far), mask(fresh))


def torch_equal(a, b) -> bool:
    import torch
    return torch.equal(a, b)


def test_grammar_prefix_keeps_what_the_grammar_allows(llm):
    """Proposals are cut at the first token the grammar refuses and before a stop token, and
    the state is left where the request's tokens put it."""
    from infer_cluster.worker.structured.state import grammar_prefix
    spec = {"choice": ["alpha beta gamma", "delta"]}
    new_state, mask = _state_and_mask(llm, spec)
    ids = llm.tokenizer.encode("alpha beta gamma", add_special_tokens=False)
    assert len(ids) >= 3
    state = new_state()
    before = mask(new_state())
    stop = next(iter(state.stop_ids))
    assert grammar_prefix(state, [], ids) == ids  # the whole choice
    assert grammar_prefix(state, [], ids + [stop, ids[0]]) == ids  # never past a stop token
    assert grammar_prefix(state, ids[:1], ids[1:2] + ids[:1]) == ids[1:2]  # cut at a refused token
    assert grammar_prefix(state, ids[:1], ids[:1]) == []
    assert state.num_accepted == 1 and torch_equal(mask(state), mask(_synced(new_state(), ids[:1])))
    assert grammar_prefix(new_state(), [], []) == [] and torch_equal(mask(new_state()), before)


def _synced(state, tokens):
    assert state.sync(tokens)
    return state


def test_rows_sharing_a_state_fill_in_rounds(llm):
    """A verify step's positions of one request share its state (worker/spec_decode/verify.py
    `expand_rows`). With 9 such requests of 4 positions each, `GrammarMasks` fills round by round
    (round j: every request's j-th row, batched from 8 rows), and every row's mask is what a
    state of its own gives for that row's tokens; afterwards each state rolls back to the tokens
    a request keeps."""
    import torch
    from infer_cluster.worker.sampling.draw_io import SamplingRequestState
    from infer_cluster.worker.structured.bitmask import BATCH_FILL_MIN_ROWS, GrammarMasks
    spec = {"regex": r"([ab][cd][ef][gh] ){1,40}"}
    new_state, _ = _state_and_mask(llm, spec)
    path = _allowed_path(llm, spec, 40)
    params = SamplingParams(temperature=0, structured_outputs=spec)
    requests = 9
    assert requests >= BATCH_FILL_MIN_ROWS
    rows, states = [], []
    for r in range(requests):
        state = new_state()
        states.append(state)
        output, proposals = path[:r + 3], path[r + 3:r + 6]
        for j in range(len(proposals) + 1):
            rows.append(SamplingRequestState(params, [1], output + proposals[:j], None, (0,), grammar=state))
    vocab = llm.engine.spec.vocab_size
    got = torch.zeros(len(rows), vocab)
    GrammarMasks().apply(got, rows, list(range(len(rows))))
    for i, row in enumerate(rows):
        alone = SamplingRequestState(params, [1], row.output_token_ids, None, (0,), grammar=new_state())
        want = torch.zeros(1, vocab)
        GrammarMasks().apply(want, [alone], [0])
        assert torch.equal(got[i].isinf(), want[0].isinf()), f"row {i}"
    for r, state in enumerate(states):  # left after the last proposal; one kept, then a draw
        assert state.num_accepted == r + 6
        kept = path[:r + 4] + [path[r + 4]]
        assert state.sync(kept) and state.num_accepted == r + 5
