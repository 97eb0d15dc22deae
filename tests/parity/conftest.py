"""Tiny random checkpoints of each supported family, built once per test session, and the on /
off comparison the kernel-switch parity tests share (`spied_outputs`, `assert_same_greedy`)."""

import os

import pytest
import torch

from infer_cluster.worker.loading.embedded import build_checkpoint

FAMILIES = {
    # GQA (4 query heads over 2 KV heads), untied LM head
    "llama": dict(model_type="llama", vocab_size=512, hidden_size=64, intermediate_size=128,
                  num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                  max_position_embeddings=1024, rms_norm_eps=1e-5, tie_word_embeddings=False,
                  initializer_range=0.1),
    # qkv bias, untied head, multi-query (1 KV head)
    "qwen2": dict(model_type="qwen2", vocab_size=512, hidden_size=64, intermediate_size=128,
                  num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=1,
                  max_position_embeddings=1024, rms_norm_eps=1e-6, tie_word_embeddings=False,
                  initializer_range=0.1),
    # q/k norm, tied embeddings, head_dim set explicitly
    "qwen3": dict(model_type="qwen3", vocab_size=512, hidden_size=64, intermediate_size=128,
                  num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                  max_position_embeddings=1024, rms_norm_eps=1e-6, tie_word_embeddings=True,
                  initializer_range=0.1),
}


@pytest.fixture(autouse=True)
def _interpreter_gemv_grids(monkeypatch):
    """Under the Triton interpreter, untuned GEMV shapes take one program per 32 output rows
    rather than the GPU heuristic's ~256 programs (two per SM of an H100, kernels/gemv.py): the
    interpreter runs a grid's programs one after another in Python, so the tiny models' 64- to
    512-wide GEMVs in blocks of 2 rows made a whole-model parity test 4x slower, for the same
    kernel code on narrower tiles. GPU runs keep the heuristic."""
    if os.environ.get("TRITON_INTERPRET", "0") == "1" and not torch.cuda.is_available():
        from infer_cluster.kernels import gemv

        monkeypatch.setattr(gemv, "_TARGET_PROGRAMS", 1)


@pytest.fixture(scope="session")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("checkpoints")
    return {name: str(build_checkpoint(root / name, spec, seed=1234)) for name, spec in FAMILIES.items()}


def spied_outputs(path, monkeypatch, module, name: str, env: str, on: bool, prompts, params, **kw):
    """One small float32 engine built with the switch `env` on or off: `(llm, [(token_ids,
    logprobs)] per prompt, how often module.name ran)` (a spy counts the entry point's calls)."""
    from infer_cluster.worker import LLM

    calls = []
    real = getattr(module, name)
    monkeypatch.setattr(module, name, lambda *a, **k: calls.append(1) or real(*a, **k))
    monkeypatch.setenv(env, "1" if on else "0")
    llm = LLM(path, dtype="float32", block_size=16, num_kv_blocks=32, max_num_seqs=4,
              max_num_batched_tokens=64, **kw)
    outs = llm.generate(prompts, params, use_tqdm=False)
    return llm, [(o.token_ids, o.logprobs) for o in outs], len(calls)


def assert_same_greedy(got, want):
    """Same tokens for every prompt, and each step's chosen-token logprob within 1e-4."""
    for (tokens, lps), (ref_tokens, ref_lps) in zip(got, want):
        assert tokens == ref_tokens
        for step, ref_step in zip(lps, ref_lps):
            assert step[0] == pytest.approx(ref_step[0], abs=1e-4)
