"""The offline `LLM` surface on the embedded `tiny-random` model: outputs, stop rules,
seeded sampling, aborts, and bad input that fails with a typed error while the engine keeps
serving the other requests."""

import pytest

from infer_cluster.protocol import (InvalidRequestError, ModelNotFoundError, OutOfMemoryError, SamplingParams)
from infer_cluster.worker import LLM


@pytest.fixture(scope="module")
def llm():
    return LLM("tiny-random", num_kv_blocks=64, block_size=16, max_model_len=512)


def greedy(n=12, **kw):
    return SamplingParams(temperature=0, max_tokens=n, ignore_eos=True, **kw)


def run_to_end(llm, rids):
    pending, finals = set(rids), {}
    while pending:
        for d in llm.step():
            if d.finished and d.request_id in pending:
                pending.discard(d.request_id)
                finals[d.request_id] = d
    return finals


def test_generate_strings_and_token_ids(llm):
    outs = llm.generate(["Hello world", [5, 6, 7, 8]], greedy(), use_tqdm=False)
    assert [len(o.token_ids) for o in outs] == [12, 12]
    assert outs[0].prompt_token_ids == llm.tokenizer.encode("Hello world")
    assert outs[1].prompt_token_ids == [5, 6, 7, 8]
    assert outs[0].text == llm.tokenizer.decode(outs[0].token_ids, skip_special_tokens=True)
    assert all(o.finish_reason == "length" for o in outs)
    assert outs[0].request_id != outs[1].request_id


def test_per_prompt_sampling_params(llm):
    outs = llm.generate(["a", "b"], [greedy(3), greedy(5)], use_tqdm=False)
    assert [len(o.token_ids) for o in outs] == [3, 5]
    with pytest.raises(ValueError, match="2 prompts"):
        llm.generate(["a", "b"], [greedy(3)], use_tqdm=False)


def test_stop_string_cuts_text(llm):
    ref = llm.generate("The quick brown fox", greedy(16), use_tqdm=False)[0]
    text = ref.text
    assert len(text) >= 6
    stop = text[3:6]
    out = llm.generate("The quick brown fox", greedy(16, stop=[stop]), use_tqdm=False)[0]
    assert out.finish_reason == "stop"
    assert out.text == text[:text.find(stop)]
    assert stop not in out.text


def test_stop_token_ids_and_eos(llm):
    ref = llm.generate("Hello", greedy(10), use_tqdm=False)[0]
    tok = ref.token_ids[4]
    out = llm.generate("Hello", greedy(10, stop_token_ids=[tok]), use_tqdm=False)[0]
    first = ref.token_ids.index(tok)
    assert out.finish_reason == "stop" and out.token_ids == ref.token_ids[:first + 1]
    # min_tokens keeps the stop token from ending the request early
    out = llm.generate("Hello", greedy(10, stop_token_ids=[tok], min_tokens=10), use_tqdm=False)[0]
    assert len(out.token_ids) == 10 and tok not in out.token_ids


def test_seeded_sampling_reproduces_and_top_k_1_is_greedy(llm):
    p = SamplingParams(temperature=1.0, max_tokens=12, seed=42, ignore_eos=True)
    a = llm.generate(["Once upon a time"] * 3, p, use_tqdm=False)
    b = llm.generate(["Once upon a time", "other prompt"], p, use_tqdm=False)
    assert a[0].token_ids == a[1].token_ids == a[2].token_ids == b[0].token_ids
    c = llm.generate("Once upon a time", SamplingParams(temperature=1.0, max_tokens=12, seed=43,
                                                         ignore_eos=True), use_tqdm=False)[0]
    assert c.token_ids != a[0].token_ids
    g = llm.generate("Once upon a time", greedy(12), use_tqdm=False)[0]
    k1 = llm.generate("Once upon a time", SamplingParams(temperature=1.0, top_k=1, max_tokens=12,
                                                          ignore_eos=True), use_tqdm=False)[0]
    assert k1.token_ids == g.token_ids


def test_abort_frees_blocks(llm):
    total = llm.stats()["num_total_blocks"]
    rid = llm.add_request("Hello there", greedy(200))
    other = llm.add_request("keep going", greedy(5))
    llm.step()
    llm.step()
    assert llm.stats()["num_free_blocks"] < total
    assert llm.abort(rid)
    assert not llm.abort("no-such-request")
    finals = run_to_end(llm, [rid, other])
    assert finals[rid].finish_reason == "abort"
    assert finals[other].finish_reason == "length"
    assert llm.stats()["num_free_blocks"] == total


