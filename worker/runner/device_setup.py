"""The device and dtypes a runner uses, from `EngineConfig` and the checkpoint's config.

Owns: `resolve_device` (the CUDA device of a rank, or the CPU), `resolve_dtype` (the model's
compute dtype: the config's, else float32 on the CPU, else the checkpoint's half type, bf16 by
default) and `resolve_kv_dtype` (the KV cache's storage: the model dtype, or int8). Used by the
model runner, the tensor/pipeline-parallel runner and the draft model's set-up.
"""

from __future__ import annotations

import torch

from infer_cluster.worker.config import EngineConfig

_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def resolve_device(config: EngineConfig, local_rank: int = 0) -> torch.device:
    if config.device == "cuda" or (config.device == "auto" and torch.cuda.is_available()):
        if not torch.cuda.is_available():
            raise RuntimeError("device='cuda' was asked for but torch sees no CUDA device")
        index = config.device_ids[local_rank] if config.device_ids else local_rank
        return torch.device("cuda", index)
    return torch.device("cpu")


def resolve_kv_dtype(config: EngineConfig, dtype: torch.dtype) -> torch.dtype:
    """KV cache storage dtype: the model dtype (`auto`) or int8 (scales kept beside it)."""
    return torch.int8 if config.kv_cache_dtype == "int8" else dtype


def resolve_dtype(config: EngineConfig, hf_config, device: torch.device) -> torch.dtype:
    if config.dtype != "auto":
        return _DTYPES[config.dtype]
    if device.type == "cpu":
        return torch.float32
    ckpt = str(getattr(hf_config, "dtype", None) or getattr(hf_config, "torch_dtype", "") or "")
    return torch.float16 if "float16" in ckpt and "bfloat16" not in ckpt else torch.bfloat16
