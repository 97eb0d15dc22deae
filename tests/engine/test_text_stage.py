"""Text off the step: a `TextWorker` thread one step behind the engine gives the client exactly
what the inline engine gives (tokens, text, finish reason, one final per request), and a
request stopped by a stop string costs at most one extra engine step. With a `HostIdle` gate
the thread runs its batches while the engine's thread waits, and never starves."""

from __future__ import annotations

import threading
import time

import pytest

from infer_cluster.protocol import RequestOutput, SamplingParams
from infer_cluster.worker.config import EngineConfig
from infer_cluster.worker.engine.engine import DynamicEngine
from infer_cluster.worker.text.host_idle import HostIdle
from infer_cluster.worker.text.text_stage import TextStage, TextWorker

pytestmark = pytest.mark.timeout(120)

PROMPTS = ["Once upon a time", "The quick brown fox", "Hello", "In a hole in the ground", "Numbers: 1 2 3"]


@pytest.fixture(scope="module")
def engines():
    inline = DynamicEngine(EngineConfig(model="tiny-random", num_kv_blocks=256))
    raw = DynamicEngine(EngineConfig(model="tiny-random", num_kv_blocks=256), detokenize=False)
    return inline, raw


def _inline_outputs(engine, params_list):
    outs = {}
    for i, (prompt, params) in enumerate(zip(PROMPTS, params_list)):
        rid = engine.add_request(prompt, params, request_id=f"r{i}")
        outs[rid] = RequestOutput(rid, engine.prompt_token_ids(rid))
    finals = {}
    while engine.has_unfinished_requests():
        for d in engine.step():
            outs[d.request_id].apply(d)
            if d.finish_reason is not None:
                finals[d.request_id] = finals.get(d.request_id, 0) + 1
    return outs, finals


def _threaded_outputs(engine, params_list, gated: bool = False):
    """`gated`: the engine opens a `HostIdle` gate while it waits, and the worker waits for it
    far longer than any test runs (so a batch runs only inside the engine's waits)."""
    outs, finals, steps_after_final = {}, {}, {}
    def emit(deltas, _extra):
        for d in deltas:
            outs[d.request_id].apply(d)
            if d.finish_reason is not None:
                finals[d.request_id] = finals.get(d.request_id, 0) + 1
    worker = TextWorker(TextStage(engine.tokenizer, engine.byte_table), emit,
                        idle=HostIdle() if gated else None)
    if gated:
        worker.IDLE_WAIT_S = 60.0
        engine.host_idle = worker.idle
    worker.start()
    try:
        for i, (prompt, params) in enumerate(zip(PROMPTS, params_list)):
            rid = engine.add_request(prompt, params, request_id=f"r{i}")
            outs[rid] = RequestOutput(rid, engine.prompt_token_ids(rid))
            worker.add(rid, engine.prompt_token_ids(rid), params.stop, ())
        while engine.has_unfinished_requests():
            assert worker.wait_until_behind(1)
            engine.stop_requests(worker.take_stops())
            running = set(engine.scheduler.requests)
            for rid in running:
                if rid in finals:  # the client already has its final: this step is waste
                    steps_after_final[rid] = steps_after_final.get(rid, 0) + 1
            worker.submit(engine.step())
        assert worker.flush(5.0)
        assert worker.error is None
        assert len(worker.stage) == 0, "text state left behind"
    finally:
        worker.close()
        engine.host_idle = None
    return outs, finals, steps_after_final


def _params(stops):
    return [SamplingParams(temperature=0.0, max_tokens=m, ignore_eos=True, stop=s)
            for m, s in zip((24, 30, 8, 16, 20), stops)]


