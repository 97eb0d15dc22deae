"""Tensor- and pipeline-parallel replicas: rank 0 (the replica process) drives ranks 1..N-1.

Owns: `DistributedRunner` (rank 0's model runner, picked by `DynamicEngine` when
`tensor_parallel_size x pipeline_parallel_size > 1`), the rank processes' entry point
(`rank_main`), their layout and timeouts (`topology`), the per-step bytes (`step_codec`),
process bookkeeping and failure detection (`launcher`), one rank's shard (`shard`), and the
stage-to-stage messages of pipeline micro-batches (`relay`).
See docs/parallel.md. Names load lazily: a rank process imports this package before torch.
"""

__all__ = ["DistributedRunner", "RankFailedError"]


def __getattr__(name):
    if name == "DistributedRunner":
        from infer_cluster.worker.distributed.runner import DistributedRunner
        return DistributedRunner
    if name == "RankFailedError":
        from infer_cluster.worker.distributed.launcher import RankFailedError
        return RankFailedError
    raise AttributeError(f"module 'worker.distributed' has no attribute {name!r}")
