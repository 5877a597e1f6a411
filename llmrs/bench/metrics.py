"""Benchmark metrics with `vllm bench serve`'s definitions, so numbers compare across tools.

- per request: TTFT, ITL (every gap between content chunks), TPOT = (E2E - TTFT) / (output tokens - 1), E2E;
- over the run: mean / median / std / chosen percentiles (numpy's linear interpolation, as vLLM) of each;
- throughput: completed requests, output tokens and input+output tokens per second of run duration, where the
  duration runs from the common start t0 to the last request's end;
- goodput: completed requests per second that met every SLO given (ttft, tpot, itl-free e2el), in ms;
- peak concurrency: the most requests in flight at once, from their [start, end] intervals;
- queue-inclusive TTFT (not a vLLM metric): from a request's scheduled send (its arrival time in the schedule, a
  trace's timestamp, or a conversation's previous answer + think time) to its first token, so the time it waited
  for a free slot under --concurrency counts; TTFT itself starts at the actual send;
- per-turn TTFT (multi-turn runs): TTFT of each turn index, so the prefix cache's reuse of the history shows.
Failed requests count in `failures` with their reasons and are excluded from every latency statistic; a
statistic of no requests at all (every request failed; TPOT when every reply was one token) is None (null in the
results JSON, "-" in tables): never a 0 that reads as measured. An interrupted run's requests that were cut off in
flight or never sent are neither completed nor failed: they are counted apart (`cut_off`, `not_sent`), and the
run's duration ends with the last request that completed or failed.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import asdict, dataclass, field

import numpy as np

from llmrs.bench.records import RequestResult

SLO_KEYS = ("ttft", "tpot", "e2el")


@dataclass(slots=True)
class Dist:
    """Summary of one latency distribution, in milliseconds."""

    mean: float = 0.0
    median: float = 0.0
    std: float = 0.0
    min: float = 0.0
    max: float = 0.0
    percentiles: dict[str, float] = field(default_factory=dict)  # "p90" -> ms

    @classmethod
    def of(cls, seconds: list[float] | np.ndarray, percentiles: tuple[float, ...]) -> Dist | None:
        """The distribution of `seconds`, or None for no values (nothing was measured)."""
        a = np.asarray(seconds, dtype=np.float64) * 1e3
        if a.size == 0:
            return None
        return cls(
            float(a.mean()), float(np.median(a)), float(a.std()), float(a.min()), float(a.max()),
            {_pname(p): float(np.percentile(a, p)) for p in percentiles},
        )


def _pname(p: float) -> str:
    return f"p{p:g}"


@dataclass(slots=True)
class TurnStats:
    """The completed requests of one turn index of a multi-turn run: their TTFT and mean prompt length."""

    turn: int
    completed: int
    prompt_tokens_mean: float
    ttft_ms: Dist | None
    queued_ttft_ms: Dist | None


@dataclass(slots=True)
class Summary:
    """The numbers of one run. Counts are requests; tokens are the server's usage counts where given."""

    completed: int
    failed: int
    duration_s: float
    total_input_tokens: int
    total_output_tokens: int
    request_throughput: float
    output_throughput: float
    total_token_throughput: float
    peak_concurrency: int
    ttft_ms: Dist | None  # None: no request completed (or, for TPOT/ITL, none streamed two tokens)
    tpot_ms: Dist | None
    itl_ms: Dist | None
    e2el_ms: Dist | None
    failures: dict[str, int] = field(default_factory=dict)
    goodput: float | None = None  # requests/s meeting every SLO; None without --slo
    slo: dict[str, float] = field(default_factory=dict)
    usage_missing: int = 0  # completed requests without a usage chunk (tokens counted from the text instead)
    # completed requests whose usage disagrees with the re-tokenized text: decode -> encode does not round-trip
    # (tokens merge differently at boundaries), so this is expected on normal runs; `usage_miscount` is the error
    usage_mismatch: int = 0
    max_output_tokens_per_s: float = 0.0  # best whole second of streamed tokens (vLLM's peak output throughput)
    # completed requests whose usage count cannot be right: more tokens than max_tokens asked for, or fewer than
    # the content chunks streamed (each carries at least one token)
    usage_miscount: int = 0
    cut_off: int = 0  # requests in flight when the run was interrupted
    not_sent: int = 0  # requests the interrupted run never sent
    queued_ttft_ms: Dist | None = None  # scheduled send -> first token (TTFT plus the wait for a slot)
    per_turn: list[TurnStats] | None = None  # a multi-turn run: TTFT of each turn index; None otherwise

    def to_dict(self) -> dict:
        return asdict(self)


def output_tokens(r: RequestResult) -> int:
    """The server's usage count; without usage, the number of content chunks (one token each, usually)."""
    return r.output_tokens if r.output_tokens is not None else r.chunks


def tpot(r: RequestResult) -> float | None:
    n = output_tokens(r)
    return (r.latency - r.ttft) / (n - 1) if n > 1 else None


def failure_reason(error: str) -> str:
    """Group errors by kind: the text before the first ':' ("HTTP 500", "timeout after 5s", ...)."""
    return error.split(":", 1)[0].strip() or "unknown"


def peak_concurrency(results: list[RequestResult]) -> int:
    ev = sorted([(r.start, 1) for r in results if r.end > r.start] + [(r.end, -1) for r in results if r.end > r.start])
    cur = peak = 0
    for _, d in ev:  # ends sort before starts at equal times: -1 < 1
        cur += d
        peak = max(peak, cur)
    return peak


