"""The body of the per-stage decode graphs (`ModelRunner._forward_stage_decode`, what
every stage captures at P > 1) on the CPU, without graphs or processes: stage 0
of a two-stage split hands its packed `[rows, 2, hidden]` to stage 1, whose logits equal the whole
model's decode forward (`_forward_logits`, the body of the P = 1 graphs), over several decode
steps that read the KV each stage wrote. The GPU test with real graphs and transfers is
`test_gpu_stage_graphs_greedy_matches` in test_gpu.py."""

from pathlib import Path

import pytest
import torch

from infer_cluster.worker.config import EngineConfig
from infer_cluster.worker.loading.loader import load_hf_config
from infer_cluster.worker.runner.model_runner import ModelRunner
from infer_cluster.worker.models.decoder import AttentionMetadata, ModelSpec

BLOCK = 8


def _runners(path, layer_ranges):
    hf_config = load_hf_config(path)
    spec = ModelSpec.from_hf_config(hf_config)
    config = EngineConfig(model=str(path), device="cpu", dtype="float32", block_size=BLOCK,
                          num_kv_blocks=16, enforce_eager=True)
    return spec, [ModelRunner(config, spec, path, hf_config, 64, layer_range=r) for r in layer_ranges]


@pytest.mark.parametrize("family", ["qwen3", "llama"])
def test_two_stages_equal_the_whole_model(dist_checkpoints, family):
    path = Path(dist_checkpoints[family])
    spec, (whole, first, last) = _runners(path, [None, (0, 1), (1, 2)])
    assert spec.num_layers == 2
    rows = 3
    tables = torch.arange(rows, dtype=torch.int32)[:, None] * 2 + torch.arange(2, dtype=torch.int32)
    gen = torch.Generator().manual_seed(0)
    for pos in range(5):  # each step decodes one token per row, after `pos` earlier ones
        ids = torch.randint(2, spec.vocab_size, (rows,), generator=gen)
        positions = torch.full((rows,), pos, dtype=torch.int64)
        slots = tables[:, pos // BLOCK].long() * BLOCK + pos % BLOCK
        meta = AttentionMetadata(slots, tables, torch.full((rows,), pos + 1, dtype=torch.int32),
                                 torch.arange(rows + 1, dtype=torch.int32), 1)
        with torch.inference_mode():
            want = whole._forward_logits(ids, positions, meta, whole.context.kv_caches)
            packed = first._forward_stage_decode(ids, positions, meta, first.context.kv_caches)
            assert packed.shape == (rows, 2, spec.hidden_size) and packed.is_contiguous()
            got = last._forward_stage_decode(ids, positions, meta, last.context.kv_caches, packed)
        assert got.shape == want.shape
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
