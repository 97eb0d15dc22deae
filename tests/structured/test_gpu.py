"""On a CUDA device: a step's grammar masks are filled and applied without one host sync (the
engine queues a constrained step's draw while its forward still runs, so a sync would wait for
the forward), and a constrained request under async scheduling and CUDA graphs gives the
synchronous loop's output."""

import pytest
import torch

from infer_cluster.protocol import SamplingParams, StructuredOutputsParams

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA device", allow_module_level=True)

SCHEMA = {"type": "array", "items": {"type": "string"}}


def test_grammar_draw_never_blocks_the_host():
    from transformers import AutoTokenizer

    from infer_cluster.worker.loading.loader import resolve_model_path
    from infer_cluster.worker.sampling.sampler import Sampler
    from infer_cluster.worker.sampling.draw_io import SamplingRequestState
    from infer_cluster.worker.structured.compiler import GrammarCompilerPool
    from infer_cluster.worker.structured.state import GrammarState

    n, vocab = 32, 151936
    tokenizer = AutoTokenizer.from_pretrained(str(resolve_model_path("tiny-random")))
    pool = GrammarCompilerPool(tokenizer, vocab, [tokenizer.eos_token_id])
    compiled = pool.submit(StructuredOutputsParams(json=SCHEMA)).result()
    # half the rows constrained (sampled and greedy), half free
    params = [SamplingParams(temperature=0.8 if i % 4 < 2 else 0.0, seed=i, max_tokens=50,
                             structured_outputs={"json": SCHEMA} if i % 2 == 0 else None)
              for i in range(n)]
    rows = [SamplingRequestState(p, [5, 6, 7], [], None, (tokenizer.eos_token_id,), f"r{i}", 0,
                                 GrammarState(compiled) if i % 2 == 0 else None)
            for i, p in enumerate(params)]
    sampler = Sampler(torch.Generator().manual_seed(1))
    gen = torch.Generator(device="cuda").manual_seed(0)
    for step in range(3):  # the first draws make the buffers and warm the allocators
        logits = torch.randn(n, vocab, device="cuda", generator=gen).to(torch.bfloat16)
        torch.cuda.synchronize()
        if step == 2:
            torch.cuda.set_sync_debug_mode("error")
        try:
            draw = sampler.draw(logits, rows, logits_writable=True)
        finally:
            torch.cuda.set_sync_debug_mode("default")
        out = sampler.finish(draw, draw.transfer.tolist(), None)
        for r, t in zip(rows, out.token_ids):
            r.output_token_ids.append(t)
            if r.grammar is not None:
                assert r.grammar.sync(r.output_token_ids), "a drawn token left the grammar"
    pool.close()


def test_constrained_output_same_with_async_and_graphs():
    from infer_cluster.worker import LLM

    kw = dict(device="cuda", dtype="float32", num_kv_blocks=256, max_num_seqs=16)
    prompts = ["Hello", [5, 6, 7], "x y", [9] * 20]
    params = [SamplingParams(temperature=0, max_tokens=40, structured_outputs={"json": SCHEMA}),
              SamplingParams(temperature=0.7, seed=4, max_tokens=15, ignore_eos=True),
              SamplingParams(temperature=0, max_tokens=20, structured_outputs={"regex": r"\d{3}"}),
              SamplingParams(seed=3, max_tokens=10, structured_outputs={"choice": ["up", "down"]})]
    want = [(o.token_ids, o.finish_reason) for o in
            LLM("tiny-random", async_scheduling=False, enforce_eager=True, **kw).generate(prompts, params, use_tqdm=False)]
    llm = LLM("tiny-random", **kw)
    assert llm.engine.async_scheduling
    assert [(o.token_ids, o.finish_reason) for o in llm.generate(prompts, params, use_tqdm=False)] == want


def test_greedy_constrained_draws_replay_a_graph_with_the_eager_result(monkeypatch):
    """Greedy rows whose only edit is a grammar's mask are drawn by a CUDA graph (uploads, mask,
    argmax; worker/structured/mask_graphs.py) once their logits' buffer was seen: the same
    tokens as the eager draw (draw graphs off), at batch 1 and 3, the graphs really replaying."""
    from infer_cluster.worker import LLM

    kw = dict(device="cuda", dtype="float32", num_kv_blocks=256, max_num_seqs=8)
    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 20},
                                               "tags": {"type": "array", "items": {"type": "integer"}}},
              "required": ["name", "tags"]}
    params = SamplingParams(temperature=0, max_tokens=60, structured_outputs={"json": schema})
    batches = [["Hello"], ["a b c", [5, 6, 7], [9] * 20]]
    monkeypatch.setenv("INFER_CLUSTER_DRAW_GRAPH_MAX", "0")
    eager = LLM("tiny-random", **kw)
    assert eager.engine.draw_graphs is None
    want = [[(o.token_ids, o.finish_reason) for o in eager.generate(b, params, use_tqdm=False)] for b in batches]
    eager.close()
    monkeypatch.delenv("INFER_CLUSTER_DRAW_GRAPH_MAX")
    llm = LLM("tiny-random", **kw)
    got = [[(o.token_ids, o.finish_reason) for o in llm.generate(b, params, use_tqdm=False)] for b in batches]
    assert got == want
    graphs = llm.engine.draw_graphs.mask_argmax
    assert graphs.captures >= 2 and graphs.replays >= 20 and not graphs.disabled
    llm.close()