def parse_slo(text: str | None) -> dict[str, float]:
    """'ttft=200,tpot=50' -> {'ttft': 200.0, 'tpot': 50.0} (milliseconds)."""
    if not text:
        return {}
    out: dict[str, float] = {}
    for part in text.split(","):
        k, sep, v = part.partition("=")
        k = k.strip().lower()
        if not sep or k not in SLO_KEYS:
            raise ValueError(f"bad SLO {part!r}: expected KEY=MS with KEY in {', '.join(SLO_KEYS)}")
        try:
            ms = float(v)
        except ValueError:
            raise ValueError(f"bad SLO {part!r}: {v.strip()!r} is not a number of milliseconds") from None
        if not (ms > 0 and math.isfinite(ms)):
            raise ValueError(f"bad SLO {part!r}: milliseconds must be a positive number")
        out[k] = ms
    return out


def queued_ttft(r: RequestResult) -> float:
    """Seconds from the scheduled send to the first token (at least TTFT: a timer may fire a hair early)."""
    return r.ttft + max(0.0, r.start - r.scheduled) if r.scheduled else r.ttft


def per_turn(ok: list[RequestResult], percentiles: tuple[float, ...]) -> list[TurnStats] | None:
    """TurnStats of each turn index of the completed conversation turns, None when none is one."""
    turns: dict[int, list[RequestResult]] = {}
    for r in ok:
        if r.conversation >= 0:
            turns.setdefault(r.turn, []).append(r)
    if not turns:
        return None
    return [TurnStats(k, len(rs), sum(r.prompt_tokens if r.prompt_tokens is not None else r.input_len
                                      for r in rs) / len(rs),
                      Dist.of([r.ttft for r in rs], percentiles), Dist.of([queued_ttft(r) for r in rs], percentiles))
            for k, rs in sorted(turns.items())]


def meets_slo(r: RequestResult, slo: dict[str, float]) -> bool:
    vals = {"ttft": r.ttft, "tpot": tpot(r) or 0.0, "e2el": r.latency}
    return all(vals[k] * 1e3 <= v for k, v in slo.items())


def summarize(
    results: list[RequestResult],
    t0: float,
    *,
    percentiles: tuple[float, ...] = (50, 90, 99),
    slo: dict[str, float] | None = None,
    text_tokens: dict[int, int] | None = None,
) -> Summary:
    """Fold per-request results into one Summary. `text_tokens`: idx -> re-tokenized output length."""
    ok = [r for r in results if r.success]
    bad = [r for r in results if not r.success and not r.interrupted]
    end = max((r.end for r in ok + bad), default=t0)
    duration = max(end - t0, 1e-9)
    n_out = sum(output_tokens(r) for r in ok)
    n_in = sum(r.prompt_tokens if r.prompt_tokens is not None else r.input_len for r in ok)
    tpots = [t for t in (tpot(r) for r in ok) if t is not None]
    itls = [g for r in ok for g in r.itl]
    s = Summary(
        completed=len(ok),
        failed=len(bad),
        duration_s=duration,
        total_input_tokens=n_in,
        total_output_tokens=n_out,
        request_throughput=len(ok) / duration,
        output_throughput=n_out / duration,
        total_token_throughput=(n_in + n_out) / duration,
        peak_concurrency=peak_concurrency(results),
        ttft_ms=Dist.of([r.ttft for r in ok], percentiles),
        tpot_ms=Dist.of(tpots, percentiles),
        itl_ms=Dist.of(itls, percentiles),
        e2el_ms=Dist.of([r.latency for r in ok], percentiles),
        failures=dict(Counter(failure_reason(r.error) for r in bad).most_common()),
        usage_missing=sum(r.output_tokens is None for r in ok),
        usage_miscount=sum(1 for r in ok if r.output_tokens is not None and (
            r.output_tokens < r.chunks or (r.max_tokens > 0 and r.output_tokens > r.max_tokens))),
        max_output_tokens_per_s=_peak_window(ok, t0),
        cut_off=sum(r.interrupted == "in flight" for r in results),
        not_sent=sum(r.interrupted == "not sent" for r in results),
        queued_ttft_ms=Dist.of([queued_ttft(r) for r in ok], percentiles),
        per_turn=per_turn(ok, percentiles),
    )
    if slo:
        s.slo = dict(slo)
        s.goodput = sum(meets_slo(r, slo) for r in ok) / duration
    if text_tokens:
        s.usage_mismatch = sum(
            1 for r in ok if r.output_tokens is not None and r.idx in text_tokens and text_tokens[r.idx] != r.output_tokens
        )
    return s


def _peak_window(ok: list[RequestResult], t0: float) -> float:
    """Most output tokens streamed within any whole second since t0 (vLLM's peak output throughput).

    Chunk times are rebuilt from start + TTFT + cumulative ITL; each chunk is weighted by tokens/chunks.
    """
    times, weights = [], []
    for r in ok:
        if not r.chunks:
            continue
        t = r.start - t0 + r.ttft + np.concatenate([[0.0], np.cumsum(r.itl)])
        times.append(t)
        weights.append(np.full(t.size, output_tokens(r) / r.chunks))
    if not times:
        return 0.0
    secs = np.floor(np.concatenate(times)).astype(np.int64)
    return float(np.bincount(secs - secs.min(), weights=np.concatenate(weights)).max())
