"""Split-K partial sums through the decoder layers on the CPU: `RowParallelLinear.forward_split`
(the o and down projections) made to return partials as the Gluon GEMM does on an H200
(float32 `[splits, rows_pad, N]`, padding rows never read), and the model's logits equal the
unsplit forward's. Checks the plumbing: the MLP's and the next layer's add + norm sum them, the
last layer's down never returns them (the LM head selects its rows)."""

from pathlib import Path

import pytest
import torch

from infer_cluster.worker.config import EngineConfig
from infer_cluster.worker.loading.embedded import build_checkpoint
from infer_cluster.worker.loading.loader import load_hf_config
from infer_cluster.worker.models import parallel
from infer_cluster.worker.models.decoder import AttentionMetadata, ModelSpec
from infer_cluster.worker.runner.model_runner import ModelRunner
from tests.parity.conftest import FAMILIES

BLOCK = 8


def _partials(x, weight, splits=3, pad=5):
    """What `gemm_sm90(partials=True)` returns: each K split's float32 product, the padding rows
    NaN here (the kernel's are zeros) so that reading one would show."""
    rows, n = x.shape[0], weight.shape[0]
    out = torch.full((splits, rows + pad, n), float("nan"))
    for s, ks in enumerate(torch.tensor_split(torch.arange(x.shape[1]), splits)):
        out[s, :rows] = x[:, ks].float() @ weight[:, ks].float().T
    return out


@pytest.mark.parametrize("family", ["qwen3", "llama"])
def test_partials_through_the_layers_equal_the_unsplit_forward(tmp_path, monkeypatch, family):
    path = Path(build_checkpoint(tmp_path / family, FAMILIES[family], seed=7))
    hf_config = load_hf_config(path)
    spec = ModelSpec.from_hf_config(hf_config)
    config = EngineConfig(model=str(path), device="cpu", dtype="float32", block_size=BLOCK,
                          num_kv_blocks=16, enforce_eager=True)
    rows = 3
    tables = torch.arange(rows, dtype=torch.int32)[:, None] * 2 + torch.arange(2, dtype=torch.int32)
    ids = torch.tensor([5, 17, 33])
    positions = torch.zeros(rows, dtype=torch.int64)
    slots = tables[:, 0].long() * BLOCK
    meta = AttentionMetadata(slots, tables, torch.ones(rows, dtype=torch.int32),
                             torch.arange(rows + 1, dtype=torch.int32), 1)

    def logits():  # a fresh runner each time: the forward writes its KV
        runner = ModelRunner(config, spec, path, hf_config, 64)
        with torch.inference_mode():
            return runner._forward_logits(ids, positions, meta, runner.context.kv_caches)

    want = logits()
    calls = []

    def split(self, x):
        calls.append(self.weight.shape)
        return _partials(x, self.weight)
    monkeypatch.setattr(parallel.RowParallelLinear, "forward_split", split)
    got = logits()
    o_shape = (spec.hidden_size, spec.num_heads * spec.head_dim)
    down_shape = (spec.hidden_size, spec.intermediate_size)
    # o in every layer; down in every layer but the last
    assert calls.count(o_shape) == spec.num_layers and calls.count(down_shape) == spec.num_layers - 1
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
