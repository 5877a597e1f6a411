"""The classic log-log roofline: attainable FLOP/s against arithmetic intensity, with the model's points.

Roofs: bandwidth (slope) and the compute peak (flat), datasheet solid, measured dashed when known. Points:
one decode step per batch size, the prefill load, and any measured points (`--measured`).
"""

from __future__ import annotations

from pathlib import Path

from llmrs.errors import UserError
from llmrs.roofline.analysis import Roofline
from llmrs.roofline.gpus import GpuSpec
from llmrs.roofline.overlay import MeasuredPoint


PLOT_SUFFIXES = (".png", ".svg", ".pdf")


def plot_path(path: Path, flag: str = "--plot") -> Path:
    """The file a chart asked for as `path` goes to: its suffix picks the format (.png, .svg, .pdf); a path without
    one gets .png (as matplotlib's savefig would add it); another suffix is a UserError naming the formats."""
    path = Path(path)
    if not path.suffix:
        return path.with_name(path.name + ".png")
    if path.suffix.lower() not in PLOT_SUFFIXES:
        raise UserError(f"{flag} {path}: unsupported chart format {path.suffix!r}; use {', '.join(PLOT_SUFFIXES)}")
    return path


def plot_roofline(r: Roofline, gpu: GpuSpec, path: Path, measured: list[MeasuredPoint] | None = None) -> Path:
    """Write the roofline chart to plot_path(path) (format from its suffix: .png, .svg, .pdf); returns that path."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        import numpy as np
    except ImportError:
        raise UserError("--plot needs matplotlib: in the llmrs checkout, pip install -e '.[roofline]'") from None

    xs = [p.intensity for p in r.points] + [r.prefill.flops / r.prefill.bytes]
    xs += [m.intensity for m in measured or []]
    lo, hi = min(0.5, min(xs) / 2), max(4 * r.roofs.ridge, max(xs) * 2)
    x = np.logspace(np.log10(lo), np.log10(hi), 200)
    fig, ax = plt.subplots(figsize=(8, 5.5))
    ds_bw, ds_peak = gpu.bandwidth(False), gpu.peak_flops(r.roofs.compute_dtype, False)
    ax.plot(x, np.minimum(ds_peak, ds_bw * x) / 1e12, "k-", lw=2,
            label=f"datasheet: {ds_bw / 1e9:.0f} GB/s, {ds_peak / 1e12:.0f} TFLOP/s {r.roofs.compute_dtype}")
    if gpu.measured_bandwidth_gbs or gpu.measured_bf16_tflops:
        m_bw, m_peak = gpu.bandwidth(True), gpu.peak_flops(r.roofs.compute_dtype, True)
        ax.plot(x, np.minimum(m_peak, m_bw * x) / 1e12, "k--", lw=1.2,
                label=f"measured: {m_bw / 1e9:.0f} GB/s, {m_peak / 1e12:.0f} TFLOP/s")
    ax.axvline(r.roofs.ridge, color="grey", ls=":", lw=1)
    ax.annotate(f"ridge {r.roofs.ridge:.0f} FLOP/B", (r.roofs.ridge, ds_peak / 1e12 * 0.6), rotation=90,
                fontsize=8, color="grey", ha="right")
    for p in r.points:
        y = p.flops / p.step_s / 1e12
        ax.plot(p.intensity, y, "o", color="tab:blue")
        ax.annotate(f"B={p.batch}", (p.intensity, y), textcoords="offset points", xytext=(5, -10), fontsize=8)
    pf = r.prefill
    ax.plot(pf.flops / pf.bytes, pf.flops / pf.floor_s / 1e12, "s", color="tab:green",
            label=f"prefill {pf.prompts}x{pf.prompt_len}")
    for i, m in enumerate(measured or []):
        ax.plot(m.intensity, m.achieved_flops / 1e12, "x", ms=9, mew=2, color=f"C{(i % 8) + 1}",
                label=f"{m.label}: {100 * m.fraction_of_ceiling:.0f}% of ceiling")
    ax.plot([], [], "o", color="tab:blue", label=f"decode steps, context {r.context}")
    return save_roofline_axes(fig, ax, path, f"{r.model} ({r.weight_format}) on {r.gpu_name}", "attainable TFLOP/s")


def save_roofline_axes(fig, ax, path: Path, title: str, ylabel: str) -> Path:  # type: ignore[no-untyped-def]
    """The classic roofline chart's log-log axes, labels and legend, then the file at plot_path(path) (shared with
    `llmrs profile`); returns that path."""
    import matplotlib.pyplot as plt

    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (FLOP / byte)")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.25)
    ax.legend(fontsize=8, loc="lower right")
    try:
        path = plot_path(path)
    except UserError:
        plt.close(fig)
        raise
    fig.tight_layout()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=130)
    except OSError as e:  # an unwritable place: the user's to fix
        raise UserError(f"--plot {path}: cannot write the chart there ({e.strerror or e})") from None
    finally:
        plt.close(fig)
    return path
