"""GGUF conversion on small files written here: tensor names, the Q/K row order, config from
metadata, one-line errors, and Llama / Qwen2 / Qwen3 checkpoints that survive HF -> GGUF -> HF
with identical weights and identical greedy output."""

import json
import os

import numpy as np
import pytest

from infer_cluster.protocol import ModelNotFoundError, SamplingParams
from infer_cluster.worker.loading.embedded import build_checkpoint
from infer_cluster.worker.loading.gguf import ensure_converted, find_gguf, open_reader
from infer_cluster.worker.loading.gguf_config import hf_config_dict, llama3_factors
from infer_cluster.worker.loading.gguf_weights import hf_tensor_name, rope_row_order
from infer_cluster.worker.loading.loader import resolve_model_path

from .gguf_files import llama_cpp_permute, write_gguf_from_hf, write_tiny_gguf


@pytest.fixture
def cache(tmp_path, monkeypatch):
    root = tmp_path / "cache"
    monkeypatch.setenv("INFER_CLUSTER_CACHE", str(root))
    return root


def test_tensor_names_map_to_hf():
    assert hf_tensor_name("token_embd.weight") == "model.embed_tokens.weight"
    assert hf_tensor_name("output.weight") == "lm_head.weight"
    assert hf_tensor_name("output_norm.weight") == "model.norm.weight"
    assert hf_tensor_name("blk.12.attn_q.weight") == "model.layers.12.self_attn.q_proj.weight"
    assert hf_tensor_name("blk.0.attn_k.bias") == "model.layers.0.self_attn.k_proj.bias"
    assert hf_tensor_name("blk.3.attn_output.weight") == "model.layers.3.self_attn.o_proj.weight"
    assert hf_tensor_name("blk.1.attn_k_norm.weight") == "model.layers.1.self_attn.k_norm.weight"
    assert hf_tensor_name("blk.1.attn_norm.weight") == "model.layers.1.input_layernorm.weight"
    assert hf_tensor_name("blk.1.ffn_norm.weight") == "model.layers.1.post_attention_layernorm.weight"
    assert hf_tensor_name("blk.7.ffn_down.weight") == "model.layers.7.mlp.down_proj.weight"
    assert hf_tensor_name("rope_freqs.weight") is None  # read into the config
    with pytest.raises(ModelNotFoundError, match="blk.0.ffn_gate_exps.weight"):
        hf_tensor_name("blk.0.ffn_gate_exps.weight")


@pytest.mark.parametrize("heads,head_dim", [(9, 64), (3, 64), (4, 16), (1, 2)])
def test_rope_row_order_undoes_llama_cpp_permute(heads, head_dim):
    rng = np.random.default_rng(heads)
    w = rng.standard_normal((heads * head_dim, 5)).astype(np.float32)
    stored = llama_cpp_permute(w, heads)
    order = rope_row_order(w.shape[0], heads)
    assert np.array_equal(stored[order], w)
    bias = w[:, 0].copy()
    assert np.array_equal(llama_cpp_permute(bias, heads)[order], bias)
    # HF row d/2 (pair 0's second half) is stored right after row 0, HF row 1 after that
    assert order[head_dim // 2] == 1 and order[1] == (2 if head_dim > 2 else 1)
    with pytest.raises(ModelNotFoundError, match="head size"):
        rope_row_order(30, 4)


def test_config_from_metadata(tmp_path):
    path = write_tiny_gguf(tmp_path / "m.gguf", metadata={"llama.attention.key_length": 8})
    config = hf_config_dict(open_reader(path), path)
    assert config["model_type"] == "llama" and config["architectures"] == ["LlamaForCausalLM"]
    assert (config["hidden_size"], config["intermediate_size"], config["num_hidden_layers"]) == (32, 64, 1)
    assert (config["num_attention_heads"], config["num_key_value_heads"], config["head_dim"]) == (4, 2, 8)
    assert config["rope_theta"] == 500000.0 and config["max_position_embeddings"] == 256
    assert config["rms_norm_eps"] == pytest.approx(1e-6)
    assert config["vocab_size"] == 64  # no vocab_size key, no tokenizer: the embedding's rows
    assert config["tie_word_embeddings"] is False and "rope_scaling" not in config
    tied = write_tiny_gguf(tmp_path / "tied.gguf", skip_output=True)
    assert hf_config_dict(open_reader(tied), tied)["tie_word_embeddings"] is True
    linear = write_tiny_gguf(tmp_path / "linear.gguf", metadata={"llama.rope.scaling.type": "linear",
                                                                  "llama.rope.scaling.factor": 4.0})
    assert hf_config_dict(open_reader(linear), linear)["rope_scaling"] == {"rope_type": "linear", "factor": 4.0}


def test_llama3_rope_recovered_from_rope_freqs(tmp_path):
    rope = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192}
    factors = llama3_factors(rope, 8, 500000.0).astype(np.float32)
    assert factors[0] == 1.0 and factors[-1] == 8.0
    path = write_tiny_gguf(tmp_path / "l3.gguf", extra_tensor=("rope_freqs.weight", factors, None))
    assert hf_config_dict(open_reader(path), path)["rope_scaling"] == rope
    odd = write_tiny_gguf(tmp_path / "odd.gguf", extra_tensor=("rope_freqs.weight", factors * 1.5, None))
    with pytest.raises(ModelNotFoundError, match="rope_freqs"):
        hf_config_dict(open_reader(odd), odd)


