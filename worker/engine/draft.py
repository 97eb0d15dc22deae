"""The draft model of `speculative_config` method `draft_model`: its runner, built by the engine.

Owns: `build_draft_runner`, which loads `speculative_config.model` like the target (any model
path or embedded name; the target's `load_format`, device and dtype) into a `ModelRunner` of
its own, and refuses (one line naming `speculative_config.model`) a draft that cannot be found,
whose vocabulary differs from the target's, or whose positions do not reach `max_model_len`;
and `attach_draft_pool`, which gives the draft's runner a KV pool of the target's block count
(one allocator, two pools: a block id means the same positions in both). The draft is built
before the target so that, on a GPU, its weights are counted when the target sizes the pool
(the target's per-block cost then includes the draft's: `ModelRunner(kv_companion=)`, which
also counts the draft's new pool when the target's pool is resized).
The proposer that drives it is worker/spec_decode/draft.py; the engine hands it this runner.
At tensor_parallel_size T > 1 the draft is not split: it runs whole on rank 0's device, in the
engine's process. Rank 0 alone proposes, draws and accepts already (the other ranks run a
verify step as an ordinary step), so the draft needs no rank group and no traffic between the
ranks; its weights and KV take room on rank 0's GPU only, which its pool sizing counts
(`DistributedRunner(kv_companion=)`), and the ranks agree on the smallest block count.
"""

from __future__ import annotations

from typing import Optional

from infer_cluster.protocol import ModelNotFoundError
from infer_cluster.protocol.errors import ConfigError

from infer_cluster.worker.config import EngineConfig
from infer_cluster.worker.loading.loader import load_hf_config, resolve_model_path
from infer_cluster.worker.models.decoder import ModelSpec
from infer_cluster.worker.runner.device_setup import resolve_device, resolve_dtype
from infer_cluster.worker.runner.model_runner import ModelRunner

_DTYPE_NAMES = {"torch.float32": "float32", "torch.float16": "float16", "torch.bfloat16": "bfloat16"}


def build_draft_runner(config: EngineConfig, target_hf_config, target: ModelSpec,
                       max_model_len: int) -> Optional[ModelRunner]:
    """The draft model's runner (with a one-block pool until `attach_draft_pool`), or None
    unless `config.speculative_config` is method draft_model."""
    spec_config = config.speculative_config
    if spec_config is None or spec_config.method != "draft_model":
        return None
    name = spec_config.model
    try:
        path = resolve_model_path(name)
        hf_config = load_hf_config(path)
        spec = ModelSpec.from_hf_config(hf_config)
    except (ModelNotFoundError, ValueError, OSError) as exc:
        raise ConfigError(f"speculative_config.model {name!r} cannot be loaded: {exc}") from None
    if spec.vocab_size != target.vocab_size:
        raise ConfigError(f"speculative_config.model {name!r} has a vocabulary of {spec.vocab_size} "
                          f"tokens; the target's has {target.vocab_size} (they must be the same)")
    if spec.max_position_embeddings < max_model_len:
        raise ConfigError(f"speculative_config.model {name!r} reaches {spec.max_position_embeddings} "
                          f"positions, fewer than max_model_len ({max_model_len})")
    dtype = resolve_dtype(config, target_hf_config, resolve_device(config))
    # One rank whatever the target's layout: at T > 1 the draft runs whole on rank 0's device,
    # in the engine's process, which alone proposes (the ranks only see verify steps).
    draft_config = config.replace(model=str(path), tokenizer=None, dtype=_DTYPE_NAMES[str(dtype)],
                                  num_kv_blocks=1, kv_offload_gib=0.0, speculative_config=None,
                                  warmup=False, tensor_parallel_size=1, pipeline_parallel_size=1,
                                  device_ids=config.device_ids[:1] if config.device_ids else None)
    # CUDA graphs as the target (enforce_eager): decode graphs for its one-token proposal steps,
    # mixed-step graphs for its catch-up chunks; captured once its real pool is attached.
    return ModelRunner(draft_config, spec, path, hf_config, max_model_len, defer_graphs=True)


def attach_draft_pool(draft: ModelRunner, num_kv_blocks: int, kv_cache_dtype: str) -> None:
    """Give the draft `num_kv_blocks` blocks (the target's count) of `kv_cache_dtype` storage;
    also after a resize of the target's pool (the draft's old KV is dropped). Its graphs go
    first (they hold the old pool) and are captured anew over the new one."""
    draft.release_graphs()
    draft.resize_kv_pool(num_kv_blocks, kv_cache_dtype, {})
