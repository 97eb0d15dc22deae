"""The gateway's own Prometheus metrics (requests as HTTP clients see them).

Owns: one `CollectorRegistry` per app (no global registry: two apps in one process, as in
tests, do not collide) holding request counts by finish reason, errors by code, TTFT / time per
output token / end-to-end histograms, prompt and generated token counters and the in-flight
gauge; plus the cluster collector (`cluster_metrics.py`) registered beside them, so one scrape
of /metrics shows both. Never imports torch.

To add a metric: create it in `GatewayMetrics.__init__` on `self.registry`, named
`infer_cluster_*`, and update it where the event happens.
"""

from __future__ import annotations

from typing import Optional

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1.0,
                    2.5, 5.0, 7.5, 10.0, 30.0, 60.0)
_TPOT_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 1.0, 2.5)


class GatewayMetrics:
    def __init__(self, registry: Optional[CollectorRegistry] = None):
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.requests = Counter("infer_cluster_requests", "Finished generation requests (one per "
                                "choice) by finish reason", ["finish_reason"], registry=r)
        self.errors = Counter("infer_cluster_request_errors", "HTTP requests answered with an "
                              "error, by error code and status", ["code", "status"], registry=r)
        self.ttft = Histogram("infer_cluster_time_to_first_token_seconds", "Time from submit to "
                              "the first generated token", buckets=_LATENCY_BUCKETS, registry=r)
        self.tpot = Histogram("infer_cluster_time_per_output_token_seconds", "Mean time between "
                              "generated tokens after the first, per request",
                              buckets=_TPOT_BUCKETS, registry=r)
        self.e2e = Histogram("infer_cluster_e2e_request_latency_seconds", "Time from submit to "
                             "the final token", buckets=_LATENCY_BUCKETS, registry=r)
        self.prompt_tokens = Counter("infer_cluster_prompt_tokens", "Prompt tokens of finished "
                                     "requests", registry=r)
        self.generation_tokens = Counter("infer_cluster_generation_tokens", "Generated tokens "
                                         "delivered", registry=r)
        self.in_flight = Gauge("infer_cluster_gateway_requests_in_flight", "HTTP generation "
                               "requests being served by this gateway", registry=r)

    def count_error(self, code: str, status: int) -> None:
        self.errors.labels(code=code, status=str(status)).inc()

    def observe_choice(self, handle, finish_reason: str, num_prompt_tokens: int) -> None:
        """Record one finished (or cancelled) choice from its handle's timestamps."""
        self.requests.labels(finish_reason=finish_reason).inc()
        num_tokens = len(handle.output.token_ids)
        self.generation_tokens.inc(num_tokens)
        self.prompt_tokens.inc(num_prompt_tokens)
        first, end = handle.first_token_at, handle.finished_at
        if first is not None:
            self.ttft.observe(first - handle.submitted_at)
            if end is not None and num_tokens > 1:
                self.tpot.observe((end - first) / (num_tokens - 1))
        if end is not None:
            self.e2e.observe(end - handle.submitted_at)
