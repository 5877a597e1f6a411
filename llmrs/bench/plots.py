"""The report's PNGs (matplotlib, Agg): fixed names, no embedded timestamps or version strings.

Runs at several concurrencies (a sweep, in one engine's results at least) are lines against concurrency:
- throughput_vs_concurrency.png  output tok/s, one line per engine and workload;
- ttft_percentiles.png / tpot_percentiles.png  p50 (solid) and p99 (dashed);
- latency_vs_throughput.png  median E2E latency against output tok/s: the serving trade-off curve.
One run per engine and workload (`llmrs bench` without --sweep, or engines compared at one setting) has no line to
draw, so it gets bars with their values written on them:
- throughput.png  output tok/s of each run;
- latency.png  TTFT, TPOT and E2E latency, each run's mean and percentiles side by side.
Every value axis starts at 0 (a bar or a line read against an axis that starts elsewhere exaggerates differences);
latencies are in ms, or in s where a plot's largest is 10 s or more. Runs without a concurrency cap are plotted at
x = their peak concurrency; a statistic nothing measured (every request of the run failed) is left out, not drawn
as 0. Beside them, where the results hold what the bench observed: roofline.png, telemetry.png and
server_series.png (llmrs.bench.observed_plots).
"""

from __future__ import annotations

import math
from pathlib import Path

from llmrs.bench.observed_plots import OBSERVED_PLOTS, observed_figures
from llmrs.bench.results import pct, stat
from llmrs.errors import UserError

SWEEP_PLOTS = ("throughput_vs_concurrency.png", "ttft_percentiles.png", "tpot_percentiles.png",
               "latency_vs_throughput.png")
SINGLE_PLOTS = ("throughput.png", "latency.png")
SECONDS_FROM_MS = 10_000.0  # a latency plot whose largest value reaches this many ms is drawn in seconds
LATENCIES = (("ttft_ms", "TTFT"), ("tpot_ms", "TPOT"), ("e2el_ms", "E2E latency"))


def _x(r) -> float:
    return float(r.concurrency or stat(r.s, "peak_concurrency") or 1)


def _nan(v: float | None) -> float:
    return math.nan if v is None else v


def _v(r, *path: str) -> float:
    """A run's statistic for a plot; NaN (no point) where nothing was measured."""
    return _nan(stat(r.s, *path))


def _series(rows, labels):
    """(label, workload, rows sorted by concurrency) for each engine and workload, in a stable order."""
    out = []
    for lb in labels:
        for wl in sorted({r.workload for r in rows if r.label == lb}):
            rs = sorted((r for r in rows if r.label == lb and r.workload == wl), key=lambda r: (_x(r), r.rate))
            out.append((lb, wl, rs))
    return out


def single_run_layout(rows, labels) -> bool:
    """Whether every engine and workload has one run (nothing to draw a line through): bars instead."""
    return all(len(rs) == 1 for _, _, rs in _series(rows, labels))


def time_unit(values_ms) -> tuple[str, float]:
    """("s", 1e-3) where the largest finite value is SECONDS_FROM_MS or more, else ("ms", 1.0)."""
    finite = [v for v in values_ms if v is not None and math.isfinite(v)]
    return ("s", 1e-3) if finite and max(finite) >= SECONDS_FROM_MS else ("ms", 1.0)


def _fmt(v: float) -> str:
    if not math.isfinite(v):
        return "-"
    return f"{v:,.0f}" if abs(v) >= 100 else f"{v:,.1f}" if abs(v) >= 10 else f"{v:,.2f}"


def figures(rows, labels: list[str]) -> dict:
    """The report's figures by file name (matplotlib Figures, for write_plots to save and close; tests read their
    axes)."""
    import matplotlib

    matplotlib.use("Agg")
    if single_run_layout(rows, labels):
        return _single_figures(rows, labels)
    return _sweep_figures(rows, labels)


