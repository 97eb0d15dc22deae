"""Pipeline micro-batches, the engine's plain-Python half: how many sequences the next group
may take. No torch.

With `pipeline_parallel_size` P > 1 (and `pipeline_microbatches` on) the runner has a
`pipeline_depth` of P: `DynamicEngine` keeps up to P steps in flight, each on its own group of
the running batch, so that while rank 0 samples group k the later stages work on k+1. Groups
are disjoint: `Scheduler.schedule(group=n)` skips every request that an uncollected step still
computes (its next input id is not known yet), and takes at most n sequences.

Owns: `group_size`, the n of the next group: the batch that could run (running requests plus
the waiting ones `max_num_seqs` still admits) over the depth P, rounded up. A group that came
out smaller (its token budget went to a long prefill chunk) leaves requests unscheduled; the
next group takes them, so a steady batch settles into P groups of about equal size instead of
one group absorbing the others. Sizes are counted in sequences, not tokens: a group with a long
prefill chunk is slower than its neighbours. To balance by tokens instead, change this function
only; the scheduler's token budget still bounds each step.
"""

from __future__ import annotations


def group_size(num_running: int, num_waiting: int, max_num_seqs: int, depth: int) -> int:
    """Sequences the next micro-batch may take, for a pipeline of `depth` stages (steps in
    flight); requests an uncollected step computes are skipped by the scheduler itself."""
    admissible = max(0, min(num_waiting, max_num_seqs - num_running))
    return max(1, -(-(num_running + admissible) // depth))
