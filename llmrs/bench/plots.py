"""The report's PNGs (matplotlib, Agg): fixed names, no embedded timestamps or version strings.

- throughput_vs_concurrency.png  output tok/s against concurrency, one line per engine and workload;
- ttft_percentiles.png / tpot_percentiles.png  p50 (solid) and p99 (dashed) against concurrency;
- latency_vs_throughput.png  median E2E latency against output tok/s: the serving trade-off curve.
Runs without a concurrency cap are plotted at x = their peak concurrency; a statistic nothing measured (every
request of the run failed) is left out of its line, not drawn as 0.
"""

from __future__ import annotations

import math
from pathlib import Path

from llmrs.bench.results import pct, stat
from llmrs.errors import UserError

PLOTS = ("throughput_vs_concurrency.png", "ttft_percentiles.png", "tpot_percentiles.png", "latency_vs_throughput.png")


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


def write_plots(rows, labels: list[str], out: Path) -> list[str]:
    """Writes the PNGs into `out`; returns their file names (relative, for the markdown)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series = _series(rows, labels)
    multi_wl = len({r.workload for r in rows}) > 1
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]

    def name(lb: str, wl: str) -> str:
        return f"{lb} ({wl})" if multi_wl else lb

    def save(fig, fname: str) -> str:
        fig.tight_layout()
        try:
            fig.savefig(out / fname, dpi=110, metadata={"Software": None})
        except OSError as e:  # a full disk, no permission, a directory in the way
            raise UserError(f"cannot write {out / fname}: {e.strerror or e}") from None
        finally:
            plt.close(fig)
        return fname

    written = []
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for i, (lb, wl, rs) in enumerate(series):
        ax.plot([_x(r) for r in rs], [_v(r, "output_throughput") for r in rs], "o-", color=colors[i % len(colors)],
                label=name(lb, wl))
    _conc_axis(ax, rows)
    ax.set_ylabel("output tokens/s")
    ax.set_title("Output throughput vs concurrency")
    ax.legend(fontsize=8)
    written.append(save(fig, PLOTS[0]))

    for fname, key, title in ((PLOTS[1], "ttft_ms", "TTFT"), (PLOTS[2], "tpot_ms", "TPOT")):
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for i, (lb, wl, rs) in enumerate(series):
            c = colors[i % len(colors)]
            xs = [_x(r) for r in rs]
            ax.plot(xs, [_v(r, key, "median") for r in rs], "o-", color=c, label=f"{name(lb, wl)} p50")
            ax.plot(xs, [_nan(pct(r.s, key, "p99")) for r in rs], "s--", color=c, label=f"{name(lb, wl)} p99")
        _conc_axis(ax, rows)
        ax.set_ylabel(f"{title} (ms)")
        ax.set_title(f"{title} percentiles vs concurrency")
        ax.legend(fontsize=8)
        written.append(save(fig, fname))

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for i, (lb, wl, rs) in enumerate(series):
        rs = sorted(rs, key=lambda r: stat(r.s, "output_throughput") or 0.0)
        ax.plot([_v(r, "output_throughput") for r in rs], [_v(r, "e2el_ms", "median") for r in rs], "o-",
                color=colors[i % len(colors)], label=name(lb, wl))
    ax.set_xlabel("output tokens/s")
    ax.set_ylabel("median E2E latency (ms)")
    ax.set_title("Latency vs throughput")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    written.append(save(fig, PLOTS[3]))
    return written


def _conc_axis(ax, rows) -> None:
    xs = sorted({_x(r) for r in rows})
    if len(xs) > 1 and xs[-1] / xs[0] >= 8:
        ax.set_xscale("log", base=2)
    ax.set_xticks(xs)
    ax.set_xticklabels([f"{x:g}" for x in xs])
    ax.set_xlabel("concurrency (requests in flight)")
    ax.grid(alpha=0.3)
