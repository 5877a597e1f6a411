"""`llmrs report` on what `llmrs bench` records beside its measurements: each run's roofline grade, its GPU telemetry
and the server's /metrics series, as report.md columns and sections and as roofline.png, telemetry.png and
server_series.png (read back from their matplotlib axes). The results are made by real benches against the fake
server on 127.0.0.1: one graded as qwen2.5-0.5b on an H100 SXM with the stand-in NVML (two GPUs drawing 300 and
400 W at 1980 MHz, GPU 1 power-capped), one with no GPU and no cost model. The fake server has no /metrics, so the
graded bench's series is written here the way the scraper writes it (a poll every 0.1 s: several in the shortest
run)."""

from __future__ import annotations

import csv
import json
import math
import shutil
from pathlib import Path

import pytest
from rich.console import Console

from llmrs.bench import scrape
from llmrs.bench.series import read_rows
from llmrs.bench.bench import BenchOptions, run_bench
from llmrs.bench.dataset import WorkloadConfig
from llmrs.bench.observe import pct
from llmrs.bench.observed_plots import OBSERVED_PLOTS, bin_width, observed_figures
from llmrs.bench.plots import SWEEP_PLOTS, _run_label
from llmrs.bench.report import REPORT_MD, load_rows, write_report
from tests.bench.test_bench_cli_report import _fake_results
from tests.bench_fixtures.serving import running

WAITING_AT = {1: 0, 4: 3}  # the hand-written series' waiting requests during each run, by concurrency


def _write_metrics_series(results: Path) -> None:
    """A .metrics.csv beside `results` as the scraper writes it (from 1 s before the first run to 1 s after the
    last, every 0.1 s: running = the run's concurrency, waiting = WAITING_AT, KV cache = running / 8, a preemption
    per poll of the c=4 run), with each run's summary and the observers entry the bench would have saved."""
    doc = json.loads(results.read_text())
    windows = [(r["concurrency"], r["window"]["t0"], r["window"]["t1"]) for r in doc["runs"]]
    rows, t, preempted = [], windows[0][1] - 1.0, 0
    while t <= windows[-1][2] + 1.0:
        c = next((c for c, a, z in windows if a <= t <= z), 0)
        preempted += c == 4
        rows.append({"t": f"{t:.6f}", "running": c, "waiting": WAITING_AT.get(c, 0), "kv_usage": c / 8,
                     "preemptions": preempted})
        t += 0.1
    name = results.with_suffix(".metrics.csv")
    with open(name, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=("t", *scrape.SERIES))
        w.writeheader()
        w.writerows(rows)
    read = read_rows(name)
    doc["observers"]["server_series"] = {"csv": name.name, "why": "", "interval_s": 0.1}
    for run in doc["runs"]:
        run["server_series"] = scrape.summarize(read, run["window"]["t0"], run["window"]["t1"])
    results.write_text(json.dumps(doc))


@pytest.fixture(scope="module")
def benches(tmp_path_factory) -> Path:
    """A folder with graded.json (llmrs, c=1 and c=4, telemetry and a metrics series) and plain.json (other, c=2:
    not graded, no telemetry, /metrics answered 404), their CSVs beside them."""
    out = tmp_path_factory.mktemp("benches")
    with running(ttft_ms=50, gap_ms=20) as (url, _):
        run_bench(BenchOptions(workload=WorkloadConfig(num_prompts=8, input_len=32, output_len=10, seed=1), url=url,
                               sweep=("concurrency", [1.0, 4.0]), workers=1, out_dir=out, name="graded", label="llmrs",
                               gpu="h100-sxm", model_config="qwen2.5-0.5b", nvml_module="nvml_standin"),
                  Console(quiet=True))
        run_bench(BenchOptions(workload=WorkloadConfig(num_prompts=4, input_len=32, output_len=10, seed=1), url=url,
                               concurrency=2, workers=1, out_dir=out, name="plain", label="other",
                               nvml_module="no_such_nvml", scrape_metrics=True), Console(quiet=True))
    _write_metrics_series(out / "graded.json")
    return out