def write_plots(rows, labels: list[str], out: Path) -> tuple[list[str], dict[str, list[str]]]:
    """Writes the PNGs into `out`; returns their file names (relative, for the markdown) and, per observed PNG
    (roofline, telemetry, server series), what it leaves out and why. PNGs of another layout, or observed ones with
    nothing to draw, left in `out` by an earlier report are removed (report.md would not show them, a reader of the
    folder would)."""
    import matplotlib.pyplot as plt

    figs = figures(rows, labels)
    observed, missing = observed_figures(rows, labels, _run_label)
    figs.update(observed)
    written = []
    try:
        for fname, fig in figs.items():
            fig.tight_layout()
            try:
                fig.savefig(out / fname, dpi=110, metadata={"Software": None})
            except OSError as e:  # a full disk, no permission, a directory in the way
                raise UserError(f"cannot write {out / fname}: {e.strerror or e}") from None
            written.append(fname)
    finally:
        for fig in figs.values():
            plt.close(fig)
    for stale in (*SWEEP_PLOTS, *SINGLE_PLOTS, *OBSERVED_PLOTS):
        if stale not in written:
            (out / stale).unlink(missing_ok=True)
    return written, missing


def _names(rows, labels):
    multi_wl = len({r.workload for r in rows}) > 1

    def name(lb: str, wl: str) -> str:
        return f"{lb} ({wl})" if multi_wl else lb

    return name


def _sweep_figures(rows, labels) -> dict:
    import matplotlib.pyplot as plt

    series = _series(rows, labels)
    name = _names(rows, labels)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    figs = {}

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for i, (lb, wl, rs) in enumerate(series):
        ax.plot([_x(r) for r in rs], [_v(r, "output_throughput") for r in rs], "o-", color=colors[i % len(colors)],
                label=name(lb, wl))
    _conc_axis(ax, rows)
    ax.set_ylim(bottom=0)
    ax.set_ylabel("output tokens/s")
    ax.set_title("Output throughput vs concurrency")
    ax.legend(fontsize=8)
    figs[SWEEP_PLOTS[0]] = fig

    for fname, key, title in ((SWEEP_PLOTS[1], "ttft_ms", "TTFT"), (SWEEP_PLOTS[2], "tpot_ms", "TPOT")):
        unit, k = time_unit([v for r in rows for v in (stat(r.s, key, "median"), pct(r.s, key, "p99"))])
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for i, (lb, wl, rs) in enumerate(series):
            c = colors[i % len(colors)]
            xs = [_x(r) for r in rs]
            ax.plot(xs, [_v(r, key, "median") * k for r in rs], "o-", color=c, label=f"{name(lb, wl)} p50")
            ax.plot(xs, [_nan(pct(r.s, key, "p99")) * k for r in rs], "s--", color=c, label=f"{name(lb, wl)} p99")
        _conc_axis(ax, rows)
        ax.set_ylim(bottom=0)
        ax.set_ylabel(f"{title} ({unit})")
        ax.set_title(f"{title} percentiles vs concurrency")
        ax.legend(fontsize=8)
        figs[fname] = fig

    unit, k = time_unit([stat(r.s, "e2el_ms", "median") for r in rows])
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for i, (lb, wl, rs) in enumerate(series):
        rs = sorted(rs, key=lambda r: stat(r.s, "output_throughput") or 0.0)
        ax.plot([_v(r, "output_throughput") for r in rs], [_v(r, "e2el_ms", "median") * k for r in rs], "o-",
                color=colors[i % len(colors)], label=name(lb, wl))
    ax.set_xlim(left=0)
    ax.set_ylim(bottom=0)
    ax.set_xlabel("output tokens/s")
    ax.set_ylabel(f"median E2E latency ({unit})")
    ax.set_title("Latency vs throughput")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    figs[SWEEP_PLOTS[3]] = fig
    return figs


def _run_label(r) -> str:
    """'c=16', 'c=inf, 4/s': a run among its engine's."""
    c = r.concurrency if r.concurrency else "inf"
    return f"c={c}" + ("" if math.isinf(r.rate) else f", {r.rate:g}/s")


