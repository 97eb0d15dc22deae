"""The HTTP side of `infer-cluster bench --http URL`: the same workload through the gateway.

Owns: driving a workload (`loadgen.Workload.build()` pairs) through `POST /v1/completions` with
SSE streaming (token-id prompts, greedy, `ignore_eos`, `stream_options.include_usage` for the
exact token count) at a fixed concurrency or Poisson rate, with per-request TTFT and end-to-end
time measured by the HTTP client, and the comparison table of HTTP against ZMQ. It returns
`loadgen.LoadResult`, so `loadgen.summarize` applies unchanged. Never imports torch.

The measurement is meant to show what the *gateway* adds, so the client must add as little of
its own as it can and be timed like the ZMQ side (`loadgen.run_load`):
- the standard library's `http.client`, one blocking worker thread per request in flight (as
  the ZMQ client's replies arrive on a thread). httpx, used before, spent about 1.5 ms more per
  streamed request on a 2-core machine (h11 and anyio in pure Python) and aiohttp about 0.3 ms
  more than `http.client`, all of which the bench reported as gateway cost (docs/gateway.md,
  "What the gateway costs").
- persistent connections (HTTP/1.1 keep-alive) shared by all rounds of one `HttpLoad`, as the
  ZMQ client keeps its socket: a connection is opened, or reopened when the server closed it
  while idle, before a request's clock starts.
- TTFT runs from just before the request is written to the first read that holds an event with
  a choice (the first token): the same points as the ZMQ side's clock (before `submit`, to the
  first token read off the socket).

To extend: new request fields go into `_body`; anything parsed from the stream goes into
`HttpLoad._one`.
"""

from __future__ import annotations

import http.client
import json
import random
import select
import threading
import time
import urllib.parse
from concurrent.futures import ThreadPoolExecutor
from typing import Optional

from .loadgen import LoadResult, RequestTiming

_JSON = {"Content-Type": "application/json"}


def _body(model: Optional[str], prompt, params) -> dict:
    body = {"prompt": prompt, "max_tokens": params.max_tokens, "temperature": params.temperature,
            "ignore_eos": params.ignore_eos, "stream": True,
            "stream_options": {"include_usage": True}}
    if model:
        body["model"] = model
    return body


class HttpLoad:
    """The HTTP client for every round against one gateway: a pool of keep-alive connections.
    Use as a context manager; `run(...)` drives one round and returns its `LoadResult`."""

    def __init__(self, url: str, model: Optional[str] = None, api_key: Optional[str] = None):
        parts = urllib.parse.urlsplit(url.rstrip("/"))
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"expected an http://HOST:PORT URL for the gateway, got {url!r}")
        self._host, self._port = parts.hostname, parts.port or 80
        self._base = parts.path
        self.path = f"{parts.path}/v1/completions"
        self.model = model
        self.headers = dict(_JSON, **({"Authorization": f"Bearer {api_key}"} if api_key else {}))
        self._idle: list[http.client.HTTPConnection] = []
        self._lock = threading.Lock()

    def __enter__(self) -> "HttpLoad":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()

    def _take(self) -> http.client.HTTPConnection:
        """An open connection: an idle one (reopened if the server closed it meanwhile: an idle
        keep-alive socket that reads as ready holds EOF), or a new one."""
        with self._lock:
            conn = self._idle.pop() if self._idle else None
        if conn is None:
            conn = http.client.HTTPConnection(self._host, self._port, timeout=600)
        elif conn.sock is not None and select.select([conn.sock], [], [], 0)[0]:
            conn.close()
        if conn.sock is None:
            conn.connect()
        return conn

    def check_access(self) -> Optional[int]:
        """Raises PermissionError when the gateway refuses this client's API key (or lack of
        one); any other failure raises as `http.client` does. Returns the served model's
        `max_model_len` (None when the gateway does not say)."""
        conn = self._take()
        conn.request("GET", f"{self._base}/v1/models", headers=self.headers)
        resp = conn.getresponse()
        detail = resp.read()
        self._give(conn, resp)
        if resp.status == 401:
            try:
                detail = json.loads(detail)["error"]["message"]
            except (ValueError, KeyError, TypeError):
                detail = detail.decode(errors="replace")
            raise PermissionError(detail)
        try:
            lens = [m["max_model_len"] for m in json.loads(detail)["data"] if m.get("max_model_len")]
        except (ValueError, KeyError, TypeError):
            return None
        return min(lens) if lens else None

    def _one(self, body: dict) -> RequestTiming:
        conn = self._take()
        started = time.monotonic()
        first = None
        num_tokens = 0
        finish_reason = None
        conn.request("POST", self.path, body=json.dumps(body).encode(), headers=self.headers)
        resp = conn.getresponse()
        if resp.status != 200:
            resp.read()
            self._give(conn, resp)
            return RequestTiming(None, time.monotonic() - started, 0, "error")
        buffer = b""
        while True:  # events end with a blank line (SSE)
            data = resp.read1(65536)
            if not data:
                break
            now = time.monotonic()
            buffer += data
            *events, buffer = buffer.split(b"\n\n")
            for event in events:
                if not event.startswith(b"data: "):
                    continue
                payload = event[6:]
                if payload == b"[DONE]":
                    break
                chunk = json.loads(payload)
                if "error" in chunk:
                    finish_reason = "error"
                    continue
                if chunk.get("choices"):
                    if first is None:
                        first = now
                    finish_reason = chunk["choices"][0].get("finish_reason") or finish_reason
                if chunk.get("usage"):
                    num_tokens = chunk["usage"]["completion_tokens"]
        end = time.monotonic()
        self._give(conn, resp)
        return RequestTiming(first - started if first is not None else None, end - started,
                             num_tokens, finish_reason)

    def _give(self, conn: http.client.HTTPConnection, resp) -> None:
        if resp.will_close:
            conn.close()
            return
        with self._lock:
            self._idle.append(conn)

    def run(self, requests: list, concurrency: Optional[int] = None,
            request_rate: Optional[float] = None, seed: int = 0) -> LoadResult:
        """Send `requests` ((prompt, SamplingParams) pairs) at `concurrency` in flight (None: no
        cap), spaced as Poisson arrivals at `request_rate` per second (None: all at once)."""
        rng = random.Random(seed)
        bodies = [_body(self.model, prompt, params) for prompt, params in requests]
        workers = min(concurrency or len(bodies), len(bodies)) or 1
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="bench-http") as pool:
            started = time.monotonic()
            next_arrival = started
            futures = []
            for body in bodies:
                if request_rate is not None:
                    delay = next_arrival - time.monotonic()
                    if delay > 0:
                        time.sleep(delay)
                    next_arrival += rng.expovariate(request_rate)
                futures.append(pool.submit(self._one, body))
            timings = [f.result() for f in futures]
            wall = time.monotonic() - started
        return LoadResult(timings=timings, wall_seconds=wall)


