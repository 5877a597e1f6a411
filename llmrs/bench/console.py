"""Rich output for `llmrs bench`: the run's progress and the result tables.

Progress counts requests done (completed or failed) of the run's total and the output tokens streamed so far, those
of requests still in flight included (so tok/s moves from the first token, not from the first finished request).
On a terminal it is a live bar; otherwise (a log file, CI) a plain line every PLAIN_EVERY_S seconds and one at
the end.
"""

from __future__ import annotations

import time

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from llmrs.bench.metrics import Dist, Summary

SATURATED = 0.9  # a worker busier than this fraction of one core may be measuring itself
TURN_ROWS = 8  # a multi-turn run's table shows the TTFT of this many turns (every turn is in the results JSON)
PLAIN_EVERY_S = 5.0


class RunProgress:
    """The progress of one run: `update(done, failed, inflight, tokens, elapsed)` (runner.ProgressFn) inside
    `with`; a live bar on a terminal, plain lines elsewhere."""

    def __init__(self, console: Console, tag: str, total: int):
        self.console, self.tag, self.total = console, tag, total
        self.last: tuple[int, int, int, int, float] = (0, 0, 0, 0, 0.0)
        self.bar: Progress | None = None
        self.next_line = 0.0
        if console.is_terminal:
            self.bar = Progress(
                TextColumn("[bold]{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("in flight {task.fields[inflight]}  failed {task.fields[failed]}  "
                           "{task.fields[tokens]:,} tokens  {task.fields[tps]:,.0f} tok/s"),
                TimeElapsedColumn(),
                console=console,
                transient=False,
            )
            self.task = self.bar.add_task(tag, total=total, inflight=0, failed=0, tokens=0, tps=0.0)

    def __enter__(self) -> RunProgress:
        if self.bar is not None:
            self.bar.start()
        else:
            self.next_line = time.monotonic() + PLAIN_EVERY_S
        return self

    def update(self, done: int, failed: int, inflight: int, tokens: int, elapsed: float) -> None:
        self.last = (done, failed, inflight, tokens, elapsed)
        if self.bar is not None:
            self.bar.update(self.task, completed=done + failed, inflight=inflight, failed=failed, tokens=tokens,
                            tps=tokens / max(elapsed, 1e-9))
        elif time.monotonic() >= self.next_line:
            self.console.print(self.line(), soft_wrap=True, highlight=False)
            self.next_line = time.monotonic() + PLAIN_EVERY_S

    def line(self) -> str:
        done, failed, inflight, tokens, elapsed = self.last
        return (f"{self.tag}: {done + failed}/{self.total} requests done ({failed} failed), {inflight} in flight, "
                f"{tokens:,} tokens, {tokens / max(elapsed, 1e-9):,.0f} tok/s, {elapsed:,.0f}s elapsed")

    def __exit__(self, *exc) -> None:
        if self.bar is not None:
            self.bar.stop()
        else:
            self.console.print(self.line(), soft_wrap=True, highlight=False)


class ProbeProgress:
    """The probe before a sized run (sizing.py): a live status line on a terminal, one line up front elsewhere."""

    def __init__(self, console: Console, what: str, probe_s: float):
        self.console, self.what, self.probe_s = console, what, probe_s
        self.status = console.status(self._text(0, 0.0)) if console.is_terminal else None

    def _text(self, tokens: int, elapsed: float) -> str:
        return f"probing the server at {self.what} for about {self.probe_s:.0f} s: {elapsed:.0f} s, {tokens:,} tokens streamed"

    def __enter__(self) -> ProbeProgress:
        if self.status is not None:
            self.status.start()
        else:
            self.console.print(f"probing the server at {self.what} for about {self.probe_s:.0f} s", highlight=False)
        return self

    def update(self, done: int, failed: int, inflight: int, tokens: int, elapsed: float) -> None:
        if self.status is not None:
            self.status.update(self._text(tokens, elapsed))

    def __exit__(self, *exc) -> None:
        if self.status is not None:
            self.status.stop()


def _dist_rows(t: Table, name: str, d: Dist | None, percentiles: list[str]) -> None:
    """Mean / median and the percentiles of `d`; "-" where nothing was measured (d None)."""
    if d is None:
        t.add_row(f"{name} mean / median", "- / -")
        t.add_row(f"{name} " + " / ".join(percentiles), " / ".join("-" for _ in percentiles))
        return
    t.add_row(f"{name} mean / median", f"{d.mean:,.2f} / {d.median:,.2f}")
    t.add_row(f"{name} " + " / ".join(d.percentiles), " / ".join(f"{v:,.2f}" for v in d.percentiles.values()))


