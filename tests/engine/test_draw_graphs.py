"""The sampler's draw replayed from CUDA graphs (worker/sampling/draw_graphs.py) against the eager draw:
the same ids and redo flags step after step for every candidate-path kind and batch size, the
same ids after a redo, the eager path for the rows a graph does not take, and the same
generations through the engine with the graphs on and off. The switch and the buckets are
checked on the CPU too."""

import pytest
import torch

from infer_cluster.protocol import SamplingParams
from infer_cluster.protocol.errors import ConfigError
from infer_cluster.worker.sampling.draw_graphs import (BUCKETS, DRAW_GRAPH_ENV, DRAW_GRAPH_MAX_DEFAULT, PLAIN_ENV,
                                              PLAIN_MAX, DrawGraphs, bucket_for, draw_graph_max, plain_max,
                                              row_limit)
from infer_cluster.worker.sampling.sampler import Sampler
from infer_cluster.worker.sampling.draw_io import SamplingRequestState


def GPU(test):
    """A CUDA test: marked `gpu` (what `make test-gpu` selects) and skipped without a device."""
    return pytest.mark.gpu(pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")(test))


# Candidate-path kinds (each row's own parameters and seed): what a graph takes.
KINDS = [
    dict(temperature=0.8, top_k=50, top_p=0.9),   # the bench's sampled kind
    dict(temperature=1.0, top_k=20),               # top-k alone
    dict(temperature=0.8, top_p=0.9),              # top-p alone: the whole row's mass, device finish
    dict(temperature=1.2, top_k=5, top_p=0.5, min_p=0.1),
]


def test_switch_and_buckets(monkeypatch):
    monkeypatch.delenv(DRAW_GRAPH_ENV, raising=False)
    assert draw_graph_max() == DRAW_GRAPH_MAX_DEFAULT
    monkeypatch.setenv(DRAW_GRAPH_ENV, "0")
    assert draw_graph_max() == 0
    assert DrawGraphs.for_device(torch.device("cuda")) is None  # off: no graphs, nothing allocated
    for bad in ("many", "-1", str(BUCKETS[-1] + 1)):
        monkeypatch.setenv(DRAW_GRAPH_ENV, bad)
        with pytest.raises(ConfigError, match=DRAW_GRAPH_ENV):
            draw_graph_max()
    monkeypatch.setenv(DRAW_GRAPH_ENV, "8")
    assert DrawGraphs.for_device(torch.device("cpu")) is None  # CPU: the eager draw
    assert [bucket_for(n) for n in (1, 2, 3, 5, 16, 17, 33)] == [1, 2, 4, 8, 16, 32, 64]
    with pytest.raises(ValueError, match="bucket"):
        bucket_for(BUCKETS[-1] + 1)
    # steps under a grammar take graphs up to the limit, other steps up to the plain limit
    assert row_limit(DRAW_GRAPH_MAX_DEFAULT, True) == DRAW_GRAPH_MAX_DEFAULT
    assert row_limit(DRAW_GRAPH_MAX_DEFAULT, False) == min(PLAIN_MAX, DRAW_GRAPH_MAX_DEFAULT)
    assert row_limit(DRAW_GRAPH_MAX_DEFAULT, False, 32) == 32
    assert row_limit(8, False) == row_limit(8, True) == 8
    monkeypatch.delenv(PLAIN_ENV, raising=False)
    assert plain_max() == PLAIN_MAX
    monkeypatch.setenv(PLAIN_ENV, "32")
    assert plain_max() == 32
    for bad in ("all", "-2", str(BUCKETS[-1] + 1)):
        monkeypatch.setenv(PLAIN_ENV, bad)
        with pytest.raises(ConfigError, match=PLAIN_ENV):
            plain_max()


def make_rows(kinds, steps: int, vocab: int, generator: torch.Generator):
    """One row per kind (seeded), `steps` generated tokens each."""
    rows = []
    for i, kw in enumerate(kinds):
        params = SamplingParams(max_tokens=64, seed=100 + i, **kw)
        out = torch.randint(0, vocab, (steps,), generator=generator).tolist()
        rows.append(SamplingRequestState(params, [1, 2, 3], out, None, (2,), f"r{i}"))
    return rows


def draws(sampler: Sampler, logits_per_step, rows_per_step):
    return [sampler(lg.clone(), rows).token_ids for lg, rows in zip(logits_per_step, rows_per_step)]


@GPU
@pytest.mark.parametrize("batch", [1, 3, 8])
@pytest.mark.parametrize("vocab", [151936, 4000])  # block-maxima top-k, and torch's own topk
def test_graph_draw_matches_eager(batch, vocab):
    g = torch.Generator().manual_seed(batch)
    kinds = [KINDS[i % len(KINDS)] for i in range(batch)]
    logits = [(3 * torch.randn(batch, vocab, generator=g)).to("cuda", torch.bfloat16) for _ in range(4)]
    rows = [make_rows(kinds, s, vocab, torch.Generator().manual_seed(s)) for s in range(4)]
    graphs = DrawGraphs(torch.device("cuda"), 32)
    try:
        got = draws(Sampler(draw_graphs=graphs), logits, rows)
        assert graphs.replays == 4 and graphs.captures >= 1
        assert got == draws(Sampler(), logits, rows)
        # top-p alone among the rows (or not) is a variant of its own
        variants = {k[4] for k in graphs._graphs}
        assert variants == {any("top_k" not in kw for kw in kinds)}
    finally:
        graphs.release()


@GPU
def test_wide_plain_graph_draw_matches_eager(monkeypatch):
    """256 sampled rows at the Qwen3 vocabulary, no grammar, with the plain limit raised to 256
    (`INFER_CLUSTER_DRAW_GRAPH_PLAIN_MAX`): one graph replay a step, the eager draw's ids."""
    vocab, batch = 151936, 256
    g = torch.Generator().manual_seed(5)
    logits = [(3 * torch.randn(batch, vocab, generator=g)).to("cuda", torch.bfloat16) for _ in range(3)]
    rows = [make_rows([KINDS[0]] * batch, s, vocab, torch.Generator().manual_seed(s)) for s in range(3)]
    monkeypatch.setenv(PLAIN_ENV, "256")
    graphs = DrawGraphs(torch.device("cuda"), DRAW_GRAPH_MAX_DEFAULT)
    try:
        got = draws(Sampler(draw_graphs=graphs), logits, rows)
        assert graphs.replays == 3
        assert got == draws(Sampler(), logits, rows)
    finally:
        graphs.release()


@GPU
def test_graph_draw_redo_matches_eager():
    """Rows whose kept set may reach past their candidates (ties with the k-th value past
    k + margin) are flagged by the graph as by the eager draw and redone on the full path in
    `finish`: the same ids."""
    vocab = 20000
    logits = torch.zeros(3, vocab)
    logits[:, ::7] = 1.0  # thousands of ties at the top: every top-k row is flagged
    logits = logits.to("cuda", torch.bfloat16)
    kinds = [dict(temperature=1.0, top_k=5), dict(temperature=0.7, top_k=3, top_p=0.8),
             dict(temperature=0.9, top_k=40)]
    graphs = DrawGraphs(torch.device("cuda"), 4)
    try:
        for step in range(3):
            rows = make_rows(kinds, step, vocab, torch.Generator().manual_seed(step))
            sampler = Sampler(draw_graphs=graphs)
            draw = sampler.draw(logits.clone(), rows, logits_writable=True)
            flags = draw.transfer.tolist()[3:]
            assert flags == [1, 1, 1]
            got = sampler.finish(draw, draw.transfer.tolist(), None).token_ids
            assert got == Sampler()(logits.clone(), rows).token_ids
            assert all(t % 7 == 0 for t in got)  # drawn among the tied top values
        assert graphs.replays == 3
    finally:
        graphs.release()


@GPU
def test_wide_unconstrained_steps_draw_eagerly(monkeypatch):
    """A step of more rows than the plain limit (`INFER_CLUSTER_DRAW_GRAPH_PLAIN_MAX`, 32 here)
    without a grammar takes the eager draw, whatever the limit for constrained steps; 32 rows
    still replay a graph."""
    vocab = 4000
    monkeypatch.setenv(PLAIN_ENV, "32")
    graphs = DrawGraphs(torch.device("cuda"), DRAW_GRAPH_MAX_DEFAULT)
    try:
        for batch, replays in ((33, 0), (32, 1)):
            logits = torch.randn(batch, vocab).to("cuda", torch.bfloat16)
            rows = make_rows([KINDS[i % len(KINDS)] for i in range(batch)], 2, vocab,
                             torch.Generator().manual_seed(batch))
            got = Sampler(draw_graphs=graphs)(logits.clone(), rows).token_ids
            assert graphs.replays == replays
            assert got == Sampler()(logits.clone(), rows).token_ids
    finally:
        graphs.release()


@GPU
@pytest.mark.parametrize("kw", [dict(temperature=0.7, repetition_penalty=1.1),  # penalties
                                dict(temperature=0.7),                          # full path (no candidates)
                                dict(temperature=0.8, top_k=20, logprobs=2),    # logprobs
                                dict(temperature=0.8, top_k=20, min_tokens=5)])  # min_tokens
def test_other_rows_take_the_eager_path(kw):
    vocab = 4000
    logits = torch.randn(2, vocab).to("cuda", torch.bfloat16)
    rows = make_rows([KINDS[0], kw], 2, vocab, torch.Generator().manual_seed(0))
    graphs = DrawGraphs(torch.device("cuda"), 8)
    try:
        got = Sampler(draw_graphs=graphs)(logits.clone(), rows).token_ids
        assert graphs.replays == 0
        assert got == Sampler()(logits.clone(), rows).token_ids
    finally:
        graphs.release()


@GPU
def test_engine_generations_with_and_without_draw_graphs(monkeypatch):
    """Seeded sampled requests through the engine (async scheduling, decode graphs): the same
    tokens with the draw graphs as with `INFER_CLUSTER_DRAW_GRAPH_MAX=0`, and graphs served."""
    from infer_cluster.worker import LLM

    prompts = [[5 + i, 17, 33 + 2 * i, 9] for i in range(5)]
    params = [SamplingParams(max_tokens=24, ignore_eos=True, seed=7 + i, **KINDS[i % len(KINDS)])
              for i in range(5)]
    outs = {}
    for limit in ("0", "32"):
        monkeypatch.setenv("INFER_CLUSTER_DRAW_GRAPH_MAX", limit)
        llm = LLM("tiny-random", device="cuda", dtype="float32", num_kv_blocks=128, max_num_seqs=8)
        try:
            outs[limit] = [o.token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
            graphs = llm.engine.draw_graphs
            assert (graphs is None) == (limit == "0")
            if graphs is not None:
                assert graphs.replays > 0
        finally:
            llm.close()
    assert outs["32"] == outs["0"]


SCHEMA = {"type": "array", "items": {"type": "string"}, "minItems": 3}


def _grammar_rows(n: int, vocab: int):
    """`n` seeded candidate-path rows under a JSON schema (tiny-random's tokenizer), nothing
    generated yet; and the pool to close."""
    from transformers import AutoTokenizer

    from infer_cluster.protocol import StructuredOutputsParams
    from infer_cluster.worker.loading.loader import resolve_model_path
    from infer_cluster.worker.structured.compiler import GrammarCompilerPool
    from infer_cluster.worker.structured.state import GrammarState

    tokenizer = AutoTokenizer.from_pretrained(str(resolve_model_path("tiny-random")))
    pool = GrammarCompilerPool(tokenizer, vocab, [tokenizer.eos_token_id])
    compiled = pool.submit(StructuredOutputsParams(json=SCHEMA)).result()
    rows = [SamplingRequestState(SamplingParams(max_tokens=64, seed=50 + i, structured_outputs={"json": SCHEMA},
                                                **KINDS[i % len(KINDS)]),
                                 [5, 6, 7], [], None, (tokenizer.eos_token_id,), f"g{i}", 0, GrammarState(compiled))
             for i in range(n)]
    return rows, pool


def constrained_draws(sampler: Sampler, logits_per_step, batch: int, vocab: int) -> list:
    """Each step's ids for the rows whose grammar has not ended (a row that drew its stop token
    leaves the batch, as in the engine), every id checked against its grammar."""
    rows, pool = _grammar_rows(batch, vocab)
    try:
        steps = []
        for lg in logits_per_step:
            live = [i for i, r in enumerate(rows) if not r.grammar.is_terminated]
            if not live:
                break
            out = sampler(lg[live].clone(), [rows[i] for i in live]).token_ids
            for i, t in zip(live, out):
                rows[i].output_token_ids.append(t)
                assert rows[i].grammar.sync(rows[i].output_token_ids), f"token {t} left row {i}'s grammar"
            steps.append(dict(zip(live, out)))
        return steps
    finally:
        pool.close()


@GPU
@pytest.mark.parametrize("batch", [1, 5, 40])
def test_constrained_graph_draw_matches_eager(batch):
    """Sampled rows under a grammar take the draw graph, their mask applied to the graph's copy of
    the logits: step after step the same ids as the eager draw (float32 logits, so both draw from
    the same values), every id allowed by its grammar, and a graph replayed each step."""
    vocab = 1024  # wider than tiny-random's tokenizer: the padded head's columns are banned too
    gen = torch.Generator(device="cuda").manual_seed(batch)
    logits = [3 * torch.randn(batch, vocab, device="cuda", generator=gen) for _ in range(6)]
    graphs = DrawGraphs(torch.device("cuda"), DRAW_GRAPH_MAX_DEFAULT)
    try:
        got = constrained_draws(Sampler(draw_graphs=graphs), logits, batch, vocab)
        assert len(got) >= 3 and graphs.replays == len(got)
        assert got == constrained_draws(Sampler(), logits, batch, vocab)
    finally:
        graphs.release()


@GPU
def test_engine_constrained_sampled_generations_with_and_without_draw_graphs(monkeypatch):
    """Seeded top-p / top-k requests under a JSON schema through the engine (async scheduling,
    decode graphs): the same tokens with the draw graphs as without, the graphs serving them."""
    from infer_cluster.worker import LLM

    prompts = [[5 + i, 17, 33 + 2 * i, 9] for i in range(3)]
    params = [SamplingParams(max_tokens=30, seed=11 + i, structured_outputs={"json": SCHEMA},
                             **KINDS[i % len(KINDS)]) for i in range(3)]
    outs = {}
    for limit in ("0", "32"):
        monkeypatch.setenv("INFER_CLUSTER_DRAW_GRAPH_MAX", limit)
        llm = LLM("tiny-random", device="cuda", dtype="float32", num_kv_blocks=128, max_num_seqs=8)
        try:
            outs[limit] = [(o.token_ids, o.finish_reason) for o in llm.generate(prompts, params, use_tqdm=False)]
            if limit != "0":
                assert llm.engine.draw_graphs.replays > 0
        finally:
            llm.close()
    assert outs["32"] == outs["0"]



@GPU
def test_a_capture_out_of_memory_draws_eagerly(monkeypatch):
    """A draw graph whose capture runs out of GPU memory mid-serving (the error injected where
    torch ends the capture): its key is refused, the steps draw eagerly with the same ids, and
    no step fails."""
    batch, vocab = 8, 151936
    g = torch.Generator().manual_seed(7)
    kinds = [KINDS[i % len(KINDS)] for i in range(batch)]
    logits = [(3 * torch.randn(batch, vocab, generator=g)).to("cuda", torch.bfloat16) for _ in range(3)]
    rows = [make_rows(kinds, s, vocab, torch.Generator().manual_seed(s)) for s in range(3)]
    want = draws(Sampler(), logits, rows)
    graphs = DrawGraphs(torch.device("cuda"), 32)
    real_end = torch.cuda.CUDAGraph.capture_end

    def end_out_of_memory(self):
        real_end(self)
        raise torch.cuda.OutOfMemoryError("CUDA out of memory (injected at the capture's end)")

    try:
        monkeypatch.setattr(torch.cuda.CUDAGraph, "capture_end", end_out_of_memory)
        got = draws(Sampler(draw_graphs=graphs), logits, rows)
        monkeypatch.undo()
        assert got == want
        assert graphs.refused and graphs.captures == 0 and graphs.replays == 0
        # a refused key stays eager: no capture is tried again
        assert draws(Sampler(draw_graphs=graphs), logits, rows) == want
        assert graphs.captures == 0 and graphs.replays == 0
    finally:
        graphs.release()
