"""Checkpoints we write (embedded models, the tests' tiny families) state every config field, so
the engine reads them as plain JSON, without transformers' `AutoConfig`: the model, dtype and
EOS ids must be those `AutoConfig` gives with each family's defaults, and the tokenizer built
by its class must be the one `AutoTokenizer` builds."""

import pytest
import torch
from transformers import AutoConfig, AutoTokenizer

from infer_cluster.worker.config import EngineConfig
from infer_cluster.worker.loading.embedded import EMBEDDED_MODELS, build_checkpoint
from infer_cluster.worker.loading.loader import complete_config, load_hf_config, load_tokenizer
from infer_cluster.worker.models.decoder import ModelSpec
from infer_cluster.worker.runner.device_setup import resolve_dtype

from tests.parity.conftest import FAMILIES

SPECS = {**FAMILIES, **{name: {k: v for k, v in spec.items() if k != "weights"}
                        for name, spec in EMBEDDED_MODELS.items() if "gguf_package" not in spec}}


@pytest.mark.parametrize("name", list(SPECS))
def test_plain_config_reads_as_autoconfig_does(tmp_path, name):
    path = build_checkpoint(tmp_path / name, SPECS[name], weights=False)
    assert complete_config(path)
    plain, auto = load_hf_config(path), AutoConfig.from_pretrained(str(path))
    assert type(plain).__module__ == "types"  # not a transformers config class
    assert ModelSpec.from_hf_config(plain) == ModelSpec.from_hf_config(auto)
    config = EngineConfig(model=str(path))
    for device in ("cpu", "cuda"):
        assert resolve_dtype(config, plain, torch.device(device)) == resolve_dtype(config, auto, torch.device(device))
    assert (plain.eos_token_id, getattr(plain, "bos_token_id", None)) == (auto.eos_token_id, auto.bos_token_id)


def test_tokenizer_by_its_class_is_autotokenizers(tmp_path):
    path = build_checkpoint(tmp_path / "tiny", FAMILIES["qwen3"], weights=False)
    ours, auto = load_tokenizer(path), AutoTokenizer.from_pretrained(str(path))
    assert type(ours) is type(auto)
    text = "Hello, world! def main():\n    return 42 <|endoftext|>"
    assert ours.encode(text) == auto.encode(text)
    assert ours.decode(ours.encode(text)) == auto.decode(auto.encode(text))
    chat = [{"role": "user", "content": "What is the capital of France?"}]
    assert (ours.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
            == auto.apply_chat_template(chat, tokenize=False, add_generation_prompt=True))
    assert (ours.eos_token_id, ours.pad_token_id) == (auto.eos_token_id, auto.pad_token_id)


def test_a_folder_without_the_marker_goes_through_autoconfig(tmp_path):
    path = build_checkpoint(tmp_path / "hf", FAMILIES["llama"], weights=False)
    (path / "infer_cluster.json").unlink()
    assert not complete_config(path)
    assert type(load_hf_config(path)).__name__ == "LlamaConfig"


def test_an_hf_folder_without_the_marker_serves_the_same_tokens(tmp_path):
    """The path of a folder from elsewhere (no marker, config.json as `save_pretrained` writes
    it: only the fields that differ from the family's defaults) gives the same greedy tokens."""
    import shutil

    from infer_cluster.protocol import SamplingParams
    from infer_cluster.worker import LLM

    ours = build_checkpoint(tmp_path / "ours", FAMILIES["qwen2"], seed=5)
    hub = tmp_path / "hub"
    shutil.copytree(ours, hub)
    (hub / "infer_cluster.json").unlink()
    AutoConfig.from_pretrained(str(hub)).save_pretrained(str(hub))
    assert not complete_config(hub)
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    outs = []
    for path in (ours, hub):
        llm = LLM(str(path), block_size=8, num_kv_blocks=32)
        try:
            outs.append([o.token_ids for o in llm.generate([[5, 6, 7], [9, 10, 11, 12]], params, use_tqdm=False)])
        finally:
            llm.close()
    assert outs[0] == outs[1] and len(outs[0][0]) == 8