def _one_line_error(model: str) -> str:
    with pytest.raises(ModelNotFoundError) as info:
        resolve_model_path(model)
    message = str(info.value)
    assert "\n" not in message
    return message


def test_unknown_architecture_is_one_line(tmp_path, cache):
    path = write_tiny_gguf(tmp_path / "g.gguf", arch="gpt2")
    message = _one_line_error(str(path))
    assert "'gpt2'" in message and "not supported" in message
    assert not any(cache.rglob("config.json"))  # nothing half-written stays behind


def test_truncated_and_foreign_files_are_one_line(tmp_path, cache):
    whole = write_tiny_gguf(tmp_path / "whole.gguf").read_bytes()
    for cut in (10, 200, len(whole) - 100):
        path = tmp_path / f"cut{cut}.gguf"
        path.write_bytes(whole[:cut])
        assert "truncated" in _one_line_error(str(path))
    foreign = tmp_path / "foreign.gguf"
    foreign.write_bytes(b"PK\x03\x04 not a gguf file")
    assert "is not a GGUF file" in _one_line_error(str(foreign))
    assert not any(cache.rglob("config.json"))


def test_unsupported_tensor_type_names_the_tensor(tmp_path, cache):
    # IQ4_NL blocks: 2-byte scale + 16 bytes of nibbles per 32 weights; one row of 32 weights
    raw = np.zeros((1, 18), dtype=np.uint8)
    path = write_tiny_gguf(tmp_path / "iq.gguf", extra_tensor=("blk.0.attn_q.bias", raw, "IQ4_NL"))
    message = _one_line_error(str(path))
    assert "'blk.0.attn_q.bias'" in message and "IQ4_NL" in message


def test_find_gguf_in_folders(tmp_path):
    assert find_gguf(str(tmp_path)) is None  # empty folder: not ours to judge
    one = tmp_path / "one"
    one.mkdir()
    write_tiny_gguf(one / "model.gguf")
    assert find_gguf(str(one)) == one / "model.gguf"
    write_tiny_gguf(one / "other.gguf")
    with pytest.raises(ModelNotFoundError, match="2 .gguf files"):
        find_gguf(str(one))
    (one / "config.json").write_text("{}")  # an HF folder wins over stray .gguf files
    assert find_gguf(str(one)) is None


FAMILIES = {
    "llama": dict(model_type="llama", vocab_size=512, hidden_size=64, intermediate_size=128,
                  num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                  max_position_embeddings=512, rms_norm_eps=1e-5, tie_word_embeddings=False,
                  initializer_range=0.1),
    "qwen2": dict(model_type="qwen2", vocab_size=512, hidden_size=64, intermediate_size=128,
                  num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=1,
                  max_position_embeddings=512, rms_norm_eps=1e-6, tie_word_embeddings=False,
                  initializer_range=0.1),
    "qwen3": dict(model_type="qwen3", vocab_size=512, hidden_size=64, intermediate_size=128,
                  num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                  max_position_embeddings=512, rms_norm_eps=1e-6, tie_word_embeddings=True,
                  initializer_range=0.1),
}


