"""The tensor-parallel all-reduce of mid-sized tensors through torch's symmetric memory, next
to NCCL.

Owns: one symmetric buffer per TP group (`torch.distributed._symmetric_memory`, CUDA only) and
the choice, per call, between torch's one-shot and two-shot symmetric-memory all-reduces and the
NCCL group's own `all_reduce`. The one-shot kernel copies the local input into this rank's
buffer, meets the peers at a signal-pad barrier and sums every peer's buffer (read over NVLink)
into the output; two-shot reduces one half per rank and gathers. Only non-multicast ops are used:
NVLink multicast (the `multimem_*` ops) stays off (see the device notes in docs/parallel.md).

`INFER_CLUSTER_TP_ALLREDUCE` picks the path when a replica's groups are built: `auto` (the
default: two-shot for tensors of `TWO_SHOT_MIN_BYTES` up to the buffer, NCCL for the rest),
`nccl` (every all-reduce through NCCL), `one_shot` / `two_shot` (that kernel for every size that
fits the buffer). In CUDA graphs on 2x H100 (bench/allreduce.py, 2026-11-26) NCCL took 8-16 us
up to 1 MiB, one-shot 9-17 us, two-shot 12-18 us; at 2-8 MiB two-shot won (21 vs 30 us at
2 MiB), hence `auto`'s range. Workload A at T=2 on 2x H200 (2026-11-28, ef588ad): Llama-3-8B
shape 1.006-1.010x NCCL, Qwen3-0.6B shape 1.02x. A symmetric-memory kernel waits for its peers
at a barrier that the NCCL abort of a failed replica does not reach, so a killed rank leaves
rank 0's device stuck; the runner's waits give up and its device state is left alone
(worker/device/wait.py, docs/parallel.md "Failure handling"). Tensors larger than the buffer
(long prefill chunks) always go through NCCL. Every rank of the group agrees on one choice (a
MIN over the control group), so a rank that cannot set the buffer up turns the feature off
everywhere instead of leaving the ranks in different collectives.

To tune: run `bench/allreduce.py` on a 2-GPU machine and set `TWO_SHOT_MIN_BYTES` /
`BUFFER_BYTES` from its table. To add an algorithm: a name in `MODES` and a branch in `__call__`.
"""

from __future__ import annotations

import logging
import os
import warnings
from typing import Optional

import torch
import torch.distributed as dist

from infer_cluster.protocol.errors import ConfigError

log = logging.getLogger(__name__)

ENV = "INFER_CLUSTER_TP_ALLREDUCE"
MODES = ("nccl", "auto", "one_shot", "two_shot")
BUFFER_BYTES = 8 << 20  # largest tensor the symmetric path takes; larger ones use NCCL
TWO_SHOT_MIN_BYTES = 2 << 20  # auto: NCCL below this, two-shot from here up (bench/allreduce.py)
DEFAULT_MODE = "auto"


def tp_allreduce_mode() -> str:
    """The mode `INFER_CLUSTER_TP_ALLREDUCE` asks for (`auto` when unset)."""
    mode = os.environ.get(ENV, DEFAULT_MODE).strip().lower() or DEFAULT_MODE
    if mode not in MODES:
        raise ConfigError(f"{ENV}={mode!r} is not one of {', '.join(MODES)}")
    return mode


def _symm_mem():
    try:
        import torch.distributed._symmetric_memory as symm_mem
    except ImportError:
        return None
    return symm_mem


def bound_to_another_group(symm_mem, group) -> bool:
    """Whether torch already holds a symmetric-memory store under `group`'s name that is not this
    group's (an engine built earlier in this process). `destroy_process_group` resets torch's
    group counter, so the next engine's TP group reuses the name, and `enable_symm_mem_for_group`
    (torch 2.11-2.13) keeps the closed group's store for it. The GPU tests, which build engines
    one after another in the pytest process, stopped after the first with this mode on
    (docs/parallel.md). A store this same group set up (a second `create` on it) is fine; when
    torch's private tables cannot tell, the answer is yes (NCCL is always safe)."""
    bound = getattr(symm_mem, "_group_name_to_store", {}).get(group.group_name)
    if bound is None:
        return False
    try:
        from torch.distributed import distributed_c10d as c10d
        return getattr(bound, "underlying_store", None) is not c10d._get_process_group_store(group)
    except Exception:
        return True


