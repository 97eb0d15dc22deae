"""On a CUDA device: speculative decoding with CUDA graphs and async scheduling. A tiny float32
model's greedy output with n-gram proposals and with a draft model equals speculation off,
token for token, eager and with graphs (verify steps replay the decode graphs, one row a
position; the draft's proposal steps its own decode graphs), and with async scheduling where `disable_by_batch_size`
turns speculation off for the large steps."""

import pytest
import torch

from infer_cluster.worker import LLM

from tests.spec_decode.test_engine import PROMPTS, SPEC, greedy

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA device", allow_module_level=True)

KW = dict(device="cuda", dtype="float32", block_size=8, num_kv_blocks=256, max_num_seqs=16)
PARAMS = [greedy(16 + 6 * i) for i in range(len(PROMPTS))]
DRAFT = {"method": "draft_model", "model": "tiny-random", "num_speculative_tokens": 4, "adaptive": False}


@pytest.fixture(scope="module")
def want():
    llm = LLM("tiny-random", **KW)
    return [o.token_ids for o in llm.generate(PROMPTS, PARAMS, use_tqdm=False)]


@pytest.mark.parametrize("spec", [SPEC, DRAFT], ids=["ngram", "draft_model"])
@pytest.mark.parametrize("enforce_eager", [True, False], ids=["eager", "graphs"])
def test_greedy_output_equals_speculation_off(want, spec, enforce_eager):
    llm = LLM("tiny-random", speculative_config=spec, enforce_eager=enforce_eager,
              async_scheduling=False, **KW)
    assert [o.token_ids for o in llm.generate(PROMPTS, PARAMS, use_tqdm=False)] == want
    stats = llm.stats()
    assert stats["num_spec_accepted_tokens"] > 0
    if spec is DRAFT:  # the draft has the target's weights
        assert stats["num_spec_accepted_tokens"] == stats["num_spec_draft_tokens"]
    if not enforce_eager:  # verify steps run decode-shaped (verify.decode_shaped): decode graphs
        # verify graphs of their own, whose attention reads each request's KV once per chunk
        # of its rows (`row_span`)
        assert llm.engine.runner.verify_graphs.replays > 0
        draft = llm.engine.draft_runner
        if draft is not None:  # the draft's one-token proposal steps
            assert draft.graphs.replays > 0


def test_larger_verify_graphs_keep_the_output(want, monkeypatch):
    """`INFER_CLUSTER_VERIFY_MAX_ROWS` past the default: verify graphs up to 128 rows, each row
    up to k proposals at every batch here, the output still speculation off's."""
    monkeypatch.setenv("INFER_CLUSTER_VERIFY_MAX_ROWS", "128")
    spec = {**SPEC, "num_speculative_tokens": 15, "adaptive": False}
    llm = LLM("tiny-random", speculative_config=spec, async_scheduling=False, **KW)
    assert llm.engine.runner.verify_graphs.sizes[-1] == 128
    assert [o.token_ids for o in llm.generate(PROMPTS, PARAMS, use_tqdm=False)] == want
    assert llm.stats()["num_spec_accepted_tokens"] > 0
    assert llm.engine.runner.verify_graphs.replays > 0


class _Counted:
    """A captured graph whose replays are counted."""

    def __init__(self, graph):
        self.graph, self.replays = graph, 0

    def replay(self):
        self.replays += 1
        self.graph.replay()


def test_large_greedy_verify_steps_replay_the_greedy_only_sizes():
    """40 requests at one proposal each: verify steps of up to 80 positions, past the 48-row
    ladder, replay the greedy-only verify graphs (64, 80) as decode rows, and the output is
    speculation off's."""
    prompts = [[(t + 7 * i) % 500 + 2 for t in PROMPTS[i % len(PROMPTS)]] for i in range(40)]
    params = [greedy(12 + i % 5) for i in range(40)]
    kw = {**KW, "max_num_seqs": 40, "num_kv_blocks": 1024}
    want = [o.token_ids for o in LLM("tiny-random", **kw).generate(prompts, params, use_tqdm=False)]
    llm = LLM("tiny-random", speculative_config=SPEC, async_scheduling=False, **kw)
    graphs = llm.engine.runner.verify_graphs
    assert graphs.sizes[-2:] == [64, 80] and graphs.logits_max_batch == 48
    assert 64 not in graphs.graphs and 64 in graphs.greedy_graphs  # no logits held past 48
    counted = {s: _Counted(graphs.greedy_graphs[s]) for s in (64, 80)}
    graphs.greedy_graphs.update(counted)
    assert [o.token_ids for o in llm.generate(prompts, params, use_tqdm=False)] == want
    assert llm.stats()["num_spec_accepted_tokens"] > 0
    assert sum(c.replays for c in counted.values()) > 0


@pytest.mark.parametrize("spec", [SPEC, DRAFT], ids=["ngram", "draft_model"])
def test_async_scheduling_with_graphs(want, spec):
    llm = LLM("tiny-random", speculative_config={**spec, "disable_by_batch_size": 4}, **KW)
    assert llm.engine.async_scheduling
    assert [o.token_ids for o in llm.generate(PROMPTS, PARAMS, use_tqdm=False)] == want
    assert llm.stats()["num_spec_accepted_tokens"] > 0
    assert llm.engine.runner.graphs.replays > 0
