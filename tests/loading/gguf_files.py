"""Small GGUF files for tests, written with `gguf.GGUFWriter` the way llama.cpp's converter lays
them out: HF checkpoints turned into GGUF (names, reversed shapes, Llama's Q/K rows permuted,
the byte-level BPE tokenizer as `tokenizer.ggml.*`), plus hand-made broken ones."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import numpy as np

HF_TO_GGUF_LEAF = {"input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
                   "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
                   "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
                   "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm",
                   "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}


def llama_cpp_permute(w: np.ndarray, num_heads: int) -> np.ndarray:
    """llama.cpp's reordering of Q/K rows (its convert script's `permute`): within each head the
    two rotary halves are interleaved, row i of the first half then row i of the second."""
    head = w.shape[0] // num_heads
    return (w.reshape(num_heads, 2, head // 2, *w.shape[1:])
             .swapaxes(1, 2).reshape(w.shape))


def gguf_name(hf_name: str) -> str:
    if hf_name == "model.embed_tokens.weight":
        return "token_embd.weight"
    if hf_name == "model.norm.weight":
        return "output_norm.weight"
    if hf_name == "lm_head.weight":
        return "output.weight"
    _, _, layer, rest = hf_name.split(".", 3)
    module, kind = rest.rsplit(".", 1)
    return f"blk.{layer}.{HF_TO_GGUF_LEAF[module]}.{kind}"


def add_tokenizer(writer, hf_dir: Path, chat_template: Optional[str] = None) -> None:
    """The folder's byte-level BPE tokenizer as GGUF `gpt2` tokenizer metadata."""
    import gguf

    spec = json.loads((hf_dir / "tokenizer.json").read_text())
    vocab = spec["model"]["vocab"]
    tokens = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
    merges = [m if isinstance(m, str) else " ".join(m) for m in spec["model"]["merges"]]
    special = {t["content"] for t in spec.get("added_tokens", []) if t.get("special")}
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list(tokens)
    writer.add_token_merges(merges)
    writer.add_token_types([gguf.TokenType.CONTROL if t in special else gguf.TokenType.NORMAL
                            for t in tokens])
    config = json.loads((hf_dir / "config.json").read_text())
    writer.add_eos_token_id(int(config["eos_token_id"]))
    if config.get("pad_token_id") is not None:
        writer.add_pad_token_id(int(config["pad_token_id"]))
    if chat_template:
        writer.add_chat_template(chat_template)


def write_gguf_from_hf(hf_dir: Path, out: Path, qtype: str = "F32", permute: bool = True,
                       chat_template: Optional[str] = None) -> Path:
    """A GGUF of the HF checkpoint in `hf_dir`: 2-D weights as `qtype` (F32, F16 or Q8_0), norms
    and biases F32, Q/K rows permuted for Llama (`permute`) as llama.cpp does."""
    import gguf
    from safetensors.numpy import load_file

    config = json.loads((hf_dir / "config.json").read_text())
    arch = config["model_type"]
    tensors = load_file(str(hf_dir / "model.safetensors"))
    writer = gguf.GGUFWriter(str(out), arch)
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(config["num_attention_heads"])
    writer.add_head_count_kv(config["num_key_value_heads"])
    if config.get("head_dim"):
        writer.add_key_length(config["head_dim"])
        writer.add_value_length(config["head_dim"])
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    theta = (config.get("rope_parameters") or {}).get("rope_theta", config.get("rope_theta", 10000.0))
    writer.add_rope_freq_base(float(theta))
    writer.add_vocab_size(config["vocab_size"])
    add_tokenizer(writer, hf_dir, chat_template)
    heads = {"attn_q": config["num_attention_heads"], "attn_k": config["num_key_value_heads"]}
    for name, value in tensors.items():
        target = gguf_name(name)
        value = value.astype(np.float32)
        leaf = target.split(".")[2] if target.startswith("blk.") else None
        if permute and leaf in heads:
            value = llama_cpp_permute(value, heads[leaf])
        if value.ndim == 2 and qtype != "F32":
            kind = gguf.GGMLQuantizationType[qtype]
            writer.add_tensor(target, gguf.quants.quantize(value, kind), raw_dtype=kind)
        else:
            writer.add_tensor(target, value)
    _close(writer)
    return out


def write_tiny_gguf(out: Path, arch: str = "llama", extra_tensor=None, skip_output: bool = False,
                    metadata: Optional[dict] = None) -> Path:
    """A minimal one-layer GGUF with metadata and random F32 weights and no tokenizer;
    `extra_tensor` = (name, array, ggml type name) adds one more tensor: a float32 array with
    type None, or uint8 blocks shaped [rows, row bytes] of the named type."""
    import gguf

    rng = np.random.default_rng(0)
    hidden, inter, heads, kv, vocab = 32, 64, 4, 2, 64
    writer = gguf.GGUFWriter(str(out), arch)
    writer.add_block_count(1)
    writer.add_context_length(256)
    writer.add_embedding_length(hidden)
    writer.add_feed_forward_length(inter)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_rope_freq_base(500000.0)
    for key, value in (metadata or {}).items():
        (writer.add_float32 if isinstance(value, float) else
         writer.add_string if isinstance(value, str) else writer.add_uint32)(key, value)
    shapes = {"token_embd.weight": (vocab, hidden), "output_norm.weight": (hidden,),
              "blk.0.attn_norm.weight": (hidden,), "blk.0.ffn_norm.weight": (hidden,),
              "blk.0.attn_q.weight": (hidden, hidden), "blk.0.attn_k.weight": (kv * 8, hidden),
              "blk.0.attn_v.weight": (kv * 8, hidden), "blk.0.attn_output.weight": (hidden, hidden),
              "blk.0.ffn_gate.weight": (inter, hidden), "blk.0.ffn_up.weight": (inter, hidden),
              "blk.0.ffn_down.weight": (hidden, inter)}
    if not skip_output:
        shapes["output.weight"] = (vocab, hidden)
    for name, shape in shapes.items():
        writer.add_tensor(name, rng.standard_normal(shape).astype(np.float32))
    if extra_tensor is not None:
        name, raw, kind = extra_tensor
        writer.add_tensor(name, raw, raw_dtype=gguf.GGMLQuantizationType[kind] if kind else None)
    _close(writer)
    return out


def _close(writer) -> None:
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