def _run_name(r, name) -> str:
    c = r.concurrency if r.concurrency else "inf"
    rate = "" if math.isinf(r.rate) else f", rate {r.rate:g}/s"
    return f"{name(r.label, r.workload)}\nc={c}{rate}"


def _single_figures(rows, labels) -> dict:
    import matplotlib.pyplot as plt
    import numpy as np

    runs = [rs[0] for _, _, rs in _series(rows, labels)]
    name = _names(rows, labels)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    names = [_run_name(r, name) for r in runs]
    figs = {}

    # throughput: one horizontal bar per run (names read across, values written at the bar's end)
    fig, ax = plt.subplots(figsize=(7, 1.6 + 0.7 * len(runs)))
    ys = np.arange(len(runs))[::-1]
    vals = [_v(r, "output_throughput") for r in runs]
    bars = ax.barh(ys, [0 if math.isnan(v) else v for v in vals], color=[colors[i % len(colors)] for i in range(len(runs))],
                   height=0.6)
    ax.bar_label(bars, labels=[f" {_fmt(v)} tok/s ({_fmt(_v(r, 'request_throughput'))} req/s)"
                               for v, r in zip(vals, runs)], fontsize=9)
    ax.set_yticks(ys, names, fontsize=9)
    ax.set_xlim(0, max([v for v in vals if math.isfinite(v)] or [1.0]) * 1.4 or 1.0)
    ax.set_xlabel("output tokens/s")
    ax.set_title("Output throughput")
    ax.grid(axis="x", alpha=0.3)
    figs[SINGLE_PLOTS[0]] = fig

    # latency: one panel per metric, its mean and percentiles as groups of bars (one bar per run in a group)
    pnames = next((list(d["percentiles"]) for r in runs for key, _ in LATENCIES
                   if isinstance(d := r.s.get(key), dict) and isinstance(d.get("percentiles"), dict)), ["p50", "p99"])
    stats = ["mean", *pnames]
    fig, axes = plt.subplots(1, len(LATENCIES), figsize=(4.2 * len(LATENCIES), 4.6), squeeze=False)
    width = 0.8 / len(runs)
    for ax, (key, title) in zip(axes[0], LATENCIES):
        table = [[stat(r.s, key, "mean"), *(stat(r.s, key, "percentiles", p) for p in pnames)] for r in runs]
        unit, k = time_unit([v for row in table for v in row])
        xs = np.arange(len(stats))
        for i, (row, r) in enumerate(zip(table, runs)):
            vs = [_nan(v) * k for v in row]
            bars = ax.bar(xs + (i - (len(runs) - 1) / 2) * width, [0 if math.isnan(v) else v for v in vs], width,
                          color=colors[i % len(colors)], label=names[i].replace("\n", ", "))
            ax.bar_label(bars, labels=[_fmt(v) for v in vs], fontsize=7, rotation=90 if len(runs) > 2 else 0,
                         padding=2)
        top = max([v * k for row in table for v in row if v is not None and math.isfinite(v)] or [1.0])
        ax.set_ylim(0, top * 1.2 or 1.0)
        ax.set_xticks(xs, stats)
        ax.set_ylabel(f"{title} ({unit})")
        ax.set_title(title)
        ax.grid(axis="y", alpha=0.3)
    if len(runs) > 1:
        axes[0][0].legend(fontsize=8)
    fig.suptitle("Latency: mean and percentiles" + (f" ({names[0]})".replace("\n", ", ") if len(runs) == 1 else ""),
                 fontsize=11)
    figs[SINGLE_PLOTS[1]] = fig
    return figs


def _conc_axis(ax, rows) -> None:
    xs = sorted({_x(r) for r in rows})
    if len(xs) > 1 and xs[-1] / xs[0] >= 8:
        ax.set_xscale("log", base=2)
    ax.set_xticks(xs)
    ax.set_xticklabels([f"{x:g}" for x in xs])
    ax.set_xlabel("concurrency (requests in flight)")
    ax.grid(alpha=0.3)
