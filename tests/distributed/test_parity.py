"""Greedy output of tensor-parallel, pipeline-parallel and both together is token-identical to
the single-process engine (T=1) and to HF transformers, for every tiny family (float32, gloo),
including KV heads fewer than T (qwen2 has 1 KV head; at T=4 every family replicates KV heads),
chunked prefill (steps that sample nothing) and prefix-cache hits on a second round. Every rank
process is gone after close()."""

import pytest

from infer_cluster.worker import LLM

from .conftest import ENGINE, FAMILIES, GREEDY, check_parallel_greedy, make_prompts

LAYOUTS = {"tp2": (2, 1), "pp2": (1, 2), "tp2_pp2": (2, 2)}


@pytest.fixture(scope="module")
def single_process_greedy(dist_checkpoints):
    """family -> our T=1 engine's greedy tokens (the baseline the parallel runs must equal)."""
    ref = {}
    for family, path in dist_checkpoints.items():
        with LLM(path, **ENGINE) as llm:
            ref[family] = [o.token_ids for o in llm.generate(make_prompts(), GREEDY, use_tqdm=False)]
    return ref


def check_layout(started, dist_checkpoints, hf_greedy, single_process_greedy, family, tp, pp):
    check_parallel_greedy(started, dist_checkpoints[family], tp, pp, ENGINE,
                          [single_process_greedy[family], hf_greedy[family]])


@pytest.mark.timeout(90)
@pytest.mark.parametrize("family", list(FAMILIES))
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_parallel_greedy_matches(started, dist_checkpoints, hf_greedy, single_process_greedy,
                                 family, layout):
    tp, pp = LAYOUTS[layout]
    check_layout(started, dist_checkpoints, hf_greedy, single_process_greedy, family, tp, pp)


@pytest.mark.timeout(90)
@pytest.mark.parametrize("family", [
    "qwen2",  # 1 KV head over 4 ranks, qkv bias
    pytest.param("llama", marks=pytest.mark.slow),
    pytest.param("qwen3", marks=pytest.mark.slow),
])
def test_tp4_greedy_matches(started, dist_checkpoints, hf_greedy, single_process_greedy, family):
    check_layout(started, dist_checkpoints, hf_greedy, single_process_greedy, family, 4, 1)


@pytest.mark.timeout(90)
def test_tp2_gathered_logits_match(started, dist_checkpoints, hf_greedy, single_process_greedy, monkeypatch):
    """`INFER_CLUSTER_TP_GREEDY_IDS=0` (the LM head gathers inside the forward; the A/B
    baseline of the argmax pairs) gives the same tokens and gathers no pairs (the rank
    processes inherit the variable)."""
    monkeypatch.setenv("INFER_CLUSTER_TP_GREEDY_IDS", "0")
    check_layout(started, dist_checkpoints, hf_greedy, single_process_greedy, "qwen3", 2, 1)
