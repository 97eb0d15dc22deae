"""Where each rank sits in a replica's T x P grid, and the timeouts every rank agrees on.

Owns: `check_divisible` (whether a model's heads and MLP split over T ranks), `RankLayout`
(global rank -> pipeline stage, tensor-parallel rank, layer range, its TP group's ranks, its
pipeline neighbours, the last stage's leader) and `DistributedOptions`
(rendezvous address, collective / heartbeat / start-up timeouts, read from the environment
once, validated with clear messages). Plain Python: it must never import torch, so the
layout can be unit-tested and read by the rank start-up preamble before torch loads.

Rank numbering: `rank = stage * tensor_parallel_size + tp_rank`, so rank 0 (the replica
process, which runs the scheduler) is stage 0, TP rank 0, and each stage's TP group is a
contiguous block of ranks. To add another kind of parallelism, extend `RankLayout` and keep
rank 0 at the origin of every axis.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

from infer_cluster.protocol.errors import ConfigError

if TYPE_CHECKING:  # the spec's module imports torch
    from infer_cluster.worker.models.decoder import ModelSpec


def check_divisible(spec: "ModelSpec", tp: int) -> None:
    """Raise `ConfigError` if the model's heads or MLP cannot be split over `tp` ranks."""
    problems = []
    if spec.num_heads % tp:
        problems.append(f"num_attention_heads ({spec.num_heads})")
    kv = spec.num_kv_heads
    if (kv >= tp and kv % tp) or (kv < tp and tp % kv):
        problems.append(f"num_key_value_heads ({kv}) (needs a multiple or a divisor of tp)")
    if spec.intermediate_size % tp:
        problems.append(f"intermediate_size ({spec.intermediate_size})")
    if problems:
        raise ConfigError(f"tensor_parallel_size {tp} does not divide {', '.join(problems)}")


@dataclass(frozen=True)
class RankLayout:
    rank: int
    tensor_parallel_size: int
    pipeline_parallel_size: int
    num_layers: int

    def __post_init__(self):
        if self.num_layers < self.pipeline_parallel_size:
            raise ConfigError(f"pipeline_parallel_size ({self.pipeline_parallel_size}) exceeds the "
                              f"model's {self.num_layers} layers: every stage needs at least one layer")
        if not 0 <= self.rank < self.world_size:
            raise ConfigError(f"rank {self.rank} is outside a world of {self.world_size} ranks")

    @property
    def world_size(self) -> int:
        return self.tensor_parallel_size * self.pipeline_parallel_size

    @property
    def stage(self) -> int:
        return self.rank // self.tensor_parallel_size

    @property
    def tp_rank(self) -> int:
        return self.rank % self.tensor_parallel_size

    @property
    def is_first_stage(self) -> bool:
        return self.stage == 0

    @property
    def is_last_stage(self) -> bool:
        return self.stage == self.pipeline_parallel_size - 1

    def stage_layers(self, stage: int) -> tuple[int, int]:
        """Contiguous `[start, end)` of `stage`; sizes differ by at most one, later stages
        take the extra layers (the first stage also holds the embedding)."""
        p, n = self.pipeline_parallel_size, self.num_layers
        base, extra = divmod(n, p)
        start = stage * base + max(0, stage - (p - extra))
        return start, start + base + (1 if stage >= p - extra else 0)

    @property
    def layer_range(self) -> tuple[int, int]:
        return self.stage_layers(self.stage)

    def tp_group_ranks(self, stage: int) -> list[int]:
        t = self.tensor_parallel_size
        return list(range(stage * t, (stage + 1) * t))

    @property
    def prev_rank(self) -> int:
        """Same TP rank on the previous stage (sends this rank its activations)."""
        return self.rank - self.tensor_parallel_size

    @property
    def next_rank(self) -> int:
        return self.rank + self.tensor_parallel_size

    @property
    def last_stage_leader(self) -> int:
        """TP rank 0 of the last stage: sends the sampled rows' logits to rank 0."""
        return (self.pipeline_parallel_size - 1) * self.tensor_parallel_size