@pytest.fixture(scope="module")
def report(benches, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("report")
    write_report([str(benches)], out)
    return out


def _section(md: str, title: str) -> str:
    start = md.index(f"## {title}")
    nxt = md.find("\n## ", start + 1)
    return md[start: nxt if nxt >= 0 else None]


def _row(text: str, *starts: str) -> list[str]:
    line = next(ln for ln in text.splitlines() if ln.startswith("| " + " | ".join(starts) + " |"))
    return [c.strip() for c in line.strip("|").split("|")]


def test_report_tables_each_runs_grade_telemetry_and_server_series(benches, report):
    doc = json.loads((benches / "graded.json").read_text())
    runs = {r["concurrency"]: r for r in doc["runs"]}
    md = (report / REPORT_MD).read_text()
    assert sorted(p.name for p in report.iterdir()) == sorted([REPORT_MD, *SWEEP_PLOTS, *OBSERVED_PLOTS])

    # the roofline columns: the run's fraction of the ideal and MBU, beside its throughput and latencies
    side = _section(md, "Side by side")
    assert "| % of ideal (llmrs / other) | MBU (llmrs / other) |" in side
    for c in (1, 4):
        g = runs[c]["roofline"]
        cells = _row(side, f"completions 32->10, c={c}, rate=inf")
        assert cells[-2:] == [f"{pct(g['fraction_of_ideal'])} / -", f"{pct(g['mbu'])} / -"]
        cells = _row(_section(md, "All runs"), "llmrs", f"completions 32->10, c={c}, rate=inf")
        assert cells[-3:-1] == [pct(g["fraction_of_ideal"]), pct(g["mbu"])]
    assert _row(_section(md, "All runs"), "other", "completions 32->10, c=2, rate=inf")[-3:-1] == ["-", "-"]

    # what each engine was graded against, or why it was not; then every graded run's place under the roofline
    roof = _section(md, "Roofline")
    assert ("- **llmrs** `graded.json`: graded against NVIDIA H100 SXM5 80GB (`h100-sxm`), datasheet ceilings "
            "3,350 GB/s and 990 TFLOP/s bf16; model qwen2.5-0.5b (bf16; from --model-config).") in roof
    assert "- **other** `plain.json`: not graded: no cost model for 'fake-model'" in roof
    g = runs[4]["roofline"]
    assert _row(roof, "llmrs", "completions 32->10, c=4, rate=inf")[2:] == [
        f"{g['output_tok_s']:,.1f}", f"{g['ideal_output_tok_s']:,.0f}", pct(g["fraction_of_ideal"]), pct(g["mbu"]),
        pct(g["mfu"]), pct(g["mfu_prefill"]), f"{g['mean_decode_batch']:,.2f}", "37",
        f"{g['decode_floor_ms']:,.3f}", "memory"]

    # telemetry per run: the stand-in's 300 + 400 W, energy from its counters, output tokens per joule
    tel = _section(md, "GPU telemetry")
    for c in (1, 4):
        t = runs[c]["telemetry"]
        assert _row(tel, "llmrs", f"completions 32->10, c={c}, rate=inf")[2:] == [
            "2", "700", "700", f"{t['energy_j']:,.0f}", f"{t['output_tokens_per_joule']:,.2f}", "1,980", "90%",
            "sw_power_cap"]
        assert t["output_tokens_per_joule"] == pytest.approx(runs[c]["summary"]["total_output_tokens"] / t["energy_j"])
    assert "- **other** `plain.json`: no telemetry: NVML is not installed" in tel

    # the server series per run: the hand-written polls' peaks and the preemptions counted during c=4
    srv = _section(md, "Server metrics")
    s4 = runs[4]["server_series"]
    assert _row(srv, "llmrs", "completions 32->10, c=4, rate=inf")[2:8] == [
        f"{s4['polls']:g}", "4.0", "4", "3", "50%", f"{s4['preemptions_delta']:g}"]
    assert s4["preemptions_delta"] >= 2
    assert "- **other** `plain.json`: no server metrics: the server's /metrics answered 404" in srv

    # the plots, and what the observed ones leave out
    plots = _section(md, "Plots")
    assert all(f"![{Path(p).stem}]({p})" in plots for p in OBSERVED_PLOTS)
    assert "- `telemetry.png` leaves out: **other** `plain.json`: NVML is not installed" in plots
    assert "- `server_series.png` leaves out: **other** `plain.json`: the server's /metrics answered 404" in plots
    assert all((report / p).stat().st_size > 10_000 for p in OBSERVED_PLOTS)


def _figures(benches):
    rows = load_rows([str(benches)])
    figs, missing = observed_figures(rows, ["llmrs", "other"], _run_label)
    return rows, figs, missing


def test_roofline_png_puts_each_graded_run_under_its_gpus_roof(benches):
    import matplotlib.pyplot as plt

    rows, figs, _ = _figures(benches)
    (ax,) = figs["roofline.png"].axes
    assert ax.get_title() == "Runs on the roofline of NVIDIA H100 SXM5 80GB (datasheet): % of ceiling"
    assert ax.get_xscale() == ax.get_yscale() == "log"
    roof, llmrs = ax.get_lines()[0], next(ln for ln in ax.get_lines() if ln.get_label() == "llmrs")
    assert roof.get_label() == "datasheet: 3,350 GB/s, 990 TFLOP/s bf16"
    assert not [ln for ln in ax.get_lines() if ln.get_label() == "other"]  # not graded: not on the chart
    graded = sorted((r for r in rows if r.label == "llmrs"), key=lambda r: r.concurrency)
    bw, peak = 3350e9, 989.5e12
    for r, x, y in zip(graded, llmrs.get_xdata(), llmrs.get_ydata()):
        g = r.roofline
        assert x == pytest.approx(g["decode_step_flops"] / g["decode_step_bytes"])
        # achieved decode FLOP/s: the run's steps per second (output tok/s over the batch) times a step's FLOPs
        achieved = g["output_tok_s"] / g["mean_decode_batch"] * g["decode_step_flops"]
        assert y * 1e12 == pytest.approx(achieved, rel=1e-9)
        assert y * 1e12 == pytest.approx(g["fraction_of_ideal"] * min(peak, bw * x), rel=1e-9)
    labels = sorted(t.get_text() for t in ax.texts if t.get_text().startswith("c="))
    assert labels == [f"c={r.concurrency}: {pct(r.roofline['fraction_of_ideal'])}" for r in graded]
    for fig in figs.values():
        plt.close(fig)


def test_telemetry_png_draws_power_and_clocks_beside_the_rebuilt_throughput(benches):
    import matplotlib.pyplot as plt

    rows, figs, missing = _figures(benches)
    fig = figs["telemetry.png"]
    power, clock, tput = fig.axes  # one results file with telemetry: one column of three panels
    assert power.get_title() == "llmrs (graded.json)"
    assert [ax.get_ylabel() for ax in fig.axes] == ["power (W)", "SM clock (MHz)", "output tok/s"]
    assert all(ax.get_ylim()[0] == 0 and ax.get_xlim()[0] == 0 for ax in fig.axes)
    assert tput.get_xlabel() == "seconds since the first run started"
    lines = {ln.get_label(): ln for ln in power.get_lines()}
    assert set(lines) == {"GPU 0", "GPU 1"}
    assert set(lines["GPU 0"].get_ydata()) == {300.0} and set(lines["GPU 1"].get_ydata()) == {400.0}
    assert {ln.get_label() for ln in clock.get_lines()} == {"GPU 0", "GPU 1", "GPU 1 slowed: sw_power_cap"}
    # the samples shown are the runs' own: from the first run's start to the last one's end
    graded = [r for r in rows if r.label == "llmrs"]
    origin = min(r.window["t0"] for r in graded)
    span = max(r.window["t1"] for r in graded) - origin
    assert all(0 <= x <= span for x in lines["GPU 0"].get_xdata())
    # every output token streamed is in the throughput line once: its bins times their width sum to the total
    (line,) = tput.get_lines()
    width = bin_width(span)
    assert line.get_label() == f"output tok/s ({width:g} s bins)"
    total = sum(r.s["total_output_tokens"] for r in graded)
    assert sum(line.get_ydata()) * width == pytest.approx(total)
    assert max(line.get_xdata()) <= span + width
    assert sorted(t.get_text() for t in power.texts) == ["c=1", "c=4"]  # each run's window named
    assert missing["telemetry.png"] == ["**other** `plain.json`: NVML is not installed (in the llmrs checkout: "
                                        "pip install -e '.[bench]', which brings nvidia-ml-py)"]
    for f in figs.values():
        plt.close(f)


def test_server_series_png_draws_running_waiting_and_kv_cache_over_time(benches):
    import matplotlib.pyplot as plt

    rows, figs, _ = _figures(benches)
    requests, kv = figs["server_series.png"].axes
    assert [ax.get_ylabel() for ax in (requests, kv)] == ["requests", "KV cache in use (%)"]
    assert requests.get_ylim()[0] == kv.get_ylim()[0] == 0
    series = {ln.get_label(): ln for ln in requests.get_lines()}
    assert set(series) == {"running", "waiting"}
    assert set(series["running"].get_ydata()) <= {0.0, 1.0, 4.0} and 4.0 in series["running"].get_ydata()
    assert max(series["waiting"].get_ydata()) == WAITING_AT[4]
    (kv_line,) = kv.get_lines()
    assert max(kv_line.get_ydata()) == pytest.approx(100 * 4 / 8)
    assert kv_line.get_label() == "KV cache in use (peak 50%)" and kv.get_ylim()[1] > 50
    # the same time axis as telemetry.png: seconds since the first run started
    origin = min(r.window["t0"] for r in rows if r.label == "llmrs")
    read = [p for p in read_rows(benches / "graded.metrics.csv") if p["t"] >= origin]
    assert list(series["running"].get_xdata())[0] == pytest.approx(read[0]["t"] - origin)
    for f in figs.values():
        plt.close(f)


def test_results_without_the_observed_sections_render_as_not_graded(tmp_path, benches):
    """A results file saved without `observers` or the runs' roofline, telemetry and series renders: its rows say
    "-", its sections say it was not graded and holds no series, and no observed PNG is drawn (one left in the
    folder by an earlier report is removed)."""
    _fake_results(tmp_path / "old.json", "vLLM", 1.0)
    out = tmp_path / "r"
    write_report([str(benches / "graded.json")], out)
    assert all((out / p).is_file() for p in OBSERVED_PLOTS)
    write_report([str(tmp_path / "old.json")], out)
    assert not any((out / p).exists() for p in OBSERVED_PLOTS)
    md = (out / REPORT_MD).read_text()
    assert _row(_section(md, "All runs"), "vLLM", "completions 256->128, c=16, rate=inf")[-3:-1] == ["-", "-"]
    assert ("- **vLLM** `old.json`: not graded: the results file holds no roofline grading (`llmrs bench` grades "
            "each run it makes)") in _section(md, "Roofline")
    assert "| engine | setting | out tok/s | ideal tok/s" not in md
    assert "no telemetry: the results file has no record of it (no `observers` section)" in md
    assert "no server metrics: the results file has no record of it (no `observers` section)" in md
    assert "- no `roofline.png`: no run is graded (the Roofline section says why)" in md


def test_a_series_csv_gone_from_beside_the_results_is_said_not_drawn(tmp_path, benches):
    for p in benches.iterdir():
        shutil.copy(p, tmp_path / p.name)
    (tmp_path / "graded.telemetry.csv").unlink()
    write_report([str(tmp_path / "graded.json")], tmp_path / "r")
    md = (tmp_path / "r" / REPORT_MD).read_text()
    assert not (tmp_path / "r" / "telemetry.png").exists() and (tmp_path / "r" / "server_series.png").is_file()
    assert "- no `telemetry.png`: **llmrs** `graded.json`: graded.telemetry.csv is not beside the results file" in md
    assert "| llmrs | completions 32->10, c=4, rate=inf | 2 | 700 |" in md  # the run summaries are in the JSON


def test_bin_width_gives_about_a_hundred_round_bins():
    assert [bin_width(s) for s in (3.0, 12.0, 45.0, 130.0, 900.0)] == [0.1, 0.2, 0.5, 2.0, 10.0]
    assert not math.isnan(bin_width(0.0))


def test_all_runs_show_the_queue_inclusive_ttft(benches, tmp_path):
    """The all-runs table carries each run's queue-inclusive TTFT median beside TTFT (`summary.queued_ttft_ms`)."""
    from llmrs.bench.report import write_report

    write_report([str(benches / "graded.json")], tmp_path)
    md = (tmp_path / "report.md").read_text()
    head = next(ln for ln in _section(md, "All runs").splitlines() if ln.startswith("| engine"))
    cols = [c.strip() for c in head.strip("|").split("|")]
    doc = json.loads((benches / "graded.json").read_text())
    for run in doc["runs"]:
        cells = _row(_section(md, "All runs"), "llmrs", f"completions 32->10, c={run['concurrency']}, rate=inf")
        assert cells[cols.index("queued TTFT p50")] == f"{run['summary']['queued_ttft_ms']['median']:,.1f}"
