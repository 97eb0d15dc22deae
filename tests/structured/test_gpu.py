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
