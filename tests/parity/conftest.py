"""Tiny random checkpoints of each supported family, built once per test session."""

import pytest

from infer_cluster.worker.tiny_random import build_checkpoint

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


@pytest.fixture(scope="session")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("checkpoints")
    return {name: str(build_checkpoint(root / name, spec, seed=1234)) for name, spec in FAMILIES.items()}
