"""The report's PNGs of what watched each bench (llmrs.bench.observe), drawn only where the results hold it:

- roofline.png  each engine's graded runs on the roofline of the GPU they were graded against (one panel per GPU
  and set of ceilings): x the arithmetic intensity of the run's decode step (its FLOPs over its bytes at the run's
  mean batch and context), y the FLOP/s it achieved (its fraction of the ideal times the roof there), each point
  labelled with its concurrency and % of ceiling;
- telemetry.png  per results file, GPU power and SM clock (one line per GPU; slowdowns marked) over time, with the
  output throughput rebuilt from the per-request CSVs (tokens streamed per second) on the same axis;
- server_series.png  per results file, the server's running and waiting requests and KV cache usage over time.
The time series share one axis per results file: seconds since its first run started (both CSVs and the request
timings are on time.perf_counter()), with each run's window shaded and named. `missing` says why a PNG, or a
results file's part of it, is not drawn, in words for report.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from llmrs.bench import series, telemetry

ROOFLINE_PNG, TELEMETRY_PNG, SERVER_PNG = "roofline.png", "telemetry.png", "server_series.png"
OBSERVED_PLOTS = (ROOFLINE_PNG, TELEMETRY_PNG, SERVER_PNG)
SLOWDOWN_MASK = sum(bit for bit, name in telemetry.THROTTLE_REASONS.items() if name not in telemetry.NOT_A_SLOWDOWN)


@dataclass(slots=True)
class Bench:
    """One results file's runs with the time series saved beside it."""

    label: str
    source: str
    rows: list  # report.Row, in the file's order
    origin: float | None  # perf_counter seconds of its first run's start (the time axis' 0); None without windows
    telemetry: list[dict] = field(default_factory=list)
    server: list[dict] = field(default_factory=list)

    @property
    def name(self) -> str:
        return f"{self.label} ({self.source})"


def _series_rows(bench_rows: list, kind: str, reader) -> tuple[list[dict], str]:
    """(rows of a results file's `kind` CSV, why none) from its observers section."""
    r0 = bench_rows[0]
    obs = r0.observers.get(kind) if isinstance(r0.observers.get(kind), dict) else None
    if obs is None:
        return [], "the results file has no record of it (no `observers` section)"
    name = obs.get("csv")
    if not name:
        return [], obs.get("why") or "not recorded"
    path = r0.path.parent / name
    if not path.is_file():
        return [], f"{name} is not beside the results file"
    try:
        rows = [r for r in reader(path) if r.get("t") is not None]
    except (OSError, ValueError, KeyError) as e:
        return [], f"{name} cannot be read ({e})"
    if not rows:
        return [], obs.get("why") or f"{name} holds no samples"
    origin = origin_of(bench_rows)
    if origin is None:
        return [], "its runs have no time window to place the series on"
    end = max(r.window["t1"] for r in bench_rows if r.window)
    if not any(origin <= s["t"] <= end for s in rows):
        return [], f"no sample of {name} fell in its runs"
    return rows, ""


def origin_of(bench_rows: list) -> float | None:
    t0s = [r.window["t0"] for r in bench_rows if r.window]
    return min(t0s) if t0s else None


def benches(rows) -> tuple[list[Bench], dict[str, list[str]]]:
    """The results files with their series, and per PNG the lines saying what it leaves out and why."""
    by_path: dict[Path, list] = {}
    for r in rows:
        by_path.setdefault(r.path, []).append(r)
    out, missing = [], {p: [] for p in OBSERVED_PLOTS}
    for rs in by_path.values():
        b = Bench(label=rs[0].label, source=rs[0].source, rows=rs, origin=origin_of(rs))
        b.telemetry, why_t = _series_rows(rs, "telemetry", series.read_rows)
        b.server, why_s = _series_rows(rs, "server_series", series.read_rows)
        if why_t:
            missing[TELEMETRY_PNG].append(f"**{b.label}** `{b.source}`: {why_t}")
        if why_s:
            missing[SERVER_PNG].append(f"**{b.label}** `{b.source}`: {why_s}")
        out.append(b)
    if not any(_graded(r) for r in rows):
        missing[ROOFLINE_PNG].append("no run is graded (the Roofline section says why)")
    return out, missing


