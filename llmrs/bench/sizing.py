"""How many requests a run sends when `-n` is not given: as many as the server finishes in about `--duration` s.

Before each sweep point a probe sends that point's workload shape at the point's concurrency cap and request rate
(prompts of a seed of their own, so the run's prompts are not in the server's prefix cache) for PROBE_S seconds,
then stops sending and cuts off what is in flight (run_load's interrupt path). Its results are discarded: it doubles
as the point's warm-up. What it measured is the server's processing rate in tokens per second: the prompt tokens of
every request whose first token came back plus every output token streamed (those of requests cut off included).
A request of the workload costs its prompt plus the output it is expected to generate (max_tokens, scaled by the
share of max_tokens the probe's completed requests used: a server may stop at EOS), so

    n = rate x target / cost, at least 1, at most max_prompts(cap), and at a finite request rate at most
        request_rate x target (the arrivals alone take that long).

A probe in which no token came back within PROBE_S keeps waiting for the first one, up to the target time; a
server that sends none even then gets one request.

NOTE: tokens per second is a rough model of a server's work (a prompt token costs less than an output token, most
on a GPU at small batches); the probe runs the run's own mix at the run's own concurrency, so the run lands near the
target, not on it. A probe shorter than one request's life sees mostly prefill.

The server saturated when it cannot finish `cap` requests in the target time: the run then sends fewer requests
than the cap, so at most that many are ever in flight, and the bench says so after the run's table.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass

from llmrs.bench.metrics import output_tokens
from llmrs.bench.records import RequestResult, RequestSpec

PROBE_S = 10.0  # how long a probe sends (the target time where that is shorter)
DEFAULT_DURATION_S = 60.0  # --duration: the time a sized run aims at
MAX_PROMPTS = 1000  # a sized run sends at most max(MAX_PROMPTS, 4 x its cap) requests
PROBE_MIN_PROMPTS = 64  # a probe has at least this many requests ready
PROBE_STOPPED = -1  # the value the probe's `interrupted` callback gives run_load when the probe is over (no signal)


def max_prompts(cap: int | None) -> int:
    """The most requests a sized run sends: enough for four waves of its cap, and at least MAX_PROMPTS."""
    return max(MAX_PROMPTS, 4 * cap) if cap else MAX_PROMPTS


def probe_seconds(target_s: float) -> float:
    return min(PROBE_S, target_s)


def probe_count(cap: int | None, request_rate: float, probe_s: float) -> int:
    """Requests a probe has ready: twice the cap (ProbeStop ends the probe once all are sent, where the
    concurrency would start to fall), or what a finite rate sends in the probe with a margin."""
    k = max(PROBE_MIN_PROMPTS, 2 * cap if cap else 0)
    if math.isfinite(request_rate):
        k = max(k, math.ceil(request_rate * probe_s * 1.5))
    return min(k, max_prompts(cap))


class ProbeStop:
    """run_load's `on_progress` (`progress`) and `interrupted` (the instance) for one probe.

    The probe ends (PROBE_STOPPED) after `probe_s` seconds once a token came back or a request ended, else after
    `wait_s`; earlier once every request was sent and `cap` of them ended (what follows would run at a falling
    concurrency, unlike the run); and at once on an interrupt (`pending()`: its signal)."""

    def __init__(self, total: int, cap: int | None, probe_s: float, wait_s: float,
                 pending: Callable[[], int | None], show: Callable[[int, int, int, int, float], None] | None = None):
        self.total, self.cap, self.probe_s, self.wait_s = total, cap, probe_s, max(wait_s, probe_s)
        self.pending, self.show = pending, show
        self.last: tuple[int, int, int, int, float] = (0, 0, 0, 0, 0.0)

    def progress(self, done: int, failed: int, inflight: int, tokens: int, elapsed: float) -> None:
        self.last = (done, failed, inflight, tokens, elapsed)
        if self.show is not None:
            self.show(done, failed, inflight, tokens, elapsed)

    def __call__(self) -> int | None:
        if sig := self.pending():
            return sig
        done, failed, inflight, tokens, elapsed = self.last
        ended = done + failed
        if elapsed >= self.wait_s or (elapsed >= self.probe_s and (tokens or ended)):
            return PROBE_STOPPED
        if self.cap and ended >= self.cap and ended + inflight >= self.total:
            return PROBE_STOPPED
        return None


@dataclass(slots=True)
class ProbeMeasure:
    """What one probe saw: `tokens` (prompt tokens of the requests whose first token came back, plus every output
    token streamed) over `seconds` (from the start to the last thing that happened: a request ended or was cut off)."""

    seconds: float
    tokens: int
    completed: int
    failed: int
    output_share: float | None  # output tokens / max_tokens of the completed requests; None: none completed


def measure(results: list[RequestResult], t0: float) -> ProbeMeasure:
    sent = [r for r in results if r.interrupted != "not sent"]
    end = max((r.end for r in sent), default=t0)
    tokens = sum((r.prompt_tokens if r.prompt_tokens is not None else r.input_len) + output_tokens(r)
                 for r in sent if r.chunks)
    ok = [r for r in results if r.success]
    asked = sum(r.max_tokens for r in ok)
    share = min(1.0, sum(output_tokens(r) for r in ok) / asked) if asked else None
    failed = sum(1 for r in results if not r.success and not r.interrupted)
    return ProbeMeasure(max(end - t0, 0.0), tokens, len(ok), failed, share)


@dataclass(slots=True)
class Sizing:
    """How a run's request count was chosen (saved as the run's `sizing` in the results JSON)."""

    target_s: float
    probe_s: float  # seconds the probe measured
    probe_tokens: int
    tokens_per_s: float  # prompt + output tokens the server processed a second during the probe
    request_tokens: float  # expected tokens of one request: mean prompt + expected output
    num_prompts: int  # the requests the run sends
    saturated: bool  # the server cannot finish `concurrency` requests in about target_s
    concurrency: int | None
    request_rate: float
    cap_s: float | None  # seconds `concurrency` requests take at tokens_per_s (None: no cap; inf: no token came back)
    probe_failed: int = 0
    drain_s: float | None = None  # seconds the server took to let go of the probe's requests (None: not watched)

    def to_dict(self) -> dict:
        d = asdict(self)
        for k in ("request_rate", "cap_s"):
            if isinstance(d[k], float) and math.isinf(d[k]):
                d[k] = "inf"
        d["tokens_per_s"] = round(self.tokens_per_s, 1)
        d["probe_s"] = round(self.probe_s, 2)
        d["request_tokens"] = round(self.request_tokens, 1)
        if isinstance(d["cap_s"], float):
            d["cap_s"] = round(d["cap_s"], 1)
        if d["drain_s"] is not None:
            d["drain_s"] = round(d["drain_s"], 2)
        return d

    def setting(self) -> str:
        c = f"-c {self.concurrency}" if self.concurrency else "no concurrency cap"
        return c + (f", --request-rate {self.request_rate:g}" if math.isfinite(self.request_rate) else "")

    def line(self) -> str:
        """The line printed before the run."""
        head = f"sized for about {self.target_s:g} s: "
        if self.probe_tokens:
            seen = (f"a {self.probe_s:.1f} s probe at {self.setting()} ran {self.tokens_per_s:,.0f} tokens/s "
                    "(prompt + output)")
        elif self.probe_failed:
            seen = f"every request of a {self.probe_s:.1f} s probe at {self.setting()} failed"
        else:
            seen = f"in a {self.probe_s:.1f} s probe at {self.setting()} no token came back"
        n = self.num_prompts
        return head + seen + f"; sending {n:,} request{'s' if n != 1 else ''} (-n N sends exactly N)"

    def note(self) -> str | None:
        """The note after a run whose server saturated, else None."""
        if not self.saturated or not self.concurrency:
            return None
        c, n = self.concurrency, self.num_prompts
        at = (f"at its measured {self.tokens_per_s:,.0f} tokens/s, {c} requests would take ~{_span(self.cap_s)}"
              if self.probe_tokens else f"it returned no token in {self.probe_s:.0f} s")
        return (f"note: the server saturated at -c {c}: {at}, so {n:,} were sent and at most {n:,} were in flight; "
                f"-n {c} (or more) sends them all anyway")


def _span(s: float | None) -> str:
    if s is None or not math.isfinite(s):
        return "forever"
    if s < 120:
        return f"{s:.0f} s"
    if s < 7200:
        return f"{s / 60:.0f} min"
    return f"{s / 3600:.1f} h"


def size_run(m: ProbeMeasure, specs: list[RequestSpec], target_s: float, cap: int | None,
             request_rate: float) -> Sizing:
    """The run's request count from what its probe measured; `specs`: the probe's requests (the workload's shape)."""
    mean_in = sum(s.input_len for s in specs) / len(specs) if specs else 0.0
    mean_out = sum(s.output_len for s in specs) / len(specs) if specs else 0.0
    share = m.output_share if m.output_share is not None else 1.0
    cost = max(1.0, mean_in + max(1.0, mean_out * share))
    rate = m.tokens / m.seconds if m.seconds > 0 else 0.0
    fit = math.floor(rate * target_s / cost)
    n = max(1, min(fit, max_prompts(cap)))
    if math.isfinite(request_rate):
        n = min(n, max(1, math.floor(request_rate * target_s)))
    # a probe whose every request failed measured no rate: one request shows the failure, with no saturation claim
    saturated = bool(cap) and fit < cap and not (m.tokens == 0 and m.failed)
    cap_s = (cap * cost / rate if rate > 0 else math.inf) if cap else None
    return Sizing(target_s, m.seconds, m.tokens, rate, cost, n, saturated, cap, request_rate, cap_s, m.failed)


DRAIN_POLL_S = 0.2
DRAIN_MAX_S = 120.0


def wait_idle(base_url: str, api_key: str | None = None, max_s: float = DRAIN_MAX_S,
              on_wait: Callable[[float, float, float], None] | None = None,
              stop: Callable[[], bool] | None = None) -> float | None:
    """Waits until the server's /metrics shows no request running or waiting (the probe's cut-off requests gone:
    a server aborts them at its next step, which on a saturated CPU server takes seconds) and returns the seconds
    waited; None where the server has no /metrics with those gauges (nothing to watch: the run starts at once).
    `on_wait(seconds, running, waiting)` is called on each poll that finds the server busy. Gives up after max_s,
    or when `stop()` is true (an interrupt)."""
    import time

    import httpx

    from llmrs.bench.scrape import parse

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    t0 = time.monotonic()
    with httpx.Client(timeout=10.0, trust_env=False) as c:
        while True:
            try:
                r = c.get(f"{base_url.rstrip('/')}/metrics", headers=headers)
                values = parse(r.text) if r.status_code == 200 else {}
            except (httpx.HTTPError, ValueError):
                values = {}
            if "running" not in values or "waiting" not in values:
                return None
            waited = time.monotonic() - t0
            if values["running"] + values["waiting"] == 0 or waited > max_s or (stop is not None and stop()):
                return waited
            if on_wait is not None:
                on_wait(waited, values["running"], values["waiting"])
            time.sleep(DRAIN_POLL_S)
