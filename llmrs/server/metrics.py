"""GET /metrics: Prometheus text with vLLM's metric names under `llmrs:`.

Two sources, one registry of our own (not the process-global one):
- the engine's counters and gauges (running / waiting requests, KV usage and free blocks, prefix-cache queries and
  hits, prompt / generation tokens), read from `engine.stats()` at scrape time by a collector;
- latencies the server sees on each request's stream (it timestamps every delta): time to first token,
  inter-token latency, end-to-end latency, and successes by finish reason. Buckets are vLLM's.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram, disable_created_metrics, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from llmrs.engine.protocol import EngineClient

TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
               40.0, 80.0)
E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
               480.0, 960.0, 1920.0, 7680.0)
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class EngineCollector(Collector):
    """Engine state, read at scrape time."""

    def __init__(self, engine: EngineClient, model_name: str):
        self.engine, self.model_name = engine, model_name

    def collect(self) -> Iterator[Metric]:
        s = self.engine.stats()
        labels = [self.model_name]

        def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
            g = GaugeMetricFamily(name, doc, labels=["model_name"])
            g.add_metric(labels, value)
            return g

        def counter(name: str, doc: str, value: float) -> CounterMetricFamily:
            c = CounterMetricFamily(name, doc, labels=["model_name"])
            c.add_metric(labels, value)
            return c

        yield gauge("llmrs:num_requests_running", "Requests in the running batch.", s.num_running)
        yield gauge("llmrs:num_requests_waiting", "Requests waiting to be scheduled.", s.num_waiting)
        yield gauge("llmrs:kv_cache_usage_perc", "KV-cache usage: 1 means every block is in use.", s.kv_usage)
        yield gauge("llmrs:kv_cache_free_blocks", "KV-cache blocks free (including cached, evictable ones).",
                    s.num_free_blocks)
        yield gauge("llmrs:kv_cache_num_blocks", "KV-cache blocks in all.", s.num_blocks)
        yield counter("llmrs:prefix_cache_queries", "Prompt tokens looked up in the prefix cache.", s.prefix_queries)
        yield counter("llmrs:prefix_cache_hits", "Prompt tokens found in the prefix cache.", s.prefix_hits)
        yield counter("llmrs:prompt_tokens", "Prefill tokens processed.", s.prompt_tokens_total)
        yield counter("llmrs:generation_tokens", "Generation tokens processed.", s.generation_tokens_total)
        yield counter("llmrs:num_preemptions", "Requests preempted (blocks freed, recomputed later).",
                      s.num_preemptions)
        yield counter("llmrs:cuda_graph_captures", "CUDA graphs captured (decode and prefill buckets).",
                      s.graph_captures)
        yield counter("llmrs:cuda_graph_capture_failures", "Step shapes whose CUDA graph capture failed: they "
                      "run eagerly, slower (the server's log says why).", s.graph_capture_failures)


class ServerMetrics:
    def __init__(self, engine: EngineClient, model_name: str):
        disable_created_metrics()  # no `_created` series (as vLLM): the process serves one app
        self.model_name = model_name
        self.registry = CollectorRegistry(auto_describe=True)
        labels = ["model_name"]
        self.ttft = Histogram("llmrs:time_to_first_token_seconds", "Time to first token, from the request's "
                              "arrival at the server.", labels, registry=self.registry, buckets=TTFT_BUCKETS)
        self.itl = Histogram("llmrs:inter_token_latency_seconds", "Time between successive deltas of one choice.",
                             labels, registry=self.registry, buckets=ITL_BUCKETS)
        self.e2e = Histogram("llmrs:e2e_request_latency_seconds", "Arrival to last token.", labels,
                             registry=self.registry, buckets=E2E_BUCKETS)
        self.success = Counter("llmrs:request_success", "Finished choices, by finish reason.",
                               labels + ["finished_reason"], registry=self.registry)
        self.registry.register(EngineCollector(engine, model_name))
        self._ttft = self.ttft.labels(model_name)
        self._itl = self.itl.labels(model_name)
        self._e2e = self.e2e.labels(model_name)

    def tracker(self, arrival: float) -> "RequestTracker":
        return RequestTracker(self, arrival)

    def render(self) -> bytes:
        return generate_latest(self.registry)


class RequestTracker:
    """Timestamps the deltas of one engine request (one prompt, n choices)."""

    __slots__ = ("m", "arrival", "first", "last")

    def __init__(self, m: ServerMetrics, arrival: float):
        self.m, self.arrival, self.first = m, arrival, None
        self.last: dict[int, float] = {}

    def on_output(self, index: int, has_tokens: bool, finish_reason: str | None) -> None:
        now = time.perf_counter()
        if has_tokens:
            if self.first is None:
                self.first = now
                self.m._ttft.observe(now - self.arrival)
            prev = self.last.get(index)
            if prev is not None:
                self.m._itl.observe(now - prev)
            self.last[index] = now
        if finish_reason is not None:
            self.m.success.labels(self.m.model_name, finish_reason).inc()

    def on_finish(self) -> None:
        self.m._e2e.observe(time.perf_counter() - self.arrival)
