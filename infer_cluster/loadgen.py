"""Online load generator behind `infer-cluster bench` (and `bench/serving.py`).

Owns: the synthetic workload (token-id prompts with lengths uniform in a range, ignore_eos, so
every run does the same work), driving it through an `InferenceClient` at a fixed concurrency or
a Poisson request rate, and the latency summary (TTFT, TPOT, end-to-end p50 / p99, throughput,
and from the replicas' `RequestMetrics` on each output: queue time and prefill time).
Waiting is event-driven (a queue fed by request completions), never a polling loop.
TTFT and end-to-end time run from just before the submit call (so the client's own prompt
checks and encoding count, as the HTTP client's request building does in `loadgen_http`) to the
first token / the final delta as the client's IO thread reads them off the socket.
Never imports torch.
"""

from __future__ import annotations

import math
import queue
import random
import time
from dataclasses import dataclass, field
from typing import Optional

from infer_cluster.protocol import SamplingParams


def parse_range(text: str) -> tuple[int, int]:
    """"N" or "LO:HI" (a length or id range on the command line) -> (LO, HI); ValueError if
    either part is not an integer."""
    lo, _, hi = text.partition(":")
    return int(lo), int(hi or lo)


@dataclass
class Workload:
    num_requests: int = 200
    input_len: tuple[int, int] = (16, 64)
    output_len: tuple[int, int] = (16, 64)
    token_id_range: tuple[int, int] = (10, 500)  # keep ids inside the model's vocabulary
    seed: int = 0

    def __post_init__(self):
        for name in ("input_len", "output_len", "token_id_range"):
            lo, hi = getattr(self, name)
            if not 0 < lo <= hi:
                raise ValueError(f"{name} must be LO:HI with 0 < LO <= HI, got {lo}:{hi}")
        if self.num_requests < 1:
            raise ValueError(f"num_requests must be >= 1, got {self.num_requests}")

    def build(self) -> list[tuple[list[int], SamplingParams]]:
        """(prompt token ids, sampling params) per request; greedy, fixed output length."""
        rng = random.Random(self.seed)
        out = []
        for _ in range(self.num_requests):
            n_in = rng.randint(*self.input_len)
            n_out = rng.randint(*self.output_len)
            ids = [rng.randint(*self.token_id_range) for _ in range(n_in)]
            out.append((ids, SamplingParams(temperature=0.0, max_tokens=n_out, ignore_eos=True)))
        return out


@dataclass
class RequestTiming:
    ttft: Optional[float]
    e2e: float
    num_output_tokens: int
    finish_reason: Optional[str]
    queue_time: Optional[float] = None    # replica: arrival -> first scheduled
    prefill_time: Optional[float] = None  # replica: first scheduled -> first token

    @property
    def tpot(self) -> Optional[float]:
        if self.ttft is None or self.num_output_tokens < 2:
            return None
        return (self.e2e - self.ttft) / (self.num_output_tokens - 1)


@dataclass
class LoadResult:
    timings: list[RequestTiming] = field(default_factory=list)
    wall_seconds: float = 0.0
    outputs: list = field(default_factory=list)  # RequestOutput per request, in workload order


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    k = (len(ordered) - 1) * q / 100.0
    lo, hi = math.floor(k), math.ceil(k)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


