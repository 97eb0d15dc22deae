"""`SpecGovernor`: whether the next step speculates, from what speculating and not speculating
have cost this engine lately (`speculative_config.adaptive`, on by default).

Why measured and not a fixed rule: whether a verify step pays depends on the model, the device,
the batch size and how much of the output copies the input, and the first GPU measurements
(H200, SmolLM2, bench/RESULTS.md#speculative-decoding) found speculation slower than decoding at
every batch size tried. So the engine measures both modes as it runs and takes the faster.

Owns, per batch-size bucket (1, 2-3, 4-7, 8-15, ...: a power of two apiece), the last `WINDOW`
seconds between step starts for decode steps without proposals (`plain`) and for verify steps
(`verify`), and the tokens the last verify steps gave a row. Times are judged by their median
(plain times once `MIN_PLAIN` were taken), so one slow step (a collection, a stall of the host)
cannot decide: moving averages let a 30 ms
plain step at batch 64 (against ~5 ms) make every later step there speculate and workload A
run at 0.59-0.71 of speculation off (H200, 075f5ed, a715b21). Tokens are the mean of the last
`TOKENS_WINDOW`, so a rise in acceptance shows within two explorations. A verify step pays when
`tokens_per_row / verify_seconds > 1 / plain_seconds`; the ratio of the two is `r`.

Trying and exploring cost what the worse mode loses, and a bucket may live only ~100 steps (a
workload's batch falls through every bucket as its requests end): at ba160b5 the H200 ran
workload A at 0.76 of speculation off with a verify step 4x a plain one at batch 64-256, from
trying each bucket and exploring every 32-512 decisions. So:
- An unmeasured bucket whose next-door bucket (one up, else one down) measured verify steps
  that could not pay even if every proposal were accepted (`max_tokens * plain / verify <= 1`, with
  the proposals a row gets at the bucket's smallest batch: `row_limit` shrinks them as it grows)
  starts from that bucket's `r` (its own, or the one it started from) instead of trying: plain
  steps, measured, and verify steps only when an exploration comes. Only the step times decide
  that, never the acceptance: a few verify steps' tokens are noise (SmolLM2 at batch 8-15
  measured 1.0 token a row over four of them at 41ff583, and the bucket below, primed by it,
  decoded plainly for 544 of 608 decisions though its own verify steps gave 4.3).
  Otherwise it tries verify steps first: `TRY_STEPS` of them, and if they gave no measurement
  (their steps never settled), another `TRY_STEPS` after every `EXPLORE_EVERY` plain ones.
- A speculating step where prompt lookup proposed nothing runs as an ordinary step; it keeps
  the mode (the engine passes the decision, `SpecDecoder.speculating`) but its time is not a
  verify step's (it verified nothing).
- Explorations (`EXPLORE_STEPS` steps of the other mode, the first ones settling) come
  every `EXPLORE_STEPS * (g - 1) / EXPLORE_BUDGET` decisions, where g = max(r, 1 / r) is how
  far apart the two modes are: they cost about `EXPLORE_BUDGET` of the time whatever the gap,
  at least every `EXPLORE_EVERY` decisions (modes close together) and at most every
  `EXPLORE_MAX` (far apart).

A step's time counts only when it and the step after it are decode-only (a prompt chunk would
make a step look slow), and not in the first steps after a change of mode: `SETTLE` plain
steps (an async pipeline refills: with one step settling, the H200 measured plain steps at
1.16 ms where steady async decoding took 0.86 ms, 285607e, 0.6B shape, batch 1), and
`SETTLE_VERIFY` verify steps (a draft catches up). The engine drains the steps in flight
before a verify step is proposed, so that drain and the proposals fall in the gap of the plain
step before it, which does not count either: where verify steps dominate, plain steps are
explorations of 4, and every last one of them carried a drain, so the bucket's plain median
read 10.5-11.5 ms against 6.2-6.7 ms steady on the H200 (54cc20a, workload A, 128-255
requests), so `r` read ~1.7 times what it was. At batch 256 each verify step of
a try cost 7 plain ones (H200, 41ff583). Only steps expected to be decode-only try an
unmeasured mode or explore. The clock is the caller's: `start_step(now, ...)` at the start of
every engine step, so tests can drive it. Plain Python; never touches tensors or requests.
"""

from __future__ import annotations

from collections import deque
from statistics import median
from typing import Callable, Optional, Union