def _graded(r) -> bool:
    g = r.roofline
    return bool(g.get("graded")) and all(isinstance(g.get(k), int | float) and g.get(k) > 0 for k in (
        "decode_step_flops", "decode_step_bytes", "bandwidth_gbs", "peak_tflops")) and \
        isinstance(g.get("fraction_of_ideal"), int | float)


def observed_figures(rows, labels: list[str], run_name) -> tuple[dict, dict[str, list[str]]]:
    """(figures by file name, what each PNG leaves out): only the PNGs with something to draw."""
    found, missing = benches(rows)
    figs = {}
    graded = [r for r in rows if _graded(r)]
    if graded:
        figs[ROOFLINE_PNG] = _roofline_figure(graded, labels, run_name)
    tel = [b for b in found if b.telemetry]
    if tel:
        figs[TELEMETRY_PNG] = _time_figure(tel, "GPU telemetry and output throughput", _telemetry_panels, run_name)
    srv = [b for b in found if b.server]
    if srv:
        figs[SERVER_PNG] = _time_figure(srv, "Server metrics over time", _server_panels, run_name)
    return figs, missing


# ---- roofline.png ----------------------------------------------------------------------------------------------

def _roof_key(g: dict) -> tuple:
    return (g.get("gpu_name") or g.get("gpu") or "?", g.get("ceilings") or "datasheet", float(g["bandwidth_gbs"]),
            float(g["peak_tflops"]), g.get("compute_dtype") or "")


def _roofline_figure(graded, labels, run_name):
    import matplotlib.pyplot as plt
    import numpy as np

    groups: dict[tuple, list] = {}
    for r in graded:
        groups.setdefault(_roof_key(r.roofline), []).append(r)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    fig, axes = plt.subplots(1, len(groups), figsize=(8 * len(groups), 5.5), squeeze=False)
    for ax, ((gpu, ceilings, bw_gbs, peak_tf, dtype), rs) in zip(axes[0], groups.items()):
        bw, peak = bw_gbs * 1e9, peak_tf * 1e12
        ridge = peak / bw
        xs = [r.roofline["decode_step_flops"] / r.roofline["decode_step_bytes"] for r in rs]
        ys = [r.roofline["fraction_of_ideal"] * min(peak, bw * x) / 1e12 for r, x in zip(rs, xs)]
        lo, hi = min(0.5, min(xs) / 2), max(4 * ridge, max(xs) * 2)
        grid = np.logspace(np.log10(lo), np.log10(hi), 200)
        ax.plot(grid, np.minimum(peak, bw * grid) / 1e12, "k-", lw=2,
                label=f"{ceilings}: {bw_gbs:,.0f} GB/s, {peak_tf:,.0f} TFLOP/s {dtype}".rstrip())
        ax.axvline(ridge, color="grey", ls=":", lw=1)
        ax.annotate(f"ridge {ridge:.0f} FLOP/B", (ridge, peak_tf * 0.5), rotation=90, fontsize=8, color="grey",
                    ha="right", va="top")
        series: dict[tuple, list] = {}
        for r, x, y in zip(rs, xs, ys):
            series.setdefault((r.label, r.workload), []).append((x, y, r))
        multi_wl = len({wl for _, wl in series}) > 1
        for i, ((lb, wl), pts) in enumerate(sorted(series.items(), key=lambda kv: (labels.index(kv[0][0]), kv[0][1]))):
            pts.sort(key=lambda p: p[0])
            c = colors[i % len(colors)]
            ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-", color=c, lw=1, ms=7,
                    label=f"{lb} ({wl})" if multi_wl else lb)
            for x, y, r in pts:
                ax.annotate(f"{run_name(r)}: {_pct(r.roofline['fraction_of_ideal'])}", (x, y),
                            textcoords="offset points", xytext=(6, -4 - 9 * (i % 2)), fontsize=8, color=c)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlim(lo, hi)
        ax.set_ylim(min(ys) / 4, peak_tf * 2)
        ax.set_xlabel("arithmetic intensity of the run's decode step (FLOP / byte)")
        ax.set_ylabel("decode TFLOP/s achieved")
        ax.set_title(f"Runs on the roofline of {gpu} ({ceilings}): % of ceiling", fontsize=11)
        ax.grid(True, which="both", alpha=0.25)
        ax.legend(fontsize=8, loc="upper left")
    return fig