def run_load(client, requests: list, concurrency: Optional[int] = None,
             request_rate: Optional[float] = None, progress: bool = False,
             seed: int = 0) -> LoadResult:
    """Send `requests` ((prompt, params) pairs) through `client`; returns per-request timings.

    `concurrency` caps requests in flight (None: no cap); `request_rate` spaces arrivals as a
    Poisson process (None: all at once)."""
    finished: "queue.SimpleQueue[int]" = queue.SimpleQueue()
    handles: list = [None] * len(requests)
    called_at: list = [0.0] * len(requests)  # just before each submit call: the clock's start
    rng = random.Random(seed)
    bar = None
    if progress:
        from tqdm.auto import tqdm
        bar = tqdm(total=len(requests), desc="requests", unit="req", dynamic_ncols=True)
    started = time.monotonic()
    next_arrival = started
    in_flight = 0
    num_done = 0

    def collect(block_until: Optional[float]) -> None:
        nonlocal in_flight, num_done
        while True:
            try:
                if block_until is None:
                    finished.get_nowait()
                else:
                    finished.get(timeout=max(0.0, block_until - time.monotonic()))
            except queue.Empty:
                return
            in_flight -= 1
            num_done += 1
            if bar is not None:
                bar.update(1)
            block_until = None  # after one arrival, only take what is already there

    for i, (prompt, params) in enumerate(requests):
        while concurrency is not None and in_flight >= concurrency:
            collect(time.monotonic() + 3600)
        if request_rate is not None:
            now = time.monotonic()
            while now < next_arrival:  # sleep by waiting for completions until the arrival time
                collect(next_arrival)
                now = time.monotonic()
            next_arrival += rng.expovariate(request_rate)

        def on_delta(delta, _i=i):
            if delta.finished:
                finished.put(_i)
        called_at[i] = time.monotonic()
        handles[i] = client._submit(prompt, params, None, 0, None, on_delta)
        in_flight += 1
        collect(None)
    while num_done < len(requests):
        collect(time.monotonic() + 3600)
    wall = time.monotonic() - started
    if bar is not None:
        bar.close()
    result = LoadResult(wall_seconds=wall)
    for h, t0 in zip(handles, called_at):
        out = h.output
        ttft = (h.first_token_at - t0) if h.first_token_at is not None else None
        m = out.metrics
        result.timings.append(RequestTiming(ttft=ttft, e2e=h.finished_at - t0,
                                            num_output_tokens=len(out.token_ids),
                                            finish_reason=out.finish_reason,
                                            queue_time=m.queue_time if m is not None else None,
                                            prefill_time=m.prefill_time if m is not None else None))
        result.outputs.append(out)
    return result


def summarize(result: LoadResult) -> dict:
    t = result.timings
    ttft = [x.ttft for x in t if x.ttft is not None]
    tpot = [x.tpot for x in t if x.tpot is not None]
    e2e = [x.e2e for x in t]
    queue = [x.queue_time for x in t if x.queue_time is not None]
    prefill = [x.prefill_time for x in t if x.prefill_time is not None]
    num_tokens = sum(x.num_output_tokens for x in t)
    ok = sum(1 for x in t if x.finish_reason in ("stop", "length"))
    wall = max(result.wall_seconds, 1e-9)
    ms = 1000.0
    return {
        "num_requests": len(t), "num_completed": ok, "num_failed": len(t) - ok,
        "wall_s": round(wall, 3), "output_tokens": num_tokens,
        "requests_per_s": round(len(t) / wall, 3), "output_tokens_per_s": round(num_tokens / wall, 1),
        "ttft_p50_ms": round(percentile(ttft, 50) * ms, 2), "ttft_p99_ms": round(percentile(ttft, 99) * ms, 2),
        "tpot_p50_ms": round(percentile(tpot, 50) * ms, 2), "tpot_p99_ms": round(percentile(tpot, 99) * ms, 2),
        "e2e_p50_ms": round(percentile(e2e, 50) * ms, 2), "e2e_p99_ms": round(percentile(e2e, 99) * ms, 2),
        # Replica side (RequestMetrics on each output): time queued, then time in prefill.
        "queue_p50_ms": round(percentile(queue, 50) * ms, 2), "queue_p99_ms": round(percentile(queue, 99) * ms, 2),
        "prefill_p50_ms": round(percentile(prefill, 50) * ms, 2),
        "prefill_p99_ms": round(percentile(prefill, 99) * ms, 2),
    }


def format_table(rows: dict, title: str = "") -> str:
    width = max(len(k) for k in rows)
    lines = [title] if title else []
    lines += [f"  {k:<{width}}  {v}" for k, v in rows.items()]
    return "\n".join(lines)
