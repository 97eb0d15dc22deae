"""`EngineConfig`: every knob of one replica's engine, validated up front.

Owns: the engine options and their checks (clear messages naming the field, never `assert`).
Must never import torch at module level: the CLI builds configs without loading torch.
To add an option: add a field with a default, check it in `__post_init__`, and expose it in
`coordinator/cli.py` (it reads the fields of this dataclass to build flags).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Optional

from protocol.errors import ConfigError

DEVICES = ("auto", "cpu", "cuda")
DTYPES = ("auto", "float32", "float16", "bfloat16")
LOAD_FORMATS = ("auto", "dummy")


def _positive_int(name, value, allow_none=False):
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ConfigError(f"{name} must be a positive integer, got {value!r}")


@dataclass
class EngineConfig:
    model: str = "tiny-random"
    tokenizer: Optional[str] = None
    device: str = "auto"
    dtype: str = "auto"
    block_size: int = 16
    num_kv_blocks: Optional[int] = None  # None: size the pool from free memory after warm-up
    gpu_memory_utilization: float = 0.9
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    max_model_len: Optional[int] = None  # None: the model's max_position_embeddings
    enable_prefix_caching: bool = True
    enforce_eager: bool = False
    load_format: str = "auto"
    seed: int = 0
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    device_ids: Optional[list[int]] = None
    cpu_kv_cache_gib: float = 1.0  # KV pool size on CPU when num_kv_blocks is None

    def __post_init__(self):
        if not isinstance(self.model, str) or not self.model:
            raise ConfigError(f"model must be a model name or directory, got {self.model!r}")
        if self.device not in DEVICES:
            raise ConfigError(f"device must be one of {', '.join(DEVICES)}, got {self.device!r}")
        if self.dtype not in DTYPES:
            raise ConfigError(f"dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}")
        if self.load_format not in LOAD_FORMATS:
            raise ConfigError(f"load_format must be one of {', '.join(LOAD_FORMATS)}, got {self.load_format!r}")
        _positive_int("block_size", self.block_size)
        if self.block_size & (self.block_size - 1):
            raise ConfigError(f"block_size must be a power of two, got {self.block_size}")
        _positive_int("num_kv_blocks", self.num_kv_blocks, allow_none=True)
        if not isinstance(self.gpu_memory_utilization, (int, float)) or not 0 < self.gpu_memory_utilization <= 1:
            raise ConfigError(f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization!r}")
        _positive_int("max_num_seqs", self.max_num_seqs)
        _positive_int("max_num_batched_tokens", self.max_num_batched_tokens)
        _positive_int("max_model_len", self.max_model_len, allow_none=True)
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise ConfigError(f"seed must be a non-negative integer, got {self.seed!r}")
        _positive_int("tensor_parallel_size", self.tensor_parallel_size)
        _positive_int("pipeline_parallel_size", self.pipeline_parallel_size)
        if self.device_ids is not None:
            if isinstance(self.device_ids, str):
                self.device_ids = [int(x) for x in self.device_ids.split(",") if x.strip()]
            if any(not isinstance(d, int) or d < 0 for d in self.device_ids):
                raise ConfigError(f"device_ids must be non-negative integers, got {self.device_ids!r}")
            if len(self.device_ids) != self.world_size:
                raise ConfigError(f"device_ids lists {len(self.device_ids)} devices but "
                                  f"tensor_parallel_size x pipeline_parallel_size = {self.world_size}")
        if self.cpu_kv_cache_gib <= 0:
            raise ConfigError(f"cpu_kv_cache_gib must be > 0, got {self.cpu_kv_cache_gib!r}")

    @property
    def world_size(self) -> int:
        return self.tensor_parallel_size * self.pipeline_parallel_size

    @classmethod
    def field_names(cls) -> list[str]:
        return [f.name for f in dataclasses.fields(cls)]

    def replace(self, **changes) -> "EngineConfig":
        return dataclasses.replace(self, **changes)