def _env_float(name: str, default: float) -> float:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(f"{name} must be a number of seconds, got {raw!r}") from None
    if value <= 0:
        raise ConfigError(f"{name} must be > 0, got {raw!r}")
    return value


RANK_STARTS = ("auto", "fork-server", "exec")


@dataclass(frozen=True)
class DistributedOptions:
    """Rendezvous and failure-detection settings of one replica's rank group.

    `collective_timeout_s` bounds every collective (the backstop for a rank whose process is
    alive but stuck); `heartbeat_timeout_s` is how long a rank may stay silent before it counts
    as hung (the fast path: a stopped or wedged process); `startup_timeout_s` is how long a
    rank may take to send its first heartbeat, and with the collective timeout it bounds the
    rendezvous (`join_timeout_s`): a short collective timeout must not fail a start-up whose
    ranks import torch slowly on a busy host."""

    master_addr: str = "127.0.0.1"
    master_port: int = 0  # 0: pick a free port
    collective_timeout_s: float = 120.0
    heartbeat_interval_s: float = 0.5
    heartbeat_timeout_s: float = 5.0
    startup_timeout_s: float = 60.0
    shutdown_timeout_s: float = 5.0
    # How ranks 1..N-1 start: "fork-server" (forked from one interpreter that imported torch
    # once, worker/distributed/fork_server.py), "exec" (a fresh interpreter each), or "auto":
    # the fork server for a replica on the CPU, exec on CUDA (the fork server has not run
    # beside CUDA ranks yet; start-up there is the weights and graphs, not the imports).
    rank_start: str = "auto"

    def start_for(self, device_type: str) -> str:
        """The rank start a replica on `device_type` uses ("auto" resolved)."""
        if self.rank_start != "auto":
            return self.rank_start
        return "fork-server" if device_type == "cpu" else "exec"

    def __post_init__(self):
        if self.rank_start not in RANK_STARTS:
            raise ConfigError(f"rank start must be one of {', '.join(RANK_STARTS)}, got {self.rank_start!r}")
        if not 0 <= self.master_port <= 65535:
            raise ConfigError(f"master port must be in [0, 65535], got {self.master_port}")
        if self.heartbeat_timeout_s <= 2 * self.heartbeat_interval_s:
            raise ConfigError(f"heartbeat timeout ({self.heartbeat_timeout_s} s) must exceed twice the "
                              f"heartbeat interval ({self.heartbeat_interval_s} s)")

    @classmethod
    def from_env(cls) -> "DistributedOptions":
        """`INFER_CLUSTER_MASTER_ADDR` / `_MASTER_PORT`, `INFER_CLUSTER_DIST_TIMEOUT_S`,
        `INFER_CLUSTER_HEARTBEAT_TIMEOUT_S`, `INFER_CLUSTER_DIST_STARTUP_TIMEOUT_S`,
        `INFER_CLUSTER_RANK_START`."""
        port = os.environ.get("INFER_CLUSTER_MASTER_PORT", "0") or "0"
        try:
            port_num = int(port)
        except ValueError:
            raise ConfigError(f"INFER_CLUSTER_MASTER_PORT must be an integer, got {port!r}") from None
        d = cls()
        return cls(master_addr=os.environ.get("INFER_CLUSTER_MASTER_ADDR") or d.master_addr,
                   master_port=port_num,
                   collective_timeout_s=_env_float("INFER_CLUSTER_DIST_TIMEOUT_S", d.collective_timeout_s),
                   heartbeat_interval_s=d.heartbeat_interval_s,
                   heartbeat_timeout_s=_env_float("INFER_CLUSTER_HEARTBEAT_TIMEOUT_S", d.heartbeat_timeout_s),
                   startup_timeout_s=_env_float("INFER_CLUSTER_DIST_STARTUP_TIMEOUT_S", d.startup_timeout_s),
                   shutdown_timeout_s=d.shutdown_timeout_s,
                   rank_start=os.environ.get("INFER_CLUSTER_RANK_START") or d.rank_start)

    @property
    def join_timeout_s(self) -> float:
        """How long the ranks may take to meet: the store and the groups' creation."""
        return max(self.collective_timeout_s, self.startup_timeout_s)

    def to_dict(self) -> dict:
        return dict(self.__dict__)
