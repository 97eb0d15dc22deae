"""A step that fails part-way (scheduling, the scheduler update, or detokenizing) still gives
every request exactly one final delta, frees its KV blocks, and the engine keeps serving."""

import pytest

from infer_cluster.protocol import SamplingParams
from infer_cluster.worker import LLM


@pytest.fixture(scope="module")
def llm():
    return LLM("tiny-random", num_kv_blocks=64, block_size=16)


def greedy(n):
    return SamplingParams(temperature=0, max_tokens=n, ignore_eos=True)


def drain(llm, rids, max_steps=200):
    finals = {rid: 0 for rid in rids}
    for _ in range(max_steps):
        for d in llm.step():
            if d.finished and d.request_id in finals:
                finals[d.request_id] += 1
        if not llm.has_unfinished_requests():
            break
    return finals


def fail_once(monkeypatch, obj, name, after_real_call):
    real = getattr(obj, name)
    state = {"armed": True}

    def wrapper(*args, **kwargs):
        result = real(*args, **kwargs) if after_real_call else None
        if state["armed"]:
            state["armed"] = False
            raise RuntimeError(f"injected failure in {name}")
        return result if after_real_call else real(*args, **kwargs)

    monkeypatch.setattr(obj, name, wrapper)


@pytest.mark.parametrize("target,after", [("schedule", False), ("update", True)])
def test_failed_step_ends_every_request_once(llm, monkeypatch, target, after):
    # one request finishes in the very step that fails (max_tokens=1 after its prefill)
    rids = [llm.add_request([5, 6, 7], greedy(1)), llm.add_request([8, 9], greedy(30)),
            llm.add_request([10, 11, 12, 13], greedy(30))]
    fail_once(monkeypatch, llm.engine.scheduler, target, after)
    finals = drain(llm, rids)
    assert finals == {rid: 1 for rid in rids}
    stats = llm.stats()
    assert stats["num_free_blocks"] == stats["num_total_blocks"]
    out = llm.generate([[1, 2, 3]], greedy(4), use_tqdm=False)[0]
    assert out.finish_reason == "length" and len(out.token_ids) == 4


def test_delta_failure_keeps_finals_already_built(llm, monkeypatch):
    rids = [llm.add_request([5, 6, 7], greedy(1)), llm.add_request([8, 9], greedy(1)),
            llm.add_request([10, 11], greedy(20))]
    real = llm.engine._emit
    calls = {"n": 0}

    def flaky(req, logprob):
        calls["n"] += 1
        if calls["n"] == 2:
            raise RuntimeError("injected delta failure")
        return real(req, logprob)

    monkeypatch.setattr(llm.engine, "_emit", flaky)
    finals = drain(llm, rids)
    assert finals == {rid: 1 for rid in rids}
    stats = llm.stats()
    assert stats["num_free_blocks"] == stats["num_total_blocks"]


def test_detokenizer_failure_ends_only_that_request(llm, monkeypatch):
    """A tokenizer that raises on one request's tokens ends that request with an error final;
    the engine stops computing it and the others finish normally."""
    rids = [llm.add_request([5, 6, 7], greedy(6)), llm.add_request([8, 9], greedy(6))]
    bad = llm.engine.text._detok[rids[0]]

    def broken(token_ids, final=False):
        raise UnicodeError("injected tokenizer failure")

    monkeypatch.setattr(bad, "push", broken)
    outs = {}
    for _ in range(20):
        for d in llm.step():
            if d.finish_reason is not None:
                assert d.request_id not in outs
                outs[d.request_id] = d
        if not llm.has_unfinished_requests():
            break
    assert outs[rids[0]].finish_reason == "error" and "injected" in outs[rids[0]].error["message"]
    assert outs[rids[1]].finish_reason == "length"
    stats = llm.stats()
    assert stats["num_free_blocks"] == stats["num_total_blocks"]


def test_generate_reports_engine_errors_instead_of_hanging(llm, monkeypatch):
    fail_once(monkeypatch, llm.engine.runner, "execute", after_real_call=False)
    outs = llm.generate([[5, 6], [7, 8]], greedy(5), use_tqdm=False)
    assert [o.finish_reason for o in outs] == ["error", "error"]
    assert outs[0].error["code"] == "engine"


def test_request_failed_at_admission_gets_one_final(llm, monkeypatch):
    """If the scheduler cannot place a request even with nothing running, it fails it; the
    engine must still send that request's final delta (once)."""
    rid = llm.add_request([5, 6, 7], greedy(3))
    monkeypatch.setattr(llm.engine.allocator, "can_allocate", lambda n: False)
    finals = drain(llm, [rid], max_steps=5)
    assert finals == {rid: 1}
    monkeypatch.undo()
    assert not llm.has_unfinished_requests()
    assert llm.generate([[1, 2]], greedy(2), use_tqdm=False)[0].finish_reason == "length"
