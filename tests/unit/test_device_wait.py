"""worker/device/wait.py on the CPU: the poll that gives up when a rank group failed, the bound,
and the blocking wait that stays for runners whose device always drains. The event here is a
stand-in with CUDA events' two methods (`query`, `synchronize`); on a GPU the waits run in the
killed-rank tests (tests/distributed/test_gpu_symm_failure.py)."""

import sys
import threading
import time

from infer_cluster.worker.device.wait import StuckWatch, keep_until_exit, wait_event


class SlowEvent:
    """Runs after `after_s` seconds; `never` is an event behind a kernel that never ends."""

    def __init__(self, after_s: float = 0.0, never: bool = False):
        self.done_at = float("inf") if never else time.monotonic() + after_s
        self.queries = 0
        self.synchronized = False

    def query(self) -> bool:
        self.queries += 1
        return time.monotonic() >= self.done_at

    def synchronize(self) -> None:
        self.synchronized = True
        while not self.query():
            time.sleep(0.001)


def test_without_a_check_the_wait_blocks():
    event = SlowEvent(after_s=0.05)
    assert wait_event(event) is True
    assert event.synchronized


def test_the_poll_returns_once_the_event_ran():
    event = SlowEvent(after_s=0.05)
    assert wait_event(event, gave_up=lambda: False) is True
    assert not event.synchronized and event.queries > 1


def test_the_poll_gives_up_when_the_group_fails_meanwhile():
    event, failed = SlowEvent(never=True), threading.Event()
    threading.Timer(0.05, failed.set).start()  # the monitor thread records the failure
    started = time.monotonic()
    assert wait_event(event, gave_up=failed.is_set) is False
    assert time.monotonic() - started < 5.0


def test_a_failed_group_is_not_waited_for_at_all():
    event = SlowEvent(never=True)
    assert wait_event(event, gave_up=lambda: True) is False
    assert event.queries == 1


def test_the_bound_ends_a_wait_on_a_stuck_device():
    started = time.monotonic()
    assert wait_event(SlowEvent(never=True), timeout_s=0.1) is False
    assert 0.1 <= time.monotonic() - started < 5.0
    assert wait_event(SlowEvent(after_s=0.01), timeout_s=5.0) is True


def test_kept_state_gets_a_reference_nothing_removes():
    obj = object()
    before = sys.getrefcount(obj)
    keep_until_exit(obj)
    assert sys.getrefcount(obj) == before + 1
    keep_until_exit(None)  # nothing to keep: no error


def test_a_watch_without_a_check_is_always_settled():
    # One GPU, NCCL, or before the shard exists: the waits block and nothing is ever stuck.
    watch = StuckWatch()
    assert watch.gave_up is None and watch.settled() and not watch.stuck
    watch = StuckWatch(may_get_stuck=False, failed=lambda: True)
    assert watch.gave_up is None and watch.settled() and not watch.stuck


def test_a_watch_that_may_get_stuck_hands_out_the_failure_check():
    failed = threading.Event()
    watch = StuckWatch(may_get_stuck=True, failed=failed.is_set, drain_s=0.1)
    assert watch.gave_up == failed.is_set and not watch.stuck
