"""GGUF metadata -> a Hugging Face `config.json` dict, for the architectures we serve.

Owns: the table of GGUF architectures we accept (`GGUF_ARCHS`), reading `<arch>.*` and
`tokenizer.ggml.*` metadata keys into HF config names, and recovering rope scaling (linear from
metadata; Llama 3's from the `rope_freqs` tensor llama.cpp stores instead of the parameters).
Never touches tensor data beyond that small `rope_freqs` vector, and never imports torch.

To add an architecture: add a `GGUFArch` to `GGUF_ARCHS` (its HF model type, and whether
llama.cpp permuted its Q/K rows), and make sure `models/decoder.py` serves that model type.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Optional

import numpy as np

from infer_cluster.protocol import ModelNotFoundError


@dataclass(frozen=True)
class GGUFArch:
    model_type: str
    hf_class: str
    # llama.cpp's converter reorders the rows of Q and K of Llama-style models so that its own
    # rotary kernel (adjacent pairs) computes what HF's rotate-half layout computes; Qwen models
    # use llama.cpp's NeoX-style rope and are stored unpermuted.
    permuted_qk: bool


GGUF_ARCHS = {
    "llama": GGUFArch("llama", "LlamaForCausalLM", permuted_qk=True),
    "mistral": GGUFArch("mistral", "MistralForCausalLM", permuted_qk=True),
    "qwen2": GGUFArch("qwen2", "Qwen2ForCausalLM", permuted_qk=False),
    "qwen3": GGUFArch("qwen3", "Qwen3ForCausalLM", permuted_qk=False),
}


def field_value(reader, key: str, default: Any = None) -> Any:
    """One metadata value (a scalar, a string, or a list for an array), or `default`."""
    field = reader.fields.get(key)
    if field is None:
        return default
    return field.contents()


def gguf_arch(reader, path) -> tuple[str, GGUFArch]:
    name = field_value(reader, "general.architecture")
    if name not in GGUF_ARCHS:
        raise ModelNotFoundError(f"GGUF file {str(path)!r} has architecture {name!r}, which is not "
                                 f"supported (supported: {', '.join(GGUF_ARCHS)})")
    return name, GGUF_ARCHS[name]


def hf_config_dict(reader, path) -> dict:
    """The HF config of the model in `reader` (a `gguf.GGUFReader`). The tied-embedding flag
    comes from the tensors: a file without `output.weight` reuses `token_embd` as the LM head."""
    name, arch = gguf_arch(reader, path)
    tensors = {t.name: t for t in reader.tensors}

    def need(key: str):
        value = field_value(reader, f"{name}.{key}")
        if value is None:
            raise ModelNotFoundError(f"GGUF file {str(path)!r} lacks metadata {name}.{key}")
        if isinstance(value, list):  # per-layer values (e.g. OpenELM); our models are uniform
            raise ModelNotFoundError(f"GGUF file {str(path)!r}: {name}.{key} varies by layer, "
                                     f"which is not supported")
        return value

    hidden, num_heads = int(need("embedding_length")), int(need("attention.head_count"))
    num_kv_heads = field_value(reader, f"{name}.attention.head_count_kv", num_heads)
    head_dim = field_value(reader, f"{name}.attention.key_length") or hidden // num_heads
    vocab = field_value(reader, f"{name}.vocab_size")
    if "token_embd.weight" not in tensors:
        raise ModelNotFoundError(f"GGUF file {str(path)!r} has no token_embd.weight tensor")
    if vocab is None:  # the embedding's rows (GGUF lists the hidden size first)
        vocab = int(tensors["token_embd.weight"].shape[1])
    theta = float(field_value(reader, f"{name}.rope.freq_base", 10000.0))
    config = {
        "architectures": [arch.hf_class],
        "model_type": arch.model_type,
        "hidden_size": hidden,
        "intermediate_size": int(need("feed_forward_length")),
        "num_hidden_layers": int(need("block_count")),
        "num_attention_heads": num_heads,
        "num_key_value_heads": int(num_kv_heads),
        "head_dim": int(head_dim),
        "rms_norm_eps": float(need("attention.layer_norm_rms_epsilon")),
        "rope_theta": theta,
        "max_position_embeddings": int(field_value(reader, f"{name}.context_length", 4096)),
        "vocab_size": int(vocab),
        "tie_word_embeddings": "output.weight" not in tensors,
        "hidden_act": "silu",
        "dtype": _checkpoint_dtype(reader),
    }
    for hf_key, gguf_key in (("bos_token_id", "bos_token_id"), ("eos_token_id", "eos_token_id"),
                             ("pad_token_id", "padding_token_id")):
        value = field_value(reader, f"tokenizer.ggml.{gguf_key}")
        config[hf_key] = int(value) if value is not None else None
    if arch.model_type in ("llama", "mistral", "qwen3"):
        config["attention_bias"] = "blk.0.attn_q.bias" in tensors
    if arch.model_type == "mistral":
        window = field_value(reader, f"{name}.attention.sliding_window")
        config["sliding_window"] = int(window) if window else None
    rope = rope_scaling(reader, name, tensors, int(head_dim), theta, path)
    if rope is not None:
        config["rope_scaling"] = rope
    return config


def _checkpoint_dtype(reader) -> str:
    """The float type the file's weights were exported from, for `dtype="auto"` on CUDA: float16
    when its matrices are F16 (as llama.cpp would compute), else bfloat16. The converted weights
    themselves are float32 whatever this says."""
    kinds = {t.tensor_type.name for t in reader.tensors if len(t.shape) == 2}
    return "float16" if kinds == {"F16"} else "bfloat16"


def rope_scaling(reader, name: str, tensors: dict, head_dim: int, theta: float, path) -> Optional[dict]:
    """HF `rope_scaling` for the file: None, linear (metadata), or llama3 (fitted to and checked
    against the per-frequency factors in `rope_freqs.weight`)."""
    kind = field_value(reader, f"{name}.rope.scaling.type")
    factor = field_value(reader, f"{name}.rope.scaling.factor")
    if kind == "linear" and factor and float(factor) != 1.0:
        return {"rope_type": "linear", "factor": float(factor)}
    if kind not in (None, "none", "linear"):
        raise ModelNotFoundError(f"GGUF file {str(path)!r} uses {kind!r} rope scaling, which is "
                                 f"not supported (none, linear, llama3)")
    freqs = tensors.get("rope_freqs.weight")
    if freqs is None:
        return None
    factors = np.asarray(freqs.data, dtype=np.float64).reshape(-1)
    if np.allclose(factors, 1.0):
        return None
    original = field_value(reader, f"{name}.rope.scaling.original_context_length") or 8192
    fit = {"rope_type": "llama3", "factor": float(factors.max()), "low_freq_factor": 1.0,
           "high_freq_factor": 4.0, "original_max_position_embeddings": int(original)}
    if len(factors) != head_dim // 2 or not np.allclose(factors, llama3_factors(fit, head_dim, theta),
                                                        rtol=1e-3):
        raise ModelNotFoundError(f"GGUF file {str(path)!r} has rope_freqs factors that match no "
                                 f"supported rope scaling (llama3 with factor {fit['factor']:g}, "
                                 f"low/high frequency factors 1/4, original length {original})")
    return fit


def llama3_factors(rope: dict, head_dim: int, theta: float) -> np.ndarray:
    """What llama.cpp stores in `rope_freqs.weight` for Llama 3 rope scaling: each frequency's
    divisor (1 for short wavelengths, `factor` for long ones, a smooth blend between)."""
    inv_freq = 1.0 / theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    factor, lo, hi = rope["factor"], rope["low_freq_factor"], rope["high_freq_factor"]
    old_len = rope["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv_freq
    smooth = (old_len / wavelen - lo) / (hi - lo)
    blended = 1.0 / ((1 - smooth) / factor + smooth)
    return np.where(wavelen < old_len / hi, 1.0, np.where(wavelen > old_len / lo, factor, blended))