EXPLORE_EVERY = 32    # the fewest decisions between two explorations of the mode that looks worse
EXPLORE_MAX = 4096    # ... and the most
EXPLORE_STEPS = 4     # steps an exploration takes
EXPLORE_BUDGET = 0.01  # the share of the time explorations may cost
TRY_STEPS = 8         # verify decisions a bucket tries before it pauses trying (no measurement yet)

SETTLE = 2          # plain steps after a change of mode that are not counted
SETTLE_VERIFY = 1   # ... and verify steps
WINDOW = 16         # step times kept per mode and bucket (judged by their median)
MIN_PLAIN = 3       # plain step times a bucket needs before it judges by them: one slow step is
                    # no estimate (H200, 8867c1f: a batch-1 bucket's only plain step took 1.83 ms
                    # against ~0.82 ms, and 220 verify steps followed on that figure). Plain
                    # steps cost nothing extra to measure; verify steps keep deciding from one
TOKENS_WINDOW = 4   # verify steps' tokens per row kept (their mean: acceptance moves with the text)
MAX_GAP = 1.0       # seconds: a longer gap between steps was idle time, not a step
HYSTERESIS = 0.05   # a bucket changes mode only where r passes 1 by this much (shadows move r
                    # every step; each change into verify steps drains the async pipeline)


def bucket(batch: int) -> int:
    """The batch-size bucket: 0 for 1, 1 for 2-3, 2 for 4-7, ..."""
    return max(1, batch).bit_length() - 1


class _Bucket:
    __slots__ = ("plain_s", "verify_s", "tokens_s", "until_explore", "explore_left", "steps", "prior",
                 "tries", "better")

    def __init__(self):
        self.plain_s: deque = deque(maxlen=WINDOW)   # seconds of plain decode steps
        self.verify_s: deque = deque(maxlen=WINDOW)  # seconds of verify steps
        self.tokens_s: deque = deque(maxlen=TOKENS_WINDOW)  # tokens the last verify steps gave a row
        self.until_explore: Optional[int] = None     # decisions until the next exploration
        self.explore_left = 0
        self.steps = [0, 0]                          # decisions taken: plain, verify
        self.prior: Optional[float] = None           # a neighbour's ratio, taken before measuring
        self.tries = 0                               # decisions of the current try and its pause
        self.better = False                          # the mode chosen last, explorations aside

    @property
    def plain(self) -> Optional[float]:
        """The plain steps' median, once `MIN_PLAIN` were timed."""
        return median(self.plain_s) if len(self.plain_s) >= MIN_PLAIN else None

    @property
    def verify(self) -> Optional[float]:
        return median(self.verify_s) if self.verify_s else None

    @property
    def tokens(self) -> Optional[float]:
        return sum(self.tokens_s) / len(self.tokens_s) if self.tokens_s else None

    @property
    def ratio(self) -> Optional[float]:
        """Tokens a second speculating over tokens a second not (> 1: speculation pays)."""
        plain, verify, tokens = self.plain, self.verify, self.tokens
        if plain is None or verify is None or tokens is None:
            return None
        return tokens * plain / verify