@pytest.mark.parametrize("gated", [False, True], ids=["free", "gated"])
@pytest.mark.parametrize("stop_of", ["none", "first_chars", "mixed"])
def test_threaded_text_equals_inline(engines, stop_of, gated):
    inline, raw = engines
    # Stop strings taken from each prompt's own greedy output, so they really fire.
    base, _ = _inline_outputs(inline, _params([[]] * 5))
    texts = [base[f"r{i}"].text for i in range(5)]
    if stop_of == "none":
        stops = [[]] * 5
    elif stop_of == "first_chars":
        stops = [[t[3:6]] if len(t) > 6 else [] for t in texts]
    else:  # one on the last token's text (the max_tokens edge), one never found, one early
        stops = [[texts[0][-2:]], ["zzzz never"], [texts[2][1:3]], [], [texts[4][5:7], "qq"]]
    params = _params(stops)
    want, want_finals = _inline_outputs(inline, params)
    got, got_finals, waste = _threaded_outputs(raw, params, gated)
    assert got_finals == want_finals == {f"r{i}": 1 for i in range(5)}
    for rid in want:
        assert got[rid].token_ids == want[rid].token_ids, rid
        assert got[rid].text == want[rid].text, rid
        assert got[rid].finish_reason == want[rid].finish_reason, rid
    assert all(n <= 1 for n in waste.values()), waste
    for outs in (want, got):  # every final carries metrics, also one a stop string made
        for rid, o in outs.items():
            m = o.metrics
            assert m is not None and m.finish_time is not None, rid
            assert m.arrival_time <= m.first_scheduled_time <= m.first_token_time <= m.finish_time, m
    if stop_of != "none":
        assert any(o.finish_reason == "stop" for o in want.values())
    st = raw.stats()
    assert st["num_free_blocks"] == st["num_total_blocks"]


def test_deferred_logprobs_are_built_by_the_text_stage(engines):
    """With `defer_logprobs` the engine's raw deltas carry unbuilt entries; the text thread
    builds them, and the client gets the same logprobs as from the inline engine."""
    from infer_cluster.worker.text.logprob_rows import DeferredLogprob
    inline, raw = engines
    params = [SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True, logprobs=n)
              for n in (0, 1, 3, 5, None)]
    want, _ = _inline_outputs(inline, params)
    raw.defer_logprobs = True
    try:
        rid = raw.add_request(PROMPTS[0], params[3], request_id="peek")
        first = [d for d in raw.step() if d.request_id == rid]
        assert first and type(first[0].logprobs[0]) is DeferredLogprob
        raw.abort(rid)
        while raw.has_unfinished_requests():
            raw.step()
        got, _, _ = _threaded_outputs(raw, params)
    finally:
        raw.defer_logprobs = False
    for i, n in enumerate((0, 1, 3, 5, None)):
        w, g = want[f"r{i}"].logprobs, got[f"r{i}"].logprobs
        if n is None:
            assert w is None and g is None
            continue
        assert len(g) == len(w) == 6
        for (w_lp, w_alts), (g_lp, g_alts) in zip(w, g):
            assert g_lp == w_lp and g_alts == w_alts and len(g_alts) == n


def test_logprob_bytes_name_the_sampled_token_and_each_alternative(engines):
    """With `logprob_bytes` each entry gets `{token_id: bytes}`: the bytes that, joined over the
    sampled tokens, are the request's text; a request without it keeps two-item entries."""
    from infer_cluster.worker.text.token_bytes import TokenBytes
    inline, _ = engines
    with_bytes = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True, logprobs=3,
                                logprob_bytes=True)
    plain = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True, logprobs=3)
    outs, _ = _inline_outputs(inline, [with_bytes, plain])
    named, unnamed = outs["r0"], outs["r1"]
    assert len(named.logprobs) == 6 and all(len(e) == 2 for e in unnamed.logprobs)
    names = TokenBytes(inline.tokenizer, inline.byte_table)
    for tid, (lp, alts, got) in zip(named.token_ids, named.logprobs):
        assert set(got) == {tid, *alts} and len(alts) == 3
        assert all(got[t] == names.get(t) for t in got)
    joined = b"".join(e[2][t] for t, e in zip(named.token_ids, named.logprobs))
    assert joined.decode("utf-8", errors="replace") == named.text
    # special tokens by their literal text (the byte table maps them to nothing)
    eos = inline.tokenizer.eos_token_id
    assert names.get(eos) == inline.tokenizer.convert_ids_to_tokens(eos).encode()
    assert names.get(len(inline.tokenizer) + 5) is None  # past the tokenizer's vocabulary
    # without a byte table: each id decoded alone, the same entries' shape
    decoded = TokenBytes(inline.tokenizer)
    t, alts = named.token_ids[0], named.logprobs[0][1]
    assert decoded.entry_bytes(t, alts) == {
        i: inline.tokenizer.decode([i], skip_special_tokens=False).encode() for i in (t, *alts)}