def _stat(d: Dist | None, which: str, nd: int) -> str:
    """One figure of `d` ("median", or a percentile name falling back to the max), "-" for no measurement."""
    if d is None:
        return "-"
    v = d.median if which == "median" else d.percentiles.get(which, d.max)
    return f"{v:.{nd}f}"


def share_of_core(busy: float) -> str:
    """A share of one core: one decimal below 10% (a client idling against a slow server reads 0.4%, not 0%)."""
    return f"{busy:.1%}" if busy < 0.095 else f"{busy:.0%}"


def summary_table(title: str, s: Summary, client: dict, verbose: bool = False) -> Table:
    """One run, in the order `vllm bench serve` prints it, plus failures and the client's own CPU use (`verbose`:
    also the usage cross-check against the re-tokenized text)."""
    t = Table(title=title, show_header=False, title_justify="left")
    t.add_column("metric", style="bold")
    t.add_column("value", justify="right")
    t.add_row("Successful requests", f"{s.completed}")
    t.add_row("Failed requests", f"{s.failed}" + (f"  ({', '.join(f'{k}: {v}' for k, v in s.failures.items())})" if s.failures else ""))
    t.add_row("Benchmark duration (s)", f"{s.duration_s:,.2f}")
    t.add_row("Total input / generated tokens", f"{s.total_input_tokens:,} / {s.total_output_tokens:,}")
    t.add_row("Request throughput (req/s)", f"{s.request_throughput:,.2f}")
    t.add_row("Output token throughput (tok/s)", f"{s.output_throughput:,.1f}")
    t.add_row("Peak output token throughput (tok/s)", f"{s.max_output_tokens_per_s:,.0f}")
    t.add_row("Total token throughput (tok/s)", f"{s.total_token_throughput:,.1f}")
    t.add_row("Peak concurrent requests", f"{s.peak_concurrency}")
    if s.goodput is not None:
        t.add_row(f"Goodput (req/s) [{', '.join(f'{k}<={v:g}ms' for k, v in s.slo.items())}]", f"{s.goodput:,.2f}")
    dists = (s.ttft_ms, s.tpot_ms, s.itl_ms, s.e2el_ms)
    pnames = next((list(d.percentiles) for d in dists if d is not None), ["p50", "p90", "p99"])
    for name, d in zip(("TTFT (ms)", "TPOT (ms)", "ITL (ms)", "E2E latency (ms)"), dists, strict=True):
        _dist_rows(t, name, d, pnames)
        if name == "TTFT (ms)":
            _dist_rows(t, "Queue-incl. TTFT (ms, from scheduled send)", s.queued_ttft_ms, pnames)
    for ts in (s.per_turn or [])[:TURN_ROWS]:
        t.add_row(f"TTFT turn {ts.turn} ({ts.completed} req, {ts.prompt_tokens_mean:,.0f} prompt tok) mean / median",
                  "- / -" if ts.ttft_ms is None else f"{ts.ttft_ms.mean:,.2f} / {ts.ttft_ms.median:,.2f}")
    if s.per_turn and len(s.per_turn) > TURN_ROWS:
        t.add_row(f"[dim]turns {TURN_ROWS} to {s.per_turn[-1].turn}", "[dim]in the results JSON (summary.per_turn)")
    if s.cut_off or s.not_sent:
        t.add_row("[yellow]Interrupted: in flight (cut off) / never sent", f"{s.cut_off} / {s.not_sent}")
    if s.usage_missing:
        t.add_row("[yellow]No usage chunk (tokens = chunks)", f"{s.usage_missing}")
    if s.usage_miscount:
        t.add_row("[red]Usage miscounts (tokens > max_tokens or < chunks)", f"{s.usage_miscount}")
    if verbose:
        t.add_row("usage != re-tokenized text (round trip, not an error)", f"{s.usage_mismatch}")
    busy = client.get("busy_per_worker", [])
    n = client.get("workers") or len(busy)
    t.add_row(f"Client CPU (share of one core, {n} worker{'s' if n != 1 else ''})",
              ", ".join(share_of_core(b) for b in busy) or "-")
    return t


def sweep_table(rows: list[tuple[str, Summary]]) -> Table:
    """All sweep points side by side."""
    t = Table(title="sweep", title_justify="left")
    for c in ("setting", "ok", "failed", "req/s", "out tok/s", "TTFT p50", "TTFT p99", "TPOT p50", "TPOT p99", "E2E p50"):
        t.add_column(c, justify="right")
    for tag, s in rows:
        t.add_row(
            tag, str(s.completed), str(s.failed), f"{s.request_throughput:.2f}", f"{s.output_throughput:,.1f}",
            _stat(s.ttft_ms, "median", 1), _stat(s.ttft_ms, "p99", 1), _stat(s.tpot_ms, "median", 2),
            _stat(s.tpot_ms, "p99", 2), _stat(s.e2el_ms, "median", 1),
        )
    return t