def test_bad_input_is_typed_and_engine_keeps_serving(llm):
    good = llm.add_request("a request in flight", greedy(8))
    llm.step()
    with pytest.raises(InvalidRequestError, match="max_model_len") as refused:
        llm.add_request([2 + i % 500 for i in range(600)], greedy(4))
    assert refused.value.param == "prompt"  # the field at fault, for the gateway's 400
    with pytest.raises(InvalidRequestError, match="max_tokens"):
        llm.add_request("x", SamplingParams(max_tokens=0))
    with pytest.raises(InvalidRequestError, match="empty"):
        llm.add_request("", greedy(4))
    with pytest.raises(InvalidRequestError, match="outside the vocabulary"):
        llm.add_request([1, 99999], greedy(4))
    with pytest.raises(InvalidRequestError, match="already in use"):
        llm.add_request("dup", greedy(4), request_id=good)
    # max_tokens_strict (the HTTP gateway's): 500 prompt tokens + 20 > 512 is refused, naming
    # what fits; without it the request is served and ends with "length" at the context limit
    prompt = [2 + i % 500 for i in range(500)]
    with pytest.raises(InvalidRequestError, match=r"prompt has 500 and max_tokens asks for 20 more "
                                                  r"\(520\); ask for at most 12 tokens") as refused:
        llm.add_request(prompt, greedy(20, max_tokens_strict=True))
    assert refused.value.param == "max_tokens"
    # 64 blocks x 16 tokens = 1024 slots; 400 prompt + 500 new tokens fits, the pool is the limit
    small = LLM("tiny-random", num_kv_blocks=8, block_size=16)
    with pytest.raises(OutOfMemoryError, match="KV blocks"):
        small.add_request(list(range(2, 100)), greedy(100))
    finals = run_to_end(llm, [good])
    assert finals[good].finish_reason == "length"
    fits, loose = llm.generate([prompt, prompt], [greedy(12, max_tokens_strict=True), greedy(20)])
    assert [len(fits.token_ids), fits.finish_reason] == [12, "length"]
    assert [len(loose.token_ids), loose.finish_reason] == [12, "length"]


def test_generate_rejects_bad_batch_without_queuing(llm):
    with pytest.raises(InvalidRequestError):
        llm.generate(["fine", ""], greedy(4), use_tqdm=False)
    assert not llm.has_unfinished_requests()
    assert llm.generate(["fine"], greedy(4), use_tqdm=False)[0].finish_reason == "length"


def test_unknown_model_dir(tmp_path):
    with pytest.raises(ModelNotFoundError, match="neither a local directory"):
        LLM(str(tmp_path / "missing"))
    with pytest.raises(ModelNotFoundError, match="config.json"):
        LLM(str(tmp_path))


def test_stats_keys(llm):
    stats = llm.stats()
    for key in ("num_preemptions", "prefix_cache_hit_tokens", "num_free_blocks", "num_total_blocks"):
        assert isinstance(stats[key], int)


def test_stop_string_on_the_max_tokens_token_reports_stop(llm):
    ref = llm.generate("The quick brown fox", greedy(6), use_tqdm=False)[0]
    # The whole text of the first 5 tokens can only first appear once token 5 is out, which is
    # also where max_tokens=5 ends the request: the stop string must win.
    stop = llm.tokenizer.decode(ref.token_ids[:5], skip_special_tokens=True)
    out = llm.generate("The quick brown fox", greedy(5, stop=[stop]), use_tqdm=False)[0]
    assert out.text == ""
    assert len(out.token_ids) == 5
    assert out.finish_reason == "stop"


def test_resumed_seeded_request_continues_the_same_random_stream(llm):
    params = SamplingParams(temperature=1.0, max_tokens=10, seed=5, ignore_eos=True)
    full = llm.generate("Once upon a time", params, use_tqdm=False)[0]
    rid = llm.engine.add_request("Once upon a time", params, resume_token_ids=full.token_ids[:4])
    tokens = []
    while llm.has_unfinished_requests():
        for d in llm.step():
            if d.request_id == rid:
                tokens += d.token_ids
    assert tokens == full.token_ids[4:]