def _on_every_rank(flag: bool, control_group, error: str) -> bool:
    """True when `flag` holds on every rank of the control group (a MIN all-reduce); otherwise
    logs why the TP all-reduce stays on NCCL (`error`: this rank's reason, "" if it had none): a
    warning when `INFER_CLUSTER_TP_ALLREDUCE` asked for it, info when only the default did."""
    t = torch.tensor([1 if flag else 0], dtype=torch.int64)
    dist.all_reduce(t, op=dist.ReduceOp.MIN, group=control_group)
    if t.item():
        return True
    level = logging.WARNING if os.environ.get(ENV, "").strip() else logging.INFO
    log.log(level, "symmetric-memory all-reduce unavailable (%s); the TP all-reduce uses NCCL",
            error or "another rank of the group could not set it up")
    return False


class SymmAllReduce:
    """Sum of a CUDA tensor over one TP group through a symmetric buffer. Call `create`."""

    def __init__(self, group, buffer: torch.Tensor, mode: str):
        self.group_name = group.group_name
        self.buffer = buffer  # uint8, BUFFER_BYTES, rendezvoused on the group
        self.mode = mode
        self._copy_out = getattr(torch.ops.symm_mem, "one_shot_all_reduce_copy_out", None)

    @classmethod
    def create(cls, group, device: torch.device, control_group, mode: Optional[str] = None
               ) -> Optional["SymmAllReduce"]:
        """Set the buffer up on every rank of `group` (a collective: every rank calls it), or
        return None everywhere when the mode is `nccl`, the device is not CUDA, or any rank
        could not set it up."""
        mode = mode or tp_allreduce_mode()
        if group is None or device.type != "cuda" or mode == "nccl":
            return None
        buffer, error = None, ""
        symm_mem = _symm_mem()
        if symm_mem is None or not hasattr(torch.ops.symm_mem, "one_shot_all_reduce_out"):
            error = "this torch has no symmetric-memory all-reduce"
        elif bound_to_another_group(symm_mem, group):
            error = (f"an earlier engine of this process set it up for a group named "
                     f"{group.group_name!r}, and torch would reuse that engine's store")
        # Agree before the rendezvous (a collective of its own): a rank that skipped it would
        # leave the others waiting there.
        if not _on_every_rank(not error, control_group, error):
            return None
        try:
            with warnings.catch_warnings():  # enable_symm_mem_for_group is deprecated in newer torch
                warnings.simplefilter("ignore")
                if hasattr(symm_mem, "enable_symm_mem_for_group"):
                    symm_mem.enable_symm_mem_for_group(group.group_name)
            buffer = symm_mem.empty(BUFFER_BYTES, dtype=torch.uint8, device=device)
            symm_mem.rendezvous(buffer, group.group_name)
        except Exception as exc:  # unsupported driver/topology: NCCL still works
            buffer, error = None, f"{type(exc).__name__}: {exc}"
        if not _on_every_rank(buffer is not None, control_group, error):
            return None
        if dist.get_rank(group) == 0:
            log.info("TP all-reduce: %s (%s; symmetric memory from %d KiB to %d KiB)", mode, ENV,
                     (TWO_SHOT_MIN_BYTES if mode == "auto" else 0) >> 10, BUFFER_BYTES >> 10)
        return cls(group, buffer, mode)

    def fits(self, x: torch.Tensor) -> bool:
        """Whether this path takes x (False: the caller uses the group's own all-reduce)."""
        nbytes = x.numel() * x.element_size()
        low = TWO_SHOT_MIN_BYTES if self.mode == "auto" else 0
        return x.is_contiguous() and low <= nbytes <= BUFFER_BYTES

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """The sum over the group, in a new tensor (x is left as it was). x must `fit`."""
        nbytes = x.numel() * x.element_size()
        symm = self.buffer[:nbytes].view(x.dtype).view(x.shape)
        out = torch.empty_like(x)
        if self.mode in ("auto", "two_shot"):
            symm.copy_(x)
            torch.ops.symm_mem.two_shot_all_reduce_out(symm, "sum", self.group_name, out)
        elif self._copy_out is not None:
            self._copy_out(symm, x, "sum", self.group_name, out)
        else:
            symm.copy_(x)
            torch.ops.symm_mem.one_shot_all_reduce_out(symm, "sum", self.group_name, out)
        return out
