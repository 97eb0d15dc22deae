"""`SpecGovernor`: whether the next step speculates, from what speculating and not speculating
have cost this engine lately (`speculative_config.adaptive`, on by default).

Why measured and not a fixed rule: whether a verify step pays depends on the model, the device,
the batch size and how much of the output copies the input, and the first GPU measurements
(H200, SmolLM2, bench/RESULTS.md#speculative-decoding) found speculation slower than decoding at
every batch size tried. So the engine measures both modes as it runs and takes the faster.

Owns, per batch-size bucket (1, 2-3, 4-7, 8-15, ...: a power of two apiece), the last `WINDOW`
seconds between step starts for decode steps without proposals (`plain`) and for verify steps
(`verify`), and the tokens the last verify steps gave a row. Times are judged by their median, so
one slow step (a collection, a stall of the host) cannot decide: moving averages let a 30 ms
plain step at batch 64 (against ~5 ms) make every later step there speculate and workload A
run at 0.59-0.71 of speculation off (H200, 075f5ed, a715b21). Tokens are the mean of the last
`TOKENS_WINDOW`, so a rise in acceptance shows within two explorations. A verify step pays when
`tokens_per_row / verify_seconds > 1 / plain_seconds`. A mode the bucket has not measured yet is
tried first; after that, every so many decisions `EXPLORE_STEPS` steps take the other mode (the
first `SETTLE` of them do not count, below) so that its estimate follows the load (acceptance
moves with the text). The interval starts at `EXPLORE_EVERY` and doubles, up to `EXPLORE_MAX`,
each time an exploration leaves the choice as it was; a change of choice resets it. Exploring
is not free: at batch 256 a verify step took 44.6 ms against 11.4 ms for a plain one (H200,
a715b21), so four such steps in every 32 would cost a third of the time.

A step's time counts only when it and the step after it are decode-only (a prompt chunk would
make a step look slow), and not in the first `SETTLE` steps after a change of mode (an async
pipeline refills, a draft catches up). Only steps expected to be decode-only try an unmeasured
mode or explore. With one step settling, the H200 measured plain steps at 1.16 ms where steady
async decoding took 0.86 ms (285607e, 0.6B shape, batch 1), so two settle. The clock is the
caller's: `start_step(now, ...)` at the start of every engine step, so tests can drive it.
Plain Python; never touches tensors or requests.
"""

from __future__ import annotations

from collections import deque
from statistics import median
from typing import Optional

EXPLORE_EVERY = 32  # decisions between two explorations of the mode that looks worse, at first
EXPLORE_MAX = 512   # ... and at most, after explorations that changed nothing
EXPLORE_STEPS = 4   # steps an exploration takes
SETTLE = 2          # steps after a change of mode that are not counted
WINDOW = 16         # step times kept per mode and bucket (judged by their median)
TOKENS_WINDOW = 4   # verify steps' tokens per row kept (their mean: acceptance moves with the text)
MAX_GAP = 1.0       # seconds: a longer gap between steps was idle time, not a step


def bucket(batch: int) -> int:
    """The batch-size bucket: 0 for 1, 1 for 2-3, 2 for 4-7, ..."""
    return max(1, batch).bit_length() - 1


class _Bucket:
    __slots__ = ("plain_s", "verify_s", "tokens_s", "until_explore", "interval", "chose", "explore_left")

    def __init__(self, interval: int):
        self.plain_s: deque = deque(maxlen=WINDOW)   # seconds of plain decode steps
        self.verify_s: deque = deque(maxlen=WINDOW)  # seconds of verify steps
        self.tokens_s: deque = deque(maxlen=TOKENS_WINDOW)  # tokens the last verify steps gave a row
        self.interval = interval             # decisions between explorations
        self.until_explore = interval
        self.chose: Optional[bool] = None    # the choice when the last exploration began
        self.explore_left = 0

    @property
    def plain(self) -> Optional[float]:
        return median(self.plain_s) if self.plain_s else None

    @property
    def verify(self) -> Optional[float]:
        return median(self.verify_s) if self.verify_s else None

    @property
    def tokens(self) -> Optional[float]:
        return sum(self.tokens_s) / len(self.tokens_s) if self.tokens_s else None


class SpecGovernor:
    def __init__(self, explore_every: int = EXPLORE_EVERY, explore_max: int = EXPLORE_MAX):
        self.explore_every, self.explore_max = explore_every, explore_max
        self.buckets: dict[int, _Bucket] = {}
        self._last: Optional[tuple[float, int, bool, bool]] = None  # start, batch, verify, counts
        self._last_mode: Optional[bool] = None
        self._same_mode = 0  # steps in a row in `_last_mode`, this one included
        self._tokens: Optional[float] = None  # tokens per row of the last verify step

    def decide(self, batch: int, measurable: bool = True) -> bool:
        """Whether a step of `batch` rows should speculate. `measurable`: the step is expected
        to be decode-only, so its time will count; only such steps try a mode the bucket has
        not measured or explore (a workload's prefill phase would otherwise run every step as
        an unmeasured verify step)."""
        b = self._bucket(batch)
        plain, verify, tokens = b.plain, b.verify, b.tokens
        if verify is None or tokens is None:
            return measurable
        if plain is None:
            return False
        better = tokens / verify > 1.0 / plain
        if not measurable:
            return better
        b.until_explore -= 1
        if b.until_explore <= 0:
            unchanged = better == b.chose
            b.interval = min(2 * b.interval, self.explore_max) if unchanged else self.explore_every
            b.until_explore, b.chose, b.explore_left = b.interval, better, EXPLORE_STEPS
        if b.explore_left:
            b.explore_left -= 1
            return not better
        return better

    def start_step(self, now: float, batch: int, verify: bool, decode_only: bool) -> None:
        """A step starts at `now` (seconds) with `batch` rows, speculating or not, and whether
        all its rows decode; the previous step's time is the gap since its start. It counts
        only when this step decodes too: a prompt after it may have waited for its request
        (offline, the caller's time between two `generate` calls)."""
        last = self._last
        if last is not None:
            start, last_batch, last_verify, counts = last
            gap = now - start
            if counts and decode_only and 0 < gap < MAX_GAP:
                b = self._bucket(last_batch)
                if last_verify:
                    if self._tokens is not None:
                        b.verify_s.append(gap)
                        b.tokens_s.append(self._tokens)
                else:
                    b.plain_s.append(gap)
        self._same_mode = self._same_mode + 1 if verify == self._last_mode else 1
        counts = decode_only and batch > 0 and self._same_mode > SETTLE
        self._last = (now, batch, verify, counts)
        self._last_mode = verify
        self._tokens = None

    def _bucket(self, batch: int) -> _Bucket:
        key = bucket(batch)
        if key not in self.buckets:
            self.buckets[key] = _Bucket(self.explore_every)
        return self.buckets[key]

    def verified(self, tokens_per_row: float) -> None:
        """The step that speculated gave its rows this many tokens each, on average."""
        self._tokens = tokens_per_row

    def idle(self) -> None:
        """No step ran: the next gap is not a step's time."""
        self._last = None

    def as_dict(self) -> dict:
        """Per bucket (by its smallest batch): the estimates, for stats and tests."""
        return {1 << k: {"plain_s": b.plain, "verify_s": b.verify, "tokens_per_row": b.tokens}
                for k, b in sorted(self.buckets.items())}