def run_http_load(url: str, requests: list, concurrency: Optional[int] = None,
                  request_rate: Optional[float] = None, seed: int = 0,
                  model: Optional[str] = None) -> LoadResult:
    """One round with a client of its own (see `HttpLoad` to keep connections across rounds)."""
    with HttpLoad(url, model) as load:
        return load.run(requests, concurrency, request_rate, seed)


_COMPARED = [("ttft_p50_ms", "TTFT p50 (ms)"), ("ttft_p99_ms", "TTFT p99 (ms)"),
             ("tpot_p50_ms", "TPOT p50 (ms)"), ("tpot_p99_ms", "TPOT p99 (ms)"),
             ("e2e_p50_ms", "e2e p50 (ms)"), ("e2e_p99_ms", "e2e p99 (ms)"),
             ("output_tokens_per_s", "output tokens/s")]


def compare(zmq: dict, http: dict) -> dict:
    """HTTP minus ZMQ for each latency, and the throughput change in percent."""
    out = {}
    for key, label in _COMPARED:
        a, b = zmq.get(key), http.get(key)
        if a is None or b is None:
            continue
        if key == "output_tokens_per_s":
            out["throughput_change_pct"] = round(100.0 * (b - a) / a, 2) if a else float("nan")
        else:
            out[f"{key}_added"] = round(b - a, 3)
    return out


def format_comparison(zmq: dict, http: dict) -> str:
    lines = [f"  {'':<18}{'ZMQ':>12}{'HTTP':>12}{'HTTP - ZMQ':>14}"]
    for key, label in _COMPARED:
        a, b = zmq.get(key), http.get(key)
        diff = (f"{100.0 * (b - a) / a:+.2f}%" if key == "output_tokens_per_s" and a
                else f"{b - a:+.3f}")
        lines.append(f"  {label:<18}{a:>12}{b:>12}{diff:>14}")
    return "\n".join(lines)


def _gateway_latency_sums(http_url: str) -> dict:
    """The gateway's own TTFT / e2e histogram sums and counts (measured at its ZMQ client)."""
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(f"{http_url.rstrip('/')}/metrics", timeout=10).text
    out = {}
    for family in text_string_to_metric_families(text):
        if family.name in ("infer_cluster_time_to_first_token_seconds",
                           "infer_cluster_e2e_request_latency_seconds"):
            for sample in family.samples:
                if sample.name.endswith(("_sum", "_count")):
                    out[sample.name] = sample.value
    return out


def paired_http_overhead(before: dict, after: dict, http: LoadResult) -> dict:
    """Mean TTFT / e2e as the HTTP client saw them minus the same requests' means as the
    gateway's ZMQ client saw them: what the HTTP layer adds, free of run-to-run noise."""
    def mean_at_gateway(name):
        n = after.get(f"{name}_count", 0) - before.get(f"{name}_count", 0)
        return (after.get(f"{name}_sum", 0) - before.get(f"{name}_sum", 0)) / n if n else float("nan")

    ttfts = [t.ttft for t in http.timings if t.ttft is not None]
    e2es = [t.e2e for t in http.timings]
    client_ttft = sum(ttfts) / len(ttfts) if ttfts else float("nan")
    client_e2e = sum(e2es) / len(e2es) if e2es else float("nan")
    gw_ttft = mean_at_gateway("infer_cluster_time_to_first_token_seconds")
    gw_e2e = mean_at_gateway("infer_cluster_e2e_request_latency_seconds")
    ms = 1000.0
    return {"ttft_mean_ms_http_client": round(client_ttft * ms, 3),
            "ttft_mean_ms_inside_gateway": round(gw_ttft * ms, 3),
            "ttft_mean_ms_added_by_http": round((client_ttft - gw_ttft) * ms, 3),
            "e2e_mean_ms_http_client": round(client_e2e * ms, 3),
            "e2e_mean_ms_inside_gateway": round(gw_e2e * ms, 3),
            "e2e_mean_ms_added_by_http": round((client_e2e - gw_e2e) * ms, 3)}