def _pct(x: float) -> str:
    from llmrs.bench.observe import pct

    return pct(x)


# ---- the time series -------------------------------------------------------------------------------------------

def _time_figure(found: list[Bench], title: str, panels, run_name):
    """One column per results file, one row per panel, the panels of a column sharing its time axis."""
    import matplotlib.pyplot as plt

    n_rows = len(panels(None, None))
    fig, axes = plt.subplots(n_rows, len(found), figsize=(7.5 * len(found), 2.5 * n_rows + 0.8), squeeze=False,
                             sharex="col")
    for j, b in enumerate(found):
        col = [axes[i][j] for i in range(n_rows)]
        panels(b, col)
        end = _end(b) - b.origin
        for ax in col:
            _shade_runs(ax, b, run_name, top=ax is col[0])
            if ax.get_autoscaley_on():  # from 0, with room above the highest value for the legend
                top = max((v for ln in ax.get_lines() for v in ln.get_ydata() if math.isfinite(v)), default=0.0)
                ax.set_ylim(0, top * 1.25 or 1.0)
            ax.grid(alpha=0.3)
            ax.set_xlim(0, end * 1.02 or 1.0)
        col[0].set_title(b.name, fontsize=10, pad=16)
        col[-1].set_xlabel("seconds since the first run started")
    fig.suptitle(title, fontsize=12)
    return fig


def _shade_runs(ax, b: Bench, run_name, top: bool) -> None:
    """Each run's window shaded (alternating), and named above the top panel."""
    for k, r in enumerate(w for w in b.rows if w.window):
        a, z = r.window["t0"] - b.origin, r.window["t1"] - b.origin
        ax.axvspan(a, z, color="tab:grey", alpha=0.16 if k % 2 == 0 else 0.08, lw=0)
        if top:
            ax.annotate(run_name(r), ((a + z) / 2, 1.0), xycoords=("data", "axes fraction"), ha="center",
                        va="bottom", fontsize=8, color="dimgrey")


def _in_window(b: Bench, rows: list[dict]) -> list[dict]:
    """The samples from the first run's start to the last run's end (the probes and warmup before are left out)."""
    end = _end(b)
    return [s for s in rows if b.origin <= s["t"] <= end]


def _end(b: Bench) -> float:
    """perf_counter seconds of the last run's end."""
    return max((r.window["t1"] for r in b.rows if r.window), default=b.origin)


def _telemetry_panels(b: Bench | None, col: list | None) -> list[str]:
    names = ["power", "sm clock", "output tok/s"]
    if b is None:
        return names
    ax_p, ax_c, ax_t = col
    samples = _in_window(b, b.telemetry)
    gpus = sorted({int(s["gpu"]) for s in samples if s.get("gpu") is not None})
    for k, g in enumerate(gpus):
        mine = [s for s in samples if s.get("gpu") is not None and int(s["gpu"]) == g]
        ts = [s["t"] - b.origin for s in mine]
        name = f"GPU {g}"
        ax_p.plot(ts, [_nan(s.get("power_w")) for s in mine], lw=1, label=name)
        ax_c.plot(ts, [_nan(s.get("sm_mhz")) for s in mine], lw=1, label=name)
        slow = [(t, s) for t, s in zip(ts, mine)
                if s.get("throttle") is not None and int(s["throttle"]) & SLOWDOWN_MASK]
        if slow:  # a rug along the panel's foot, a row per GPU: the clock lines above stay readable
            reasons = sorted({n for _, s in slow for n in telemetry.throttle_names(int(s["throttle"]) & SLOWDOWN_MASK)})
            ax_c.plot([t for t, _ in slow], [0.04 + 0.06 * k for _ in slow], "|", ms=7,
                      color=ax_c.get_lines()[-1].get_color(), transform=ax_c.get_xaxis_transform(), label=f"GPU {g} slowed: {', '.join(reasons)}")
    ax_p.set_ylabel("power (W)")
    ax_c.set_ylabel("SM clock (MHz)")
    if gpus:
        ax_p.legend(fontsize=7, loc="upper right", ncol=min(len(gpus), 4))
        ax_c.legend(fontsize=7, loc="upper right", ncol=min(2 * len(gpus), 4))
    _throughput(ax_t, b)
    return names