class SpecGovernor:
    def __init__(self, max_tokens: Union[int, Callable[[int], int]] = 5,
                 explore_every: int = EXPLORE_EVERY, explore_max: int = EXPLORE_MAX):
        """`max_tokens`: the most tokens a verify step can give a row (k + 1), or that as a
        function of the batch size (the proposer's `row_limit` + 1: fewer proposals a row
        as the batch grows)."""
        self.max_tokens = max_tokens if callable(max_tokens) else (lambda batch: max_tokens)
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
        key = bucket(batch)
        b = self._bucket(batch)
        r = b.ratio
        if r is None:
            prior = b.prior if b.prior is not None else self._prior(key)
            if prior is not None:
                r = b.prior = prior  # a neighbour could not win: no try, explore when its gap says
            elif b.verify is None or b.tokens is None:
                if not measurable:
                    return self._took(b, False)
                if b.tries < TRY_STEPS:
                    b.tries += 1
                    return self._took(b, True)
                b.tries += 1  # no measurement: plain steps, then another burst of tries
                if b.tries >= TRY_STEPS + EXPLORE_EVERY:
                    b.tries = 0
                return self._took(b, False)
            else:  # verify measured, plain not yet
                return self._took(b, False)
        better = b.better = r > (1.0 - HYSTERESIS if b.better else 1.0 + HYSTERESIS)
        if not measurable:
            return self._took(b, better)
        if b.until_explore is None:
            b.until_explore = self.interval(r)
        b.until_explore -= 1
        if b.until_explore <= 0:
            b.until_explore, b.explore_left = self.interval(r), EXPLORE_STEPS
        if b.explore_left:
            b.explore_left -= 1
            return self._took(b, not better)
        return self._took(b, better)

    def interval(self, r: float) -> int:
        """Decisions between explorations when speculating gives `r` times the tokens a second
        of not: explorations then cost about `EXPLORE_BUDGET` of the time."""
        gap = max(r, 1.0 / r) if r > 0 else float("inf")
        want = EXPLORE_STEPS * (gap - 1.0) / EXPLORE_BUDGET
        return int(min(max(want, self.explore_every), self.explore_max))

    def _could_not_win(self, key: int) -> bool:
        """Whether the verify steps of bucket `key` lose even with every proposal accepted (at
        the most proposals a row of the bucket's smallest batch)."""
        b = self.buckets[key]
        plain, verify = b.plain, b.verify
        return plain is not None and verify is not None and self.max_tokens(1 << key) * plain <= verify

    def _prior(self, key: int) -> Optional[float]:
        """The ratio of a neighbouring bucket (one up, else one down) whose verify steps could
        not win (`_could_not_win`), or the prior such a neighbour took itself, so a falling
        batch carries one measurement down bucket by bucket (only next-door: a far bucket
        says little)."""
        for k in (key + 1, key - 1):
            b = self.buckets.get(k)
            if b is None:
                continue
            if b.prior is not None and b.ratio is None:
                return b.prior
            if b.ratio is not None and self._could_not_win(k):
                return b.ratio
        return None

    @staticmethod
    def _took(b: _Bucket, verify: bool) -> bool:
        b.steps[verify] += 1
        return verify

    def start_step(self, now: float, batch: int, verify: bool, decode_only: bool) -> None:
        """A step starts at `now` (seconds) with `batch` rows, speculating or not, and whether
        all its rows decode; the previous step's time is the gap since its start. It counts
        only when this step decodes too: a prompt after it may have waited for its request
        (offline, the caller's time between two `generate` calls)."""
        last = self._last
        if last is not None:
            start, last_batch, last_verify, counts = last
            gap = now - start
            # a plain step right before a verify step: its gap holds the drain of the steps in
            # flight and this step's proposals, not a plain step's time
            counts = counts and not (verify and not last_verify)
            if counts and decode_only and 0 < gap < MAX_GAP:
                b = self._bucket(last_batch)
                if last_verify:
                    if self._tokens is not None:
                        b.verify_s.append(gap)
                        b.tokens_s.append(self._tokens)
                else:
                    b.plain_s.append(gap)
        self._same_mode = self._same_mode + 1 if verify == self._last_mode else 1
        counts = decode_only and batch > 0 and self._same_mode > (SETTLE_VERIFY if verify else SETTLE)
        self._last = (now, batch, verify, counts)
        self._last_mode = verify
        self._tokens = None

    def _bucket(self, batch: int) -> _Bucket:
        key = bucket(batch)
        if key not in self.buckets:
            self.buckets[key] = _Bucket()
        return self.buckets[key]

    def verified(self, tokens_per_row: float) -> None:
        """The step that speculated gave its rows this many tokens each, on average."""
        self._tokens = tokens_per_row

    def wants_shadow(self, batch: int) -> bool:
        """Whether plain steps at `batch` should measure what verify steps would accept
        (shadow.py): not where verify steps could not pay even at full acceptance, measured
        or carried over from a neighbour."""
        key = bucket(batch)
        b = self.buckets.get(key)
        if b is None:
            return True
        return not (self._could_not_win(key) or (b.prior is not None and b.ratio is None))

    def shadowed(self, batch: int, tokens_per_row: float) -> None:
        """Plain steps at `batch` found that verify steps would have given this many tokens a
        row (shadow.py): the bucket's acceptance follows the text between verify steps."""
        self._bucket(batch).tokens_s.append(tokens_per_row)

    def idle(self) -> None:
        """No step ran: the next gap is not a step's time."""
        self._last = None

    def as_dict(self) -> dict:
        """Per bucket (by its smallest batch): the estimates, for stats and tests."""
        return {1 << k: {"plain_s": median(b.plain_s) if b.plain_s else None, "verify_s": b.verify,
                         "tokens_per_row": b.tokens,
                         "plain_steps": b.steps[0], "verify_steps": b.steps[1]}
                for k, b in sorted(self.buckets.items())}
