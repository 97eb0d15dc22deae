"""Test harness for driving the Scheduler without a model (shared by the scheduler tests).

A test "samples" by choosing a token id itself and calling `update(out, {request_id: token})`;
the harness checks the allocator's invariants after every step.
"""



from infer_cluster.protocol import SamplingParams
from infer_cluster.worker.sched.block_allocator import BlockAllocator
from infer_cluster.worker.sched.request import Request
from infer_cluster.worker.sched.scheduler import Scheduler
from infer_cluster.worker.sched.output import SchedulerOutput

EOS = 0


class Harness:
    """A scheduler plus helpers that keep arrival numbers and check invariants."""

    def __init__(self, num_blocks=16, block_size=4, max_num_seqs=8, max_num_batched_tokens=64,
                 max_model_len=256, enable_prefix_caching=True):
        self.alloc = BlockAllocator(num_blocks, block_size, enable_prefix_caching)
        self.sched = Scheduler(self.alloc, max_num_seqs, max_num_batched_tokens, max_model_len)
        self.num_arrivals = 0

    def add(self, rid, prompt, priority=0, eos=(EOS,), **params) -> Request:
        req = Request(rid, list(prompt), SamplingParams(**params), self.num_arrivals, priority, eos)
        self.num_arrivals += 1
        self.sched.add(req)
        return req

    def schedule(self) -> SchedulerOutput:
        out = self.sched.schedule()
        self.alloc.check_invariants()
        return out

    def update(self, out, sampled):
        result = self.sched.update(out, sampled)
        self.alloc.check_invariants()
        return result

    def step(self, token=7):
        """Schedule, sample `token` for every request that needs a sample, update."""
        out = self.schedule()
        sampled = {s.request_id: token for s in out.requests if s.needs_sample}
        return out, self.update(out, sampled)

    def assert_all_free(self):
        assert not self.sched.has_unfinished()
        assert self.sched.requests == {}
        assert self.alloc.num_free_blocks == self.alloc.num_blocks
        assert self.alloc.ref_count == [0] * self.alloc.num_blocks
        self.alloc.check_invariants()


def summary(out: SchedulerOutput):
    """(id, start, number of tokens, block ids, needs_sample) of each scheduled request."""
    return [(s.request_id, s.start_position, len(s.token_ids), s.block_ids, s.needs_sample)
            for s in out.requests]


def prompt_of(n, start=100):
    return list(range(start, start + n))


