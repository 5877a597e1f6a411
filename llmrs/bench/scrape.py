"""The server's Prometheus /metrics as a time series while a bench runs (`--scrape-metrics`).

A thread polls GET /metrics every ~0.5 s, parses it with prometheus_client's text parser, and writes one CSV row
per poll: `t` (time.perf_counter(), the clock of the request timings) and each series below, summed over label
sets (one per model or engine), empty where the server does not export it. The exporter prefixes of llmrs
(`llmrs:`), vLLM (`vllm:`) and SGLang (`sglang:`) are understood; the same quantity under each name:

    running     requests in the running batch        llmrs/vllm num_requests_running, sglang num_running_reqs
    waiting     requests queued                      llmrs/vllm num_requests_waiting, sglang num_queue_reqs
    kv_usage    KV cache in use, 0..1                llmrs/vllm kv_cache_usage_perc (vllm gpu_cache_usage_perc),
                                                     sglang token_usage
    preemptions requests preempted (counter)         num_preemptions
    prefix_queries / prefix_hits  prompt tokens looked up / found in the prefix cache (counters)
    prompt_tokens / generation_tokens  tokens processed (counters)

A server without /metrics (404), or whose reply does not parse, is said once (`why`) and not polled again.
"""

from __future__ import annotations

import csv
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

INTERVAL_S = 0.5
SERIES = ("running", "waiting", "kv_usage", "preemptions", "prefix_queries", "prefix_hits", "prompt_tokens",
          "generation_tokens")
COUNTERS = ("preemptions", "prefix_queries", "prefix_hits", "prompt_tokens", "generation_tokens")
# metric name without its exporter prefix and `_total` -> series
NAMES = {
    "num_requests_running": "running", "num_running_reqs": "running",
    "num_requests_waiting": "waiting", "num_queue_reqs": "waiting",
    "kv_cache_usage_perc": "kv_usage", "gpu_cache_usage_perc": "kv_usage", "token_usage": "kv_usage",
    "num_preemptions": "preemptions",
    "prefix_cache_queries": "prefix_queries", "prefix_cache_hits": "prefix_hits",
    "prompt_tokens": "prompt_tokens", "generation_tokens": "generation_tokens",
}
PREFIXES = ("llmrs:", "vllm:", "sglang:")


def parse(text: str) -> dict[str, float]:
    """Series -> value of one /metrics reply (only the series named above; label sets summed)."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            name = s.name
            prefix = next((p for p in PREFIXES if name.startswith(p)), None)
            if prefix is None:
                continue
            key = NAMES.get(name[len(prefix):].removesuffix("_total"))
            if key is not None and not name.endswith("_created"):
                out[key] = out.get(key, 0.0) + float(s.value)
    return out


@dataclass(slots=True)
class Scraper:
    """Polls `url`/metrics into `path` from start() to stop(); a context manager."""

    url: str
    path: Path
    interval_s: float = INTERVAL_S
    api_key: str | None = None
    why: str = ""  # why nothing (more) is scraped: no /metrics, a reply that does not parse
    polls: int = 0
    _thread: threading.Thread | None = None
    _stop: threading.Event = field(default_factory=threading.Event)
    _wake: threading.Event = field(default_factory=threading.Event)  # poll now (poll_now), not at the next tick

    def start(self) -> Scraper:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "w", newline="") as f:
            csv.writer(f).writerow(("t", *SERIES))
        self._thread = threading.Thread(target=self._loop, name="llmrs-metrics-scraper", daemon=True)
        self._thread.start()
        return self

    def _loop(self) -> None:
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        with httpx.Client(timeout=5.0, trust_env=False) as c, open(self.path, "a", newline="") as f:
            w = csv.writer(f)
            nxt = time.perf_counter()
            while not self._stop.is_set():
                t = time.perf_counter()
                try:
                    r = c.get(f"{self.url.rstrip('/')}/metrics", headers=headers)
                except httpx.HTTPError:
                    r = None  # a poll that failed (the server busy or gone): skipped, the next one may answer
                if r is not None:
                    if r.status_code != 200:
                        self.why = f"the server's /metrics answered {r.status_code}"
                        return
                    try:
                        values = parse(r.text)
                    except ValueError as e:
                        self.why = f"the server's /metrics does not parse as Prometheus text ({e})"
                        return
                    w.writerow((f"{t:.6f}", *("" if values.get(k) is None else values[k] for k in SERIES)))
                    f.flush()
                    self.polls += 1
                nxt += self.interval_s
                if self._wake.wait(max(0.0, nxt - time.perf_counter())):
                    self._wake.clear()
                    nxt = time.perf_counter()

    def poll_now(self, timeout: float = 5.0) -> None:
        """One more poll, now, waited for: a run's counters then end with a poll after its last request."""
        if self._thread is None or not self._thread.is_alive():
            return
        n = self.polls
        self._wake.set()
        deadline = time.perf_counter() + timeout
        while self.polls == n and self._thread.is_alive() and time.perf_counter() < deadline:
            time.sleep(0.01)

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=10.0)
            self._thread = None

    def __enter__(self) -> Scraper:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def summarize(rows: list[dict], t0: float, t1: float) -> dict | None:
    """One run's window [t0, t1]: mean and peak of the gauges polled in it, the counters' increase over the polls
    that bracket it; None without a poll in it."""
    win = [r for r in rows if r["t"] is not None and t0 <= r["t"] <= t1]
    if not win:
        return None
    out: dict = {"polls": len(win)}
    for k in ("running", "waiting", "kv_usage"):
        v = [r[k] for r in win if r.get(k) is not None]
        out[f"mean_{k}"] = sum(v) / len(v) if v else None
        out[f"peak_{k}"] = max(v) if v else None
    # counters: from the last poll at or before t0 to the first at or after t1 (the polls that bracket the run),
    # else the window's own first and last
    before = [r for r in rows if r["t"] is not None and r["t"] <= t0]
    after = [r for r in rows if r["t"] is not None and r["t"] >= t1]
    for k in COUNTERS:
        first = next((r[k] for r in reversed(before) if r.get(k) is not None), None)
        last = next((r[k] for r in after if r.get(k) is not None), None)
        v = [r[k] for r in win if r.get(k) is not None]
        first = first if first is not None else (v[0] if v else None)
        last = last if last is not None else (v[-1] if v else None)
        out[f"{k}_delta"] = last - first if first is not None and last is not None and (before or after or
                                                                                          len(v) >= 2) else None
    return out