def _check_fits(requests: list, max_model_len: Optional[int]) -> None:
    """The gateway refuses a prompt plus max_tokens past the context (a 400, as the OpenAI API
    does), while the ZMQ path cuts such a request short: the two sides would not run the same
    workload, so the bench stops before it starts."""
    from .cli_options import CliError

    if not max_model_len:
        return
    longest = max((len(p) + params.max_tokens for p, params in requests if isinstance(p, list)),
                  default=0)
    if longest > max_model_len:
        raise CliError(f"error: the workload's longest request is {longest} tokens (prompt + "
                       f"output), past the cluster's max_model_len of {max_model_len}; the gateway "
                       "refuses such requests, so lower --input-len / --output-len")


def bench_both(address: str, http_url: str, work, concurrency: Optional[int],
               request_rate: Optional[float], seed: int, repeat: int, auth=None,
               api_key: Optional[str] = None) -> dict:
    """`infer-cluster bench --http`: a short warm-up through both paths, then `repeat` rounds of
    ZMQ then HTTP on the same workload (alternating, so drift in the machine's load hits both);
    prints both summaries and the difference; returns them as one dict."""
    import click

    from infer_cluster.client import InferenceClient

    from .cli_options import CliError
    from .loadgen import format_table, run_load, summarize

    if repeat < 1:
        raise CliError("error: --repeat must be >= 1")
    requests = work.build()
    warmup = requests[: min(8, len(requests))]
    pooled = {"zmq": LoadResult(), "http": LoadResult()}
    try:
        http_load = HttpLoad(http_url, api_key=api_key)
    except ValueError as exc:
        raise CliError(f"error: --http: {exc}") from None
    with InferenceClient(address, name="bench", auth=auth) as client, http_load:
        try:
            client.status(timeout=5.0)
        except TimeoutError as exc:
            raise CliError(f"error: {exc}") from None
        try:
            max_model_len = http_load.check_access()
        except PermissionError as exc:
            raise CliError(f"error: the gateway at {http_url} refused the bench: {exc} "
                           "(pass --api-key or set INFER_CLUSTER_API_KEY)") from None
        except Exception as exc:
            raise CliError(f"error: the gateway at {http_url} does not answer: {exc}") from None
        _check_fits(requests, max_model_len)
        try:
            http_load.run(warmup[:1], seed=seed)
        except Exception as exc:
            raise CliError(f"error: the gateway at {http_url} does not answer: {exc}") from None
        run_load(client, warmup, concurrency=concurrency, seed=seed)
        http_load.run(warmup, concurrency=concurrency, seed=seed)
        sums = {"before": {}, "after": {}}
        for round_ in range(repeat):
            for name in ("zmq", "http"):
                if name == "zmq":
                    result = run_load(client, requests, concurrency=concurrency,
                                      request_rate=request_rate, seed=seed)
                else:
                    before = _gateway_latency_sums(http_url)
                    result = http_load.run(requests, concurrency=concurrency,
                                           request_rate=request_rate, seed=seed)
                    after = _gateway_latency_sums(http_url)
                    for key in after:  # accumulate this round's histogram deltas
                        sums["after"][key] = sums["after"].get(key, 0) + after[key] - before.get(key, 0)
                pooled[name].timings += result.timings
                pooled[name].wall_seconds += result.wall_seconds
                click.echo(f"round {round_ + 1}/{repeat} {name}: {result.wall_seconds:.2f} s", err=True)
    zmq, http = summarize(pooled["zmq"]), summarize(pooled["http"])
    paired = paired_http_overhead(sums["before"], sums["after"], pooled["http"])
    settings = {"address": address, "http": http_url, "concurrency": concurrency,
                "request_rate": request_rate, "repeat": repeat}
    click.echo(format_table(zmq, title="infer-cluster bench: ZMQ (InferenceClient)"))
    click.echo(format_table(http, title="infer-cluster bench: HTTP (gateway /v1/completions, SSE)"))
    click.echo("what the gateway adds:")
    click.echo(format_comparison(zmq, http))
    click.echo("the HTTP layer on the same requests (HTTP client vs the gateway's own ZMQ client):")
    click.echo(format_table(paired))
    return {"settings": settings, "zmq": zmq, "http": http, "http_minus_zmq": compare(zmq, http),
            "http_layer_paired": paired}
