"""One rank of the step-channel test (`python -m tests.distributed.channel_peer RANK PORT`):
rank 0 sends a fixed list of steps through a real gloo `StepChannel` with a tiny inline
capacity (so large payloads take the second broadcast), then STOP; rank 1 receives them and
checks each against its own pack/unpack of the same step. Prints one line per rank, exits 0
when every step matched."""

import datetime
import sys

import torch
import torch.distributed as dist

from infer_cluster.worker.distributed.channel import StepChannel
from infer_cluster.worker.distributed.step_codec import STOP_HEADER, Op, pack_step, unpack_step
from infer_cluster.worker.sched.output import ScheduledRequest, SchedulerOutput

BLOCK = 4


def steps():
    small = SchedulerOutput([ScheduledRequest("a", [3], 5, [1, 2], True)], 1)
    mixed = SchedulerOutput([ScheduledRequest("a", list(range(10, 19)), 0, [4, 5, 6], False),
                             ScheduledRequest("b", [7], 12, [0, 8, 9, 11], True)], 10)
    wide = SchedulerOutput([ScheduledRequest(str(i), [i], 30 + i, list(range(i, i + 11)), True)
                            for i in range(12)], 12)
    return [small, mixed, wide]


def main(rank: int, port: int) -> None:
    store = dist.TCPStore("127.0.0.1", port, 2, is_master=rank == 0,
                          timeout=datetime.timedelta(seconds=30))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=2,
                            timeout=datetime.timedelta(seconds=30))
    wait = dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=30))
    channel = StepChannel(wait, dist.group.WORLD, torch.device("cpu"), inline_capacity=32)
    matched = inline = 0
    for out in steps():
        header, payload = pack_step(out, BLOCK)
        if rank == 0:
            channel.send(header, payload)
            continue
        got_header, got = channel.recv()
        mine = unpack_step(header, torch.from_numpy(payload))
        theirs = unpack_step(got_header, got)
        assert got_header == header, (got_header, header)
        for name in ("input_ids", "positions", "sample_indices"):
            assert torch.equal(getattr(mine, name), getattr(theirs, name)), name
        for name in ("slot_mapping", "block_tables", "seq_lens", "query_start_loc"):
            assert torch.equal(getattr(mine.meta, name), getattr(theirs.meta, name)), name
        matched += 1
        inline += header.payload_len <= channel.inline_capacity
    if rank == 0:
        channel.send(STOP_HEADER)
    else:
        header, payload = channel.recv()
        assert header.op is Op.STOP and payload is None
    dist.destroy_process_group()
    print(f"rank {rank}: {matched} steps matched, {inline} inline", flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]))
