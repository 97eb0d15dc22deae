"""`EngineConfig`: every knob of one replica's engine, validated up front.

Owns: the engine options and their checks (clear messages naming the field, never `assert`).
Must never import torch at module level: the CLI builds configs without loading torch.
To add an option: add a field with a default, check it in `__post_init__`, and expose it in
`coordinator/cli.py` (it reads the fields of this dataclass to build flags).
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from typing import Optional, Union

from infer_cluster.protocol.errors import ConfigError
from infer_cluster.worker.spec_decode.config import SpeculativeConfig, refuse_unsupported

DEVICES = ("auto", "cpu", "cuda")
DTYPES = ("auto", "float32", "float16", "bfloat16")
KV_CACHE_DTYPES = ("auto", "int8")
MICROBATCH_MODES = ("auto", "on", "off")
LOAD_FORMATS = ("auto", "dummy")


def env_count(name: str, default: int, unit: str, most: Optional[int] = None) -> int:
    """A whole number of `unit` from the environment variable `name` (`default` when unset; 0
    means off where the caller says so); a `ConfigError` names the variable on a bad value."""
    raw = os.environ.get(name, "").strip()
    try:
        value = int(raw) if raw else default
    except ValueError:
        raise ConfigError(f"{name}={raw!r} is not a whole number of {unit}") from None
    if value < 0 or (most is not None and value > most):
        limit = f" up to {most}" if most is not None else " or more"
        raise ConfigError(f"{name}={raw!r} must be 0 (off){limit}")
    return value


def _positive_int(name, value, allow_none=False):
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ConfigError(f"{name} must be a positive integer, got {value!r}")


@dataclass
class EngineConfig:
    model: str = field(default="tiny-random", metadata={"help": "local HF model directory, a .gguf file (converted once into the cache) or an embedded name (tiny-random, small-random, small-random-151k, qwen3-0.6b-shape, llama-3-8b-shape, llama-3-70b-shape, smollm2-135m-instruct)"})
    tokenizer: Optional[str] = field(default=None, metadata={"help": "tokenizer directory if not the model's"})
    device: str = field(default="auto", metadata={"help": "auto (CUDA if present), cpu or cuda"})
    dtype: str = field(default="auto", metadata={"help": "auto (float32 on CPU, bf16/fp16 on CUDA), float32, float16 or bfloat16"})
    kv_cache_dtype: str = field(default="auto", metadata={"help": "KV cache storage: auto (the model dtype) or int8 (a float32 scale per token and KV head; about half the bytes of bf16 per block, so about twice the blocks)"})
    block_size: int = field(default=16, metadata={"help": "tokens per KV-cache block (power of two)"})
    num_kv_blocks: Optional[int] = field(default=None, metadata={"help": "KV blocks to allocate; default: sized from free memory after a warm-up pass"})
    gpu_memory_utilization: float = field(default=0.9, metadata={"help": "fraction of GPU memory for weights + activations + KV cache"})
    max_num_seqs: int = field(default=256, metadata={"help": "most sequences running at once"})
    max_num_batched_tokens: int = field(default=8192, metadata={"help": "token budget per step, shared by decodes and chunked prefills"})
    max_model_len: Optional[int] = field(default=None, metadata={"help": "longest prompt + output; default: the model's max_position_embeddings"})
    enable_prefix_caching: bool = field(default=True, metadata={"help": "reuse KV blocks of shared prompt prefixes"})
    enforce_eager: bool = field(default=False, metadata={"help": "disable CUDA graphs (decode steps, and small steps of up to graph_max_tokens tokens)"})
    graph_max_tokens: int = field(default=8192, metadata={"help": "steps of up to this many tokens that are not decode-only (prompts, a last prompt chunk beside decodes) also replay CUDA graphs, bucketed by powers of two from 16 to 512, then every 256 (each bucket one capture at start-up); larger steps run eagerly, host-bound for small models; below 16 = only decode steps use graphs"})
    load_format: str = field(default="auto", metadata={"help": "auto (safetensors) or dummy (random weights, real shapes)"})
    seed: int = field(default=0, metadata={"help": "seed for unseeded sampling and dummy weights"})
    tensor_parallel_size: int = field(default=1, metadata={"help": "ranks that split each layer"})
    pipeline_parallel_size: int = field(default=1, metadata={"help": "ranks that split the layer stack"})
    device_ids: Optional[list[int]] = field(default=None, metadata={"help": "GPUs this replica uses, e.g. 2,3 (one per rank)"})
    warmup: Optional[bool] = field(default=None, metadata={"help": "serve a synthetic workload at start (largest shapes, every sampling path) so nothing compiles or allocates while serving; default: on for CUDA, off on CPU"})
    cpu_kv_cache_gib: float = field(default=1.0, metadata={"help": "KV pool size on CPU when num_kv_blocks is not set"})
    async_scheduling: Union[bool, str] = field(default="auto", metadata={"help": "schedule and launch step n+1 while step n runs on the GPU, so the GPU never waits for Python (outputs are the same); unset = auto: on for CUDA (tensor and pipeline parallel included), off on CPU; with pipeline micro-batches a group's next step is launched before its draw reaches the host"})
    pipeline_microbatches: str = field(default="auto", metadata={"help": "with pipeline_parallel_size P > 1, keep up to P steps in flight on disjoint groups of the running batch so that every stage works at once (outputs are the same): on, off (one step at a time), or auto (on where stages replay CUDA graphs, i.e. on CUDA without enforce_eager; off on CPU: at P=2 on 2x H100 with stage graphs and async scheduling, 1.32x one step at a time; see docs/parallel.md)"})
    kv_offload_gib: float = field(default=0.0, metadata={"help": "host-memory KV tier in GiB (pinned on CUDA; 0 = off): prefix blocks evicted from the device pool are kept there and copied back on a hit, and preempted requests are swapped there instead of recomputed when it has room"})
    speculative_config: Optional[Union[dict, str, SpeculativeConfig]] = field(default=None, metadata={"help": "speculative decoding as JSON, e.g. '{\"method\": \"ngram\", \"num_speculative_tokens\": 8, \"prompt_lookup_min\": 3, \"prompt_lookup_max\": 4}': decode rows verify tokens proposed by prompt lookup (or by a draft model: {\"method\": \"draft_model\", \"model\": NAME}), several per forward (greedy output is the same; sampling keeps its distribution); unset = off. See docs/spec_decode.md"})

    def __post_init__(self):
        if not isinstance(self.model, str) or not self.model:
            raise ConfigError(f"model must be a model name or directory, got {self.model!r}")
        if self.device not in DEVICES:
            raise ConfigError(f"device must be one of {', '.join(DEVICES)}, got {self.device!r}")
        if self.dtype not in DTYPES:
            raise ConfigError(f"dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}")
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ConfigError(f"kv_cache_dtype must be one of {', '.join(KV_CACHE_DTYPES)}, got {self.kv_cache_dtype!r}")
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
        if isinstance(self.graph_max_tokens, bool) or not isinstance(self.graph_max_tokens, int) \
                or self.graph_max_tokens < 0:
            raise ConfigError(f"graph_max_tokens must be a non-negative integer, got {self.graph_max_tokens!r}")
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
        if (isinstance(self.kv_offload_gib, bool) or not isinstance(self.kv_offload_gib, (int, float))
                or not 0 <= self.kv_offload_gib < 1 << 20):
            raise ConfigError(f"kv_offload_gib must be a number of GiB >= 0 (0 = off), got {self.kv_offload_gib!r}")
        if self.async_scheduling not in (True, False, "auto"):
            raise ConfigError(f"async_scheduling must be true, false or 'auto', got {self.async_scheduling!r}")
        if isinstance(self.pipeline_microbatches, bool):  # a JSON/YAML true/false
            self.pipeline_microbatches = "on" if self.pipeline_microbatches else "off"
        if self.pipeline_microbatches not in MICROBATCH_MODES:
            raise ConfigError(f"pipeline_microbatches must be one of {', '.join(MICROBATCH_MODES)}, "
                              f"got {self.pipeline_microbatches!r}")
        if self.pipeline_microbatches == "on" and self.pipeline_parallel_size == 1:
            raise ConfigError("pipeline_microbatches 'on' needs pipeline_parallel_size > 1; leave it at "
                              "auto (or off) with one pipeline stage")
        if self.kv_offload_gib and self.world_size > 1:
            raise ConfigError("kv_offload_gib (the host KV tier) works on single-rank replicas only; "
                              "set it to 0 or use tensor_parallel_size = pipeline_parallel_size = 1")
        self.speculative_config = SpeculativeConfig.parse(self.speculative_config)
        if self.speculative_config is not None:
            refuse_unsupported(self)

    @property
    def world_size(self) -> int:
        return self.tensor_parallel_size * self.pipeline_parallel_size

    @property
    def microbatch_depth(self) -> int:
        """Steps a replica keeps in flight on disjoint groups: P with pipeline micro-batches
        (`on`, or `auto` where stages replay CUDA graphs), else 1 (one step at a time)."""
        pp, mode = self.pipeline_parallel_size, self.pipeline_microbatches
        if pp == 1 or mode == "off":
            return 1
        return pp if mode == "on" or self._replays_graphs() else 1

    def _replays_graphs(self) -> bool:
        """CUDA without enforce_eager (eager stages are host-bound: micro-batches lose there)."""
        if self.enforce_eager or self.device == "cpu":
            return False
        if self.device == "cuda":
            return True
        import torch  # device auto: only the worker asks, with torch loaded already
        return torch.cuda.is_available()

    @classmethod
    def field_names(cls) -> list[str]:
        return [f.name for f in dataclasses.fields(cls)]

    def replace(self, **changes) -> "EngineConfig":
        return dataclasses.replace(self, **changes)
