"""A rank's stderr reaches rank 0's log line by line with its rank prefix, and a silent rank is
asked for its Python stacks (SIGUSR1 -> faulthandler) before it is killed, so a hang names its
place. Real subprocesses; each test ends what it started."""

import io
import subprocess
import sys
import threading
import time

import pytest

from infer_cluster.worker.distributed.launcher import RankProcess, dump_stacks, forward_output

# A stand-in rank: registers faulthandler as rank_main does, says it is ready, then hangs.
HUNG_RANK = """
import faulthandler, signal, sys, time
faulthandler.register(signal.SIGUSR1, file=sys.stderr, all_threads=True)
print("loading shard", file=sys.stderr, flush=True)
def stuck_in_collective():
    time.sleep(60)
stuck_in_collective()
"""


class Sink(io.StringIO):
    def lines(self):
        return self.getvalue().splitlines()


def wait_for(predicate, limit_s=10.0):
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False


@pytest.mark.timeout(30)
def test_hung_rank_dumps_its_stacks_into_the_log_with_its_prefix():
    popen = subprocess.Popen([sys.executable, "-c", HUNG_RANK], stdin=subprocess.PIPE,
                             stderr=subprocess.PIPE)
    sink = Sink()
    thread = threading.Thread(target=forward_output, args=(popen.stderr, "rank 2 | ", sink), daemon=True)
    thread.start()
    try:
        assert wait_for(lambda: "rank 2 | loading shard" in sink.lines())
        dump_stacks(RankProcess(2, popen, heartbeat_fd=-1))
        assert wait_for(lambda: any("stuck_in_collective" in line for line in sink.lines()))
        stack = [line for line in sink.lines() if "stuck_in_collective" in line]
        assert all(line.startswith("rank 2 | ") for line in stack)
        assert popen.poll() is None  # the dump does not end the rank; the monitor kills it after
    finally:
        popen.kill()
        popen.wait(timeout=10)
    thread.join(timeout=5)
    assert not thread.is_alive()  # EOF ends the forwarding thread


def test_forwarded_lines_are_whole_and_prefixed():
    stream = io.BytesIO(b"first\nsecond without newline")
    sink = Sink()
    forward_output(stream, "rank 1 | ", sink)
    assert sink.lines() == ["rank 1 | first", "rank 1 | second without newline"]
    assert stream.closed