def test_mask_argmax_graph_matches_apply_then_argmax():
    """`MaskArgmaxGraphs` against `apply_token_bitmask_ref` + argmax over one reused logits
    buffer (as a decode graph's output is), with new masks and values each call."""
    from infer_cluster.kernels.bitmask import apply_token_bitmask_ref
    from infer_cluster.worker.structured.mask_graphs import MAX_ROWS, MaskArgmaxGraphs

    n, vocab, width = 4, 1000, 1024  # a head wider than the tokenizer: the extra columns banned
    words = (vocab + 31) // 32
    gen = torch.Generator().manual_seed(0)
    logits = torch.empty(n, width, device="cuda", dtype=torch.bfloat16)
    host = torch.empty(n, words, dtype=torch.int32, pin_memory=True)
    dev = torch.empty(n, words, dtype=torch.int32, device="cuda")
    idx_host = torch.tensor([0, 2, 3], dtype=torch.int32).pin_memory()
    idx_dev = torch.empty(n, dtype=torch.int32, device="cuda")
    graphs = MaskArgmaxGraphs(torch.device("cuda"))
    served = 0
    for _ in range(5):
        values = torch.randn(n, width, generator=gen)
        logits.copy_(values)
        host.copy_(torch.randint(-2**31, 2**31 - 1, (n, words), generator=gen, dtype=torch.int64).to(torch.int32))
        host[2] = 0
        host[2, 3] = 1 << 5  # one token allowed: 3 * 32 + 5
        want = apply_token_bitmask_ref(values.to(torch.bfloat16).float(), host.clone(), idx_host.clone(), vocab).argmax(-1)
        ids = graphs.argmax(logits, host, dev, idx_host, idx_dev, vocab)
        if ids is None:  # first sight of this buffer: the caller's eager draw
            continue
        served += 1
        assert ids.cpu().tolist() == want.tolist()
        assert ids[2].item() == 3 * 32 + 5
    assert served == 4 and graphs.captures == 2
    wide = torch.zeros(MAX_ROWS + 1, width, device="cuda", dtype=torch.bfloat16)
    wide_host = torch.zeros(MAX_ROWS + 1, words, dtype=torch.int32, pin_memory=True)
    wide_dev = torch.zeros(MAX_ROWS + 1, words, dtype=torch.int32, device="cuda")
    for _ in range(3):  # a batch past MAX_ROWS is drawn eagerly, however often it comes
        assert graphs.argmax(wide, wide_host, wide_dev, idx_host, idx_dev, vocab) is None
    assert graphs.captures == 2
    graphs.release()


def test_constrained_speculation_through_the_verify_graphs():
    """Structured requests speculating on the GPU (prompt lookup, CUDA graphs, async
    scheduling): verify steps replay the verify graphs (runs of one request's rows, their masks
    filled in rounds), and the output is speculation off's, token for token (float32)."""
    from infer_cluster.worker import LLM
    from tests.spec_decode.test_engine import SPEC
    from tests.spec_decode.test_structured import STRUCTURED

    kw = dict(device="cuda", dtype="float32", num_kv_blocks=256, max_num_seqs=16)
    params = [SamplingParams(temperature=t, seed=seed, top_p=0.9 if t else 1.0, max_tokens=n,
                             structured_outputs=so) for so, t, seed, n in STRUCTURED]
    prompts = [[5, 6, 7, 8] * 4, [13, 14, 15] * 6, [20, 21, 22, 23], [30, 31] * 5, [40] * 7]
    want = [(o.token_ids, o.finish_reason) for o in LLM("tiny-random", **kw).generate(prompts, params, use_tqdm=False)]
    llm = LLM("tiny-random", speculative_config=SPEC, **kw)
    got = [(o.token_ids, o.finish_reason) for o in llm.generate(prompts, params, use_tqdm=False)]
    assert got == want
    assert llm.stats()["num_spec_accepted_tokens"] > 20
    assert llm.engine.runner.verify_graphs.replays > 0