def _server_panels(b: Bench | None, col: list | None) -> list[str]:
    names = ["requests", "kv cache"]
    if b is None:
        return names
    ax_r, ax_k = col
    polls = _in_window(b, b.server)
    ts = [p["t"] - b.origin for p in polls]
    for key, style in (("running", "-"), ("waiting", "--")):
        if any(p.get(key) is not None for p in polls):
            ax_r.plot(ts, [_nan(p.get(key)) for p in polls], style, lw=1.2, drawstyle="steps-post", label=key)
    if ax_r.get_lines():
        ax_r.legend(fontsize=7, loc="upper right")
    ax_r.set_ylabel("requests")
    kv = [100 * _nan(p.get("kv_usage")) for p in polls]
    if any(math.isfinite(v) for v in kv):  # from 0 to above its peak (named), so a cache far from full still shows
        ax_k.plot(ts, kv, lw=1.2, drawstyle="steps-post", color="tab:purple",
                  label=f"KV cache in use (peak {max(v for v in kv if math.isfinite(v)):.3g}%)")
        ax_k.legend(fontsize=7, loc="upper right")
    ax_k.set_ylabel("KV cache in use (%)")
    return names


def _nan(v) -> float:
    return math.nan if v is None else float(v)


def token_times(b: Bench) -> list[tuple[float, float]]:
    """(seconds since the bench's origin, tokens) of every chunk the completed requests streamed: the first at
    start + TTFT, each next one an ITL later, each carrying an equal share of the request's output tokens."""
    import pandas as pd

    out: list[tuple[float, float]] = []
    for r in b.rows:
        if not r.window or r.csv_path is None or not r.csv_path.is_file():
            continue
        try:
            df = pd.read_csv(r.csv_path, usecols=["success", "start_s", "ttft_ms", "output_tokens", "itl_ms"])
        except (OSError, ValueError):
            continue
        shift = r.window["t0"] - b.origin
        for ok, start, ttft, n, itl in df.itertuples(index=False):
            if str(ok) != "True" or not (start == start and ttft == ttft):  # a failure, or no first token: nothing known
                continue
            gaps = [float(g) for g in str(itl).split(";") if g and g != "nan"]
            t = shift + start + ttft / 1e3
            times = [t]
            for g in gaps:
                t += g / 1e3
                times.append(t)
            each = (n if n == n else len(times)) / len(times)
            out += [(x, each) for x in times]
    return out


def _throughput(ax, b: Bench) -> None:
    """Output tokens per second in fixed bins over the bench, from the per-request CSVs."""
    tokens = token_times(b)
    ax.set_ylabel("output tok/s")
    if not tokens:
        ax.annotate("no per-request CSV to rebuild it from", (0.5, 0.5), xycoords="axes fraction", ha="center")
        return
    end = max(t for t, _ in tokens)
    width = bin_width(end)
    n = int(end / width) + 1
    counts = [0.0] * n
    for t, k in tokens:
        counts[min(max(int(t / width), 0), n - 1)] += k
    ax.plot([(i + 0.5) * width for i in range(n)], [c / width for c in counts], color="tab:green", lw=1.2,
            drawstyle="steps-mid", label=f"output tok/s ({width:g} s bins)")
    ax.legend(fontsize=7, loc="upper right")


def bin_width(span_s: float) -> float:
    """A round bin (0.1, 0.2, 0.5, 1, 2, 5... s) giving about 100 bins over the span, at least 0.1 s."""
    target = max(span_s / 100, 0.1)
    exp = 10 ** math.floor(math.log10(target))
    return next(m * exp for m in (1, 2, 5, 10) if m * exp >= target - 1e-12)