@pytest.mark.parametrize("family", list(FAMILIES))
def test_hf_gguf_hf_round_trip(tmp_path, cache, family):
    """F32 GGUF: bit-identical weights back; Q8_0 GGUF: exactly gguf's own dequantization;
    the converted folder serves the same greedy tokens as the original."""
    import gguf
    from safetensors.numpy import load_file

    from infer_cluster.worker import LLM

    hf_dir = build_checkpoint(tmp_path / "hf", FAMILIES[family], seed=3)
    original = load_file(str(hf_dir / "model.safetensors"))
    src = write_gguf_from_hf(hf_dir, tmp_path / f"{family}.gguf", permute=family == "llama",
                             chat_template="{{ messages[0]['content'] }}")
    out = resolve_model_path(str(src))
    assert out.parent.parent == cache
    back = load_file(str(out / "model.safetensors"))
    assert sorted(back) == sorted(original)
    for name, value in original.items():
        assert np.array_equal(back[name], value), name
    config = json.loads((out / "config.json").read_text())
    want = json.loads((hf_dir / "config.json").read_text())
    for key in ("model_type", "hidden_size", "num_hidden_layers", "num_attention_heads",
                "num_key_value_heads", "intermediate_size", "vocab_size", "tie_word_embeddings",
                "eos_token_id"):
        assert config[key] == want[key], key
    assert config["rms_norm_eps"] == pytest.approx(want["rms_norm_eps"])

    from transformers import AutoTokenizer
    ours, theirs = (AutoTokenizer.from_pretrained(str(d)) for d in (out, hf_dir))
    text = "Hello, world! The quick brown fox 42 times.\ndef main():\n    return 0"
    assert ours.encode(text) == theirs.encode(text)
    assert ours.chat_template == "{{ messages[0]['content'] }}"

    prompts = [[5, 9, 200, 17], list(range(3, 40)), [300] * 20]
    greedy = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    a = LLM(str(hf_dir), block_size=16).generate(prompts, greedy, use_tqdm=False)
    b = LLM(str(src), block_size=16).generate(prompts, greedy, use_tqdm=False)
    assert [o.token_ids for o in a] == [o.token_ids for o in b]

    q8 = write_gguf_from_hf(hf_dir, tmp_path / f"{family}-q8.gguf", qtype="Q8_0", permute=family == "llama")
    back = load_file(str(resolve_model_path(str(q8)) / "model.safetensors"))
    q = gguf.GGMLQuantizationType.Q8_0
    for name, value in original.items():
        want = value if value.ndim == 1 else gguf.quants.dequantize(gguf.quants.quantize(value, q), q)
        assert np.array_equal(back[name], want), name


def test_an_abandoned_conversion_is_removed_by_the_next(tmp_path, cache):
    """A conversion killed half way leaves its temporary folder (hundreds of MB for a real
    model); the next conversion of that file on this host removes it once its writer is gone,
    and leaves a live writer's and another host's alone."""
    import subprocess
    import sys

    from infer_cluster.worker.loading import gguf as gguf_mod

    hf_dir = build_checkpoint(tmp_path / "hf", FAMILIES["llama"], seed=3)
    src = write_gguf_from_hf(hf_dir, tmp_path / "llama.gguf")
    target = gguf_mod.converted_path(src.resolve())
    target.parent.mkdir(parents=True)
    ended = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                           capture_output=True, text=True, timeout=60)
    dead_pid = int(ended.stdout)
    prefix = f"{gguf_mod._tmp_prefix(target)}"
    dead = target.parent / f"{prefix}{gguf_mod._HOST}-{dead_pid}-abc_12"
    live = target.parent / f"{prefix}{gguf_mod._HOST}-{os.getpid()}-def_34"
    other_host = target.parent / f"{prefix}otherhost-{dead_pid}-ghi_56"
    for d in (dead, live, other_host):
        d.mkdir()
        (d / "model.safetensors").write_bytes(b"\0" * 1024)
    assert gguf_mod.ensure_converted(src) == target and (target / "config.json").exists()
    assert not dead.exists()
    assert live.exists() and other_host.exists()
    leftovers = sorted(p.name for p in target.parent.iterdir())
    assert leftovers == sorted([target.name, live.name, other_host.name]), leftovers