def test_metrics_ride_on_the_final_only_and_a_stop_string_final_gets_them(engines):
    inline, _ = engines
    from infer_cluster.protocol import RequestDelta, RequestMetrics
    stage = TextStage(inline.tokenizer, inline.byte_table)
    ids = inline.tokenizer.encode("abc abc abc")
    stage.add("s", [1, 2], stop=["abc"])
    stage.add("t", [1, 2])
    first = RequestMetrics(1.0, 2.0, 3.0)
    out, _ = stage.process([RequestDelta("s", ids[:1], metrics=first),
                            RequestDelta("t", ids[:1], metrics=RequestMetrics(1.5, 2.5, 3.5))])
    assert [d.metrics for d in out] == [None, None]  # kept back until the final
    out, stops = stage.process([RequestDelta("s", ids[1:4])])
    assert stops == ["s"] and out[0].finish_reason == "stop"
    m = out[0].metrics
    assert (m.arrival_time, m.first_scheduled_time, m.first_token_time) == (1.0, 2.0, 3.0)
    assert m.finish_time is not None and m.finish_time >= 3.0
    engine_final = RequestMetrics(1.5, 2.5, 3.5, 4.5)
    out, _ = stage.process([RequestDelta("t", [], finish_reason="length", metrics=engine_final)])
    assert out[0].metrics == engine_final  # the engine's own final keeps its metrics


def test_unregistered_final_passes_through_and_stopped_request_is_swallowed(engines):
    inline, _ = engines
    stage = TextStage(inline.tokenizer, inline.byte_table)
    from infer_cluster.protocol import RequestDelta
    refused = RequestDelta("never-added", finish_reason="error", error={"code": "x", "message": "m"})
    out, stops = stage.process([refused])
    assert out == [refused] and stops == []
    ids = inline.tokenizer.encode("abc abc abc")
    stage.add("s", [1, 2], stop=["abc"])
    out, stops = stage.process([RequestDelta("s", ids[:4], num_prompt_tokens=2)])
    assert stops == ["s"] and out[0].finish_reason == "stop" and "abc" not in out[0].text
    assert out[0].metrics is None  # the engine sent none for "s" (no first-token delta seen)
    # the engine's next delta and its final for "s" are not the client's business any more
    out, stops = stage.process([RequestDelta("s", ids[4:5]), RequestDelta("s", [], finish_reason="stop")])
    assert out == [] and stops == [] and len(stage) == 0


def _gated_worker(engine, wait_s: float):
    """A gated worker whose emitted batches set `emitted`; one request registered."""
    emitted = threading.Event()
    worker = TextWorker(TextStage(engine.tokenizer, engine.byte_table), lambda d, _x: emitted.set(),
                        idle=HostIdle())
    worker.IDLE_WAIT_S = wait_s
    worker.start()
    worker.add("g", [1, 2], [], ())
    return worker, emitted


def test_gated_text_runs_when_the_engine_waits(engines):
    from infer_cluster.protocol import RequestDelta
    inline, _ = engines
    worker, emitted = _gated_worker(inline, wait_s=60.0)
    try:
        worker.submit([RequestDelta("g", [5])])
        assert not emitted.wait(0.3), "a batch ran while the engine's thread was busy"
        with worker.idle.idle():  # the engine waits on the device
            assert emitted.wait(5.0)
        emitted.clear()
        worker.submit([RequestDelta("g", [6])])
        assert worker.wait_until_behind(0, timeout=5.0)  # waiting for the text thread opens it too
        assert emitted.is_set()
    finally:
        worker.close()
    assert not worker.is_alive()


def test_gated_text_is_never_starved(engines):
    """An engine that never waits (host-bound, or idle): each batch still runs, IDLE_WAIT_S late."""
    from infer_cluster.protocol import RequestDelta
    inline, _ = engines
    worker, emitted = _gated_worker(inline, wait_s=0.05)
    try:
        t = time.monotonic()
        worker.submit([RequestDelta("g", [5])])
        assert emitted.wait(5.0)
        assert time.monotonic() - t >= 0.04
    finally:
        worker.close()


def test_engine_opens_the_gate_while_it_collects_a_step(engines):
    _, raw = engines
    idle = HostIdle()
    seen, stop = [], threading.Event()

    def watch():
        while not stop.is_set():
            if idle.wait_open(0.05):
                seen.append(True)
                time.sleep(0.001)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    raw.host_idle = idle
    try:
        raw.add_request(PROMPTS[0], SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True),
                        request_id="gate")
        while raw.has_unfinished_requests():
            raw.step()
    finally:
        raw.host_idle = None
        stop.set()
        watcher.join(5.0)
    assert seen, "the engine never opened its idle gate"
    assert not idle.wait_open(0.0)  # closed again once the engine went on
