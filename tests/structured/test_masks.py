"""The mask step and the grammar state on tiny-random's tokenizer (worker/structured/): bans
cleared from a mask never empty it; masks filled ahead on a helper thread (async scheduling)
give synchronous decoding's outputs and are never used for states that moved; a state rolls
back to where a verify step's kept tokens part from its proposals; proposals are cut to what
the grammar allows; rows sharing a state (a verify step's positions) are filled in rounds."""

import pytest
import torch

from infer_cluster.protocol import SamplingParams
from infer_cluster.worker import LLM

from tests.structured.schemas import BOUNDED
from tests.structured.test_tiny_random import so

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def llm():
    return LLM("tiny-random", num_kv_blocks=64, block_size=16, max_model_len=512)


def test_clear_bans_keeps_one_allowed_token():
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
        assert torch.equal(mask(state), mask(fresh))
    assert not resets
    far = new_state()
    assert far.sync(path[:90])
    assert 90 - state_module.HISTORY > 5
    assert far.sync(path[:5] + [path[40]]) and far.num_accepted == 6  # parts before the window: rebuilt
    fresh = new_state()
    assert fresh.sync(path[:5] + [path[40]])
    assert torch.equal(mask(far), mask(fresh))


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
    assert state.num_accepted == 1 and torch.equal(mask(state), mask(_synced(new_state(), ids[:1])))
    assert grammar_prefix(new_state(), [], []) == [] and torch.equal(mask(new_state()), before)


def _synced(state, tokens):
    assert state.sync(tokens)
    return state


def test_rows_sharing_a_state_fill_in_rounds(llm):
    """A verify step's positions of one request share its state (worker/spec_decode/verify.py
    `expand_rows`). With 9 such requests of 4 positions each, `GrammarMasks` fills round by round
    (round j: every request's j-th row, batched from 8 rows), and every row's mask is what a
    state of its own gives for that row's tokens; afterwards each state rolls back to the tokens
    a request keeps."""
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
