"""`llmrs report`: saved bench results -> report.md with side-by-side tables and ratios, plus PNG plots.

Each run of each results file is one row, keyed by engine label and setting (backend, input/output length, the
sampling asked for where not greedy, concurrency, request rate). The side-by-side table puts engines next to each
other per setting, the way the llm-rs posts do ("llm-rs / vLLM 35.5 / 27.0 tok/s"), with each engine's ratio to
the baseline (the first label or --baseline). Where the results hold what watched the bench (llmrs.bench.observe),
each run's place under the roofline (% of the ideal tok/s at its batch and context, MBU), its GPU telemetry
(power, energy, output tokens per joule, slowdowns) and the server's /metrics series are tabled too, and what is
missing says why. File names are fixed (report.md, and the PNGs of plots.py: lines against concurrency for sweeps,
bars for single runs, the roofline and time series where there are data) and the text carries no timestamps of
its own, so a regenerated report diffs cleanly in git.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console

from llmrs.bench.client import OPTIONAL_SAMPLING
from llmrs.bench.console import share_of_core
from llmrs.bench.observe import pct as frac
from llmrs.bench.results import find_results, load_document, pct, stat
from llmrs.errors import UserError

REPORT_MD = "report.md"


@dataclass(slots=True)
class Row:
    """One run, flattened for tables and plots."""

    label: str
    source: str
    backend: str
    input_len: int
    output_len: int | None
    dataset: str | None
    concurrency: int | None
    rate: float
    s: dict  # the run's Summary as saved
    client_busy: float
    env: dict  # where its results file says it ran (setup_lines)
    sampling: str = ""  # what the requests asked of the sampler beyond greedy (`sampling_label`); "" greedy
    eager_shapes: int = 0  # an llmrs server's step shapes whose CUDA graph capture had failed (`eager_lines`)
    interrupted: bool = False  # the bench was interrupted during this run: it measured only what finished
    saturation: str = ""  # a sized run (no -n) whose server could not finish its concurrency's requests in time
    path: Path = Path()  # its results file
    observers: dict = field(default_factory=dict)  # the file's `observers` ({} in results written without them)
    window: dict | None = None  # {t0, t1}: perf_counter seconds of the run's requests (the series' clock)
    roofline: dict = field(default_factory=dict)  # grading.grade() of the run ({} where none was saved)
    telemetry: dict | None = None  # telemetry.summarize() of the run's window
    server_series: dict | None = None  # scrape.summarize() of the run's window
    csv_path: Path | None = None  # its per-request CSV

    @property
    def workload(self) -> str:
        src = Path(self.dataset).name if self.dataset else f"{self.input_len}->{self.output_len or 128}"
        return f"{self.backend} {src}" + (f" {self.sampling}" if self.sampling else "")

    @property
    def setting(self) -> str:
        c = self.concurrency if self.concurrency else "inf"
        r = "inf" if math.isinf(self.rate) else f"{self.rate:g}"
        return f"{self.workload}, c={c}, rate={r}"

    def sort_key(self) -> tuple:
        return (self.workload, self.concurrency or 10**9, self.rate)


def sampling_label(params: dict) -> str:
    """The sampling a results file's requests asked for ("t=0.8 top_p=0.9 top_k=50"), "" for greedy: runs that
    sample are another workload than greedy ones (the server's sampler works), never compared as the same."""
    parts = [f"t={params['temperature']:g}"] if params.get("temperature") else []
    parts += [f"{k}={params[k]:g}" for k in OPTIONAL_SAMPLING if params.get(k) is not None]
    return " ".join(parts)


def load_rows(paths: list[str]) -> list[Row]:
    """One Row per run of each results file. A run without a summary, or with a setting that is not one, is a
    UserError naming the file and the field; a statistic missing from a summary renders as "-"."""
    rows: list[Row] = []
    for p in find_results(paths):
        doc = load_document(p)
        prm = doc.get("params") if isinstance(doc.get("params"), dict) else {}
        runs = doc.get("runs") or []
        if not isinstance(runs, list):
            raise UserError(f"{p}: 'runs' is not a list")
        for i, run in enumerate(runs):
            where = f"{p}: runs[{i}]"
            if not isinstance(run, dict) or not isinstance(run.get("summary"), dict):
                raise UserError(f"{where} has no 'summary' (an object of the run's statistics)")
            rate = run.get("request_rate", "inf")
            try:
                rate = math.inf if rate == "inf" else float(rate)
            except (TypeError, ValueError):
                raise UserError(f"{where}: 'request_rate' {rate!r} is not a number or \"inf\"") from None
            conc = run.get("concurrency")
            if conc is not None and (isinstance(conc, bool) or not isinstance(conc, int)):
                raise UserError(f"{where}: 'concurrency' {conc!r} is not a whole number or null")
            cpu = run.get("client_cpu") if isinstance(run.get("client_cpu"), dict) else {}
            busy = [b for b in cpu.get("busy_per_worker") or [] if isinstance(b, int | float)]
            rows.append(Row(
                label=str(doc.get("label") or "server"), source=p.name, backend=prm.get("backend", "completions"),
                input_len=prm.get("input_len", 0), output_len=prm.get("output_len"), dataset=prm.get("dataset"),
                concurrency=conc, rate=rate, s=run["summary"], client_busy=max(busy or [0.0]),
                env={k: doc.get(k) for k in ("command", "server", "gpus", "client", "llmrs_version")},
                sampling=sampling_label(prm), eager_shapes=_count(run.get("server_graph_capture_failures")),
                interrupted=run.get("interrupted") is True, saturation=_saturation(run.get("sizing")),
                path=p, observers=_dict(doc.get("observers")), window=_window(run.get("window")),
                roofline=_dict(run.get("roofline")), telemetry=_dict(run.get("telemetry")) or None,
                server_series=_dict(run.get("server_series")) or None,
                csv_path=p.parent / run["csv"] if isinstance(run.get("csv"), str) and run["csv"] else None,
            ))
    if not rows:
        raise UserError("the results files hold no finished runs")
    return rows


def _saturation(sizing: object) -> str:
    """The caveat of a sized run (`llmrs bench` without -n) whose server saturated, "" otherwise."""
    if not isinstance(sizing, dict) or sizing.get("saturated") is not True:
        return ""
    c, n, target, tps = (sizing.get(k) for k in ("concurrency", "num_prompts", "target_s", "tokens_per_s"))
    if not all(isinstance(v, int | float) and not isinstance(v, bool) for v in (c, n, target, tps)):
        return ""
    return (f"the server saturated: at its probed {tps:,.0f} tokens/s it could not finish {c:g} requests in about "
            f"{target:g} s, so {n:g} were sent (at most {n:g} in flight).")


def _dict(v: object) -> dict:
    return v if isinstance(v, dict) else {}


def _window(v: object) -> dict | None:
    if isinstance(v, dict) and all(isinstance(v.get(k), int | float) for k in ("t0", "t1")):
        return {"t0": float(v["t0"]), "t1": float(v["t1"])}
    return None


def _count(v: object) -> int:
    return v if isinstance(v, int) and not isinstance(v, bool) and v > 0 else 0


def eager_lines(rows: list[Row]) -> list[str]:
    """A caveat per run whose llmrs server had step shapes running eagerly (failed CUDA graph captures, saved by
    `llmrs bench` as server_graph_capture_failures): its figures are not the server's graphed speed; per sized run
    whose server saturated (fewer requests than its concurrency were sent); and per run the bench was interrupted
    in (it measured only the requests that finished)."""
    lines = [f"- **{r.label}** `{r.source}` {r.setting}: the server ran {r.eager_shapes} step shape(s) eagerly (their "
             "CUDA graph capture failed; the server's log says why): not its graphed speed."
             for r in rows if r.eager_shapes]
    for r in rows:
        if r.saturation:
            lines.append(f"- **{r.label}** `{r.source}` {r.setting}: {r.saturation}")
        if r.interrupted:
            cut, unsent = stat(r.s, "cut_off"), stat(r.s, "not_sent")
            lines.append(f"- **{r.label}** `{r.source}` {r.setting}: interrupted; only the requests that finished "
                         f"are measured ({_n(cut)} cut off in flight, {_n(unsent)} never sent).")
    return ["## Caveats", ""] + lines + [""] if lines else []


def _f(v: float | None, nd: int = 1) -> str:
    return "-" if v is None else f"{v:,.{nd}f}"


def _n(v: float | None) -> str:
    return "-" if v is None else f"{v:g}"


def runs_table(rows: list[Row]) -> list[str]:
    head = ("| engine | setting | ok | failed | req/s | out tok/s | total tok/s | TTFT p50 | TTFT p99 | "
            "queued TTFT p50 | TPOT p50 | TPOT p99 | ITL p50 | E2E p50 | goodput | % of ideal | MBU | client CPU |")
    lines = [head, "|" + "|".join(["---"] * (head.count("|") - 1)) + "|"]
    for r in rows:
        s = r.s
        failures = s.get("failures") if isinstance(s.get("failures"), dict) else {}
        fails = ", ".join(f"{k}: {v}" for k, v in failures.items())
        lines.append(
            f"| {r.label} | {r.setting} | {_n(stat(s, 'completed'))} | {_n(stat(s, 'failed'))}"
            f"{f' ({fails})' if fails else ''} | {_f(stat(s, 'request_throughput'), 2)} | "
            f"{_f(stat(s, 'output_throughput'))} | {_f(stat(s, 'total_token_throughput'))} | "
            f"{_f(stat(s, 'ttft_ms', 'median'))} | {_f(pct(s, 'ttft_ms', 'p99'))} | "
            f"{_f(stat(s, 'queued_ttft_ms', 'median'))} | {_f(stat(s, 'tpot_ms', 'median'), 2)} | {_f(pct(s, 'tpot_ms', 'p99'), 2)} | "
            f"{_f(stat(s, 'itl_ms', 'median'), 2)} | {_f(stat(s, 'e2el_ms', 'median'))} | "
            f"{_f(stat(s, 'goodput'), 2)} | {frac(graded(r, 'fraction_of_ideal'))} | {frac(graded(r, 'mbu'))} | "
            f"{share_of_core(r.client_busy)} |"
        )
    return lines


def graded(r: Row, key: str) -> float | None:
    """A figure of the run's roofline grade; None where the run is not graded or the figure is not there."""
    return stat(r.roofline, key) if r.roofline.get("graded") is True else None


METRICS = (  # (title, key path, unit, higher is better)
    ("output throughput", ("output_throughput",), "tok/s", True),
    ("TTFT p50", ("ttft_ms", "median"), "ms", False),
    ("TPOT p50", ("tpot_ms", "median"), "ms", False),
    ("E2E p50", ("e2el_ms", "median"), "ms", False),
)


ROOF_COLUMNS = (("% of ideal", "fraction_of_ideal"), ("MBU", "mbu"))


def side_by_side(rows: list[Row], labels: list[str], baseline: str) -> list[str]:
    """Per setting: 'A / B value unit' and each engine's ratio to the baseline (x > 1: better than baseline)."""
    by: dict[str, dict[str, Row]] = {}
    order: list[Row] = []
    for r in sorted(rows, key=Row.sort_key):
        if r.setting not in by:
            order.append(r)
        by.setdefault(r.setting, {})[r.label] = r  # the last run of a label wins
    others = [lb for lb in labels if lb != baseline]
    names = " / ".join([baseline, *others])
    head = ["setting"] + [f"{t} ({names})" for t, *_ in METRICS] + [f"{t} ({names})" for t, _ in ROOF_COLUMNS]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join(["---"] * len(head)) + "|"]
    for first in order:
        cells = [first.setting]
        runs = by[first.setting]
        for _, path, unit, higher in METRICS:
            vals = [stat(runs[lb].s, *path) if lb in runs else None for lb in [baseline, *others]]
            txt = " / ".join(_f(v, 2 if unit == "ms" and v is not None and v < 100 else 1) for v in vals)
            base = vals[0]
            ratios = []
            for v in vals[1:]:
                if not base or not v:  # missing, or 0: no ratio
                    continue
                ratios.append(f"{v / base if higher else base / v:.2f}x")
            cells.append(f"{txt} {unit}" + (f" ({', '.join(ratios)})" if ratios else ""))
        for _, key in ROOF_COLUMNS:  # fractions of each engine's own ceiling: no ratio between them
            cells.append(" / ".join(frac(graded(runs[lb], key)) if lb in runs else "-" for lb in [baseline, *others]))
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def setup_lines(rows: list[Row], labels: list[str]) -> list[str]:
    """Per engine: the served model, the GPUs, the client machine and versions, and each results file's command
    (benchmarks say where they ran: a figure without its GPU and command is not evidence)."""
    md = ["## Where each ran", ""]
    for label in labels:
        by_source = {r.source: r.env for r in rows if r.label == label}
        envs = list(by_source.values())
        server = envs[0].get("server") or {}
        models = ", ".join(sorted({m.get("id", "?") for e in envs for m in (e.get("server") or {}).get("models") or []}))
        gpus = sorted({f"{g.get('name', '?')} ({g.get('memory_gib', '?')} GiB, driver {g.get('driver', '?')})"
                       for e in envs for g in e.get("gpus") or []})
        client = envs[0].get("client") or {}
        md += [f"**{label}**: model {models or server.get('model') or '?'}; server `{server.get('server_header', '?')}`"
               f"; GPU {', '.join(gpus) or 'not reported'}; client {client.get('cpu_count', '?')} CPUs, Python "
               f"{client.get('python', '?')}, llmrs {envs[0].get('llmrs_version', '?')}", ""]
        md += [f"- `{src}`: `{env.get('command') or '?'}`" for src, env in sorted(by_source.items())] + [""]
    return md


def _by_file(rows: list[Row], labels: list[str]) -> list[list[Row]]:
    """The runs of each results file, engines in report order."""
    files: dict[Path, list[Row]] = {}
    for r in sorted(rows, key=lambda r: labels.index(r.label)):
        files.setdefault(r.path, []).append(r)
    return list(files.values())


def _ceilings(g: dict) -> str:
    """'NVIDIA H100 SXM5 80GB (`h100-sxm`), datasheet ceilings 3,350 GB/s and 990 TFLOP/s bf16'."""
    gpu = g.get("gpu", "?")
    text = f"{g.get('gpu_name') or gpu} (`{gpu}`), {g.get('ceilings', 'datasheet')} ceilings"
    bw, peak = stat(g, "bandwidth_gbs"), stat(g, "peak_tflops")
    if bw is not None and peak is not None:
        text += f" {bw:,.0f} GB/s and {peak:,.0f} TFLOP/s {g.get('compute_dtype') or ''}".rstrip()
    return text


def roofline_lines(rows: list[Row], labels: list[str]) -> list[str]:
    """What each results file was graded against (or why not), then each graded run's place under the roofline."""
    md = ["## Roofline", "",
          "Each run against what its GPU allows at the run's own shape. `ideal` is the output tok/s of decode steps at "
          "the floor (a step of the run's mean decode batch at its mean context: its bytes over the bandwidth or its "
          "FLOPs over the peak, whichever is longer); `% of ideal` is the run's output tok/s over it. MBU: the bytes "
          "such a step reads, per mean TPOT, over the bandwidth. MFU: the FLOPs of the run's tokens per second over "
          "the peak (prefill: the prompts' share).", ""]
    ungraded: list[str] = []
    for rs in _by_file(rows, labels):
        r0 = rs[0]
        ctx = _dict(r0.observers.get("roofline"))
        first = next((r.roofline for r in rs if r.roofline.get("graded") is True), None)
        if ctx.get("graded") is True or first:
            g = first or ctx
            md.append(f"- **{r0.label}** `{r0.source}`: graded against {_ceilings(g)}; model {g.get('model') or '?'} "
                      f"({g.get('weight_format') or '?'}; from {g.get('model_source') or '?'}).")
            ungraded += [f"- **{r.label}** `{r.source}` {r.setting}: not graded: "
                         f"{r.roofline.get('why') or 'no grade saved'}." for r in rs if r.roofline.get("graded") is not True]
        else:
            why = ctx.get("why") or next((r.roofline.get("why") for r in rs if r.roofline.get("why")), None) or \
                "the results file holds no roofline grading (`llmrs bench` grades each run it makes)"
            md.append(f"- **{r0.label}** `{r0.source}`: not graded: {why}")
    md.append("")
    done = [r for r in sorted(rows, key=lambda r: (labels.index(r.label), r.sort_key())) if graded(r, "output_tok_s")
            is not None]
    if done:
        head = ("| engine | setting | out tok/s | ideal tok/s | % of ideal | MBU | MFU | MFU prefill | mean batch | "
                "mean context | decode floor (ms) | bound |")
        md += [head, "|" + "|".join(["---"] * (head.count("|") - 1)) + "|"]
        for r in done:
            md.append(f"| {r.label} | {r.setting} | {_f(graded(r, 'output_tok_s'))} | "
                      f"{_f(graded(r, 'ideal_output_tok_s'), 0)} | {frac(graded(r, 'fraction_of_ideal'))} | "
                      f"{frac(graded(r, 'mbu'))} | {frac(graded(r, 'mfu'))} | {frac(graded(r, 'mfu_prefill'))} | "
                      f"{_f(graded(r, 'mean_decode_batch'), 2)} | {_f(graded(r, 'mean_context'), 0)} | "
                      f"{_f(graded(r, 'decode_floor_ms'), 3)} | {r.roofline.get('decode_bound') or '-'} |")
        md.append("")
    return md + (ungraded + [""] if ungraded else [])


def _why_none(rs: list[Row], kind: str) -> str:
    """Why a results file's runs have no `kind` summary (telemetry, server_series), from its observers section."""
    obs = rs[0].observers.get(kind)
    if not isinstance(obs, dict):
        return "the results file has no record of it (no `observers` section)"
    if obs.get("why"):  # (a scraper that stopped has both: its file, and why it holds nothing)
        return obs["why"]
    return f"no sample of {obs['csv']} fell in its runs" if obs.get("csv") else "not recorded"


def _every(rows: list[Row], kind: str) -> str:
    """' every 0.1 s' where the results files that sampled `kind` agree on its interval, else ''."""
    found = {stat(r.observers, kind, "interval_s") for r in rows if _dict(r.observers.get(kind)).get("csv")} - {None}
    return f" every {found.pop():g} s" if len(found) == 1 else ""


def turn_lines(rows: list[Row]) -> list[str]:
    """Multi-turn runs: each turn's TTFT (and queue-inclusive TTFT) median, where a server's prefix cache shows as
    later turns answering sooner although their prompts (the conversation so far) grow."""
    runs = [r for r in rows if isinstance(r.s.get("per_turn"), list) and r.s["per_turn"]]
    if not runs:
        return []
    md = ["## Multi-turn: TTFT per turn", "",
          "Medians over the completed turns of each index; each turn's prompt is the conversation so far.", "",
          "| engine | setting | turn | completed | mean prompt tokens | TTFT p50 | queued TTFT p50 |",
          "|---|---|---|---|---|---|---|"]
    for r in runs:
        for t in r.s["per_turn"]:
            if not isinstance(t, dict):
                continue
            md.append(f"| {r.label} | {r.setting} | {_n(stat(t, 'turn'))} | {_n(stat(t, 'completed'))} | "
                      f"{_f(stat(t, 'prompt_tokens_mean'), 0)} | {_f(stat(t, 'ttft_ms', 'median'))} | "
                      f"{_f(stat(t, 'queued_ttft_ms', 'median'))} |")
    return md + [""]


def _series_section(rows: list[Row], labels: list[str], kind: str, intro: list[str], head: str, what: str,
                    cells) -> list[str]:
    """A section of one per-run summary (`kind`: telemetry, server_series): `intro`, a table row per run that has
    the summary (`cells(summary)`: the cells after engine and setting), then a line per results file without one
    saying why."""
    md = list(intro)
    files = _by_file(rows, labels)
    seen = [r for rs in files for r in sorted(rs, key=Row.sort_key) if getattr(r, kind)]
    if seen:
        md += [head, "|" + "|".join(["---"] * (head.count("|") - 1)) + "|"]
        md += [f"| {r.label} | {r.setting} | {' | '.join(cells(getattr(r, kind)))} |" for r in seen]
        md.append("")
    why = [f"- **{rs[0].label}** `{rs[0].source}`: no {what}: {_why_none(rs, kind)}"
           for rs in files if not any(getattr(r, kind) for r in rs)]
    return md + (why + [""] if why else [])


def telemetry_lines(rows: list[Row], labels: list[str]) -> list[str]:
    def cells(t: dict) -> list[str]:
        util = stat(t, "mean_util_gpu_pct")
        slow = t.get("throttle_reasons") if isinstance(t.get("throttle_reasons"), list) else []
        return [_n(stat(t, "gpus")), _f(stat(t, "mean_power_w"), 0), _f(stat(t, "peak_power_w"), 0),
                _f(stat(t, "energy_j"), 0), _f(stat(t, "output_tokens_per_joule"), 2), _f(stat(t, "mean_sm_mhz"), 0),
                "-" if util is None else f"{util:.0f}%", ", ".join(map(str, slow)) or "none"]

    intro = ["## GPU telemetry", "",
             f"NVML sampled{_every(rows, 'telemetry')} during the runs (the time series is the `.telemetry.csv` "
             "beside the results). Power is summed over the GPUs; energy is the driver's energy counter over the run "
             "(else power integrated over time); output tok/J = the run's output tokens / that energy; slowdowns "
             "are the clock-event reasons seen, idle left out.", ""]
    head = ("| engine | setting | GPUs | mean power (W) | peak power (W) | energy (J) | output tok/J | "
            "SM clock mean (MHz) | GPU util mean | slowdowns |")
    return _series_section(rows, labels, "telemetry", intro, head, "telemetry", cells)


def server_lines(rows: list[Row], labels: list[str]) -> list[str]:
    def cells(v: dict) -> list[str]:
        q, h = stat(v, "prefix_queries_delta"), stat(v, "prefix_hits_delta")
        hits = f"{frac(h / q)} of {q:,.0f} tokens" if q and h is not None else "-"
        return [_n(stat(v, "polls")), _f(stat(v, "mean_running")), _n(stat(v, "peak_running")),
                _n(stat(v, "peak_waiting")), frac(stat(v, "peak_kv_usage")), _n(stat(v, "preemptions_delta")), hits]

    intro = ["## Server metrics", "",
             f"The server's Prometheus /metrics polled{_every(rows, 'server_series')} during the runs "
             "(`--scrape-metrics`; the time series is the `.metrics.csv` beside the results): requests running and "
             "waiting, KV cache in use, and the counters' increase over each run.", ""]
    head = ("| engine | setting | polls | running mean | running peak | waiting peak | KV cache peak | "
            "preemptions | prefix-cache hits |")
    return _series_section(rows, labels, "server_series", intro, head, "server metrics", cells)


def plot_lines(pngs: list[str], missing: dict[str, list[str]]) -> list[str]:
    """The plots, then what the roofline and time-series plots leave out (or why they are not drawn)."""
    md = ["## Plots", ""] + [f"![{Path(p).stem}]({p})" for p in pngs] + ([""] if pngs else [])
    notes = []
    for name, why in missing.items():
        if not why:
            continue
        head = f"`{name}` leaves out" if name in pngs else f"no `{name}`"
        notes += [f"- {head}: {why[0]}"] if len(why) == 1 else [f"- {head}:"] + [f"  - {w}" for w in why]
    return md + (notes + [""] if notes else [])


def render_markdown(rows: list[Row], labels: list[str], baseline: str, title: str, pngs: list[str], sources: list[str],
                    missing: dict[str, list[str]] | None = None) -> str:
    md = [f"# {title}", ""]
    md += ["Generated by `llmrs report` from: " + ", ".join(f"`{s}`" for s in sources) + ".", ""]
    md += [f"## Side by side (baseline: {baseline})", "",
           "Ratios are each engine against the baseline, oriented so that > 1.00x is better "
           "(more throughput, less latency).", ""]
    md += side_by_side(rows, labels, baseline) + [""]
    md += ["## All runs", "", "Latencies in ms (queued TTFT: from the request's scheduled send, its wait for a free "
           "--concurrency slot included); failed requests are excluded from latencies and listed with their reasons. "
           "`client CPU` is the busiest client worker's share of one core (near 100%: the client may be the bottleneck).", ""]
    ordered = sorted(rows, key=lambda r: (labels.index(r.label), r.sort_key()))
    md += runs_table(ordered) + [""]
    md += eager_lines(ordered)
    md += turn_lines(ordered)
    md += setup_lines(rows, labels)
    md += roofline_lines(rows, labels)
    md += telemetry_lines(rows, labels)
    md += server_lines(rows, labels)
    if pngs or any((missing or {}).values()):
        md += plot_lines(pngs, missing or {})
    return "\n".join(md)


def write_report(paths: list[str], out: Path, *, baseline: str | None = None, title: str = "llmrs benchmark report", console: Console | None = None) -> Path:
    """Writes OUT/report.md and the PNGs; returns the markdown path."""
    from llmrs.bench.plots import write_plots

    console = console or Console()
    rows = load_rows(paths)
    labels = list(dict.fromkeys(r.label for r in rows))
    if baseline is not None and baseline not in labels:
        raise UserError(f"--baseline {baseline!r} is not among the labels: {', '.join(labels)}")
    baseline = baseline or labels[0]
    labels = [baseline] + [lb for lb in labels if lb != baseline]
    md = out / REPORT_MD
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UserError(f"cannot write the report into {out}: {e.strerror or e}") from None
    pngs, missing = write_plots(rows, labels, out)
    sources = sorted(dict.fromkeys(r.source for r in rows))
    try:
        md.write_text(render_markdown(rows, labels, baseline, title, pngs, sources, missing))
    except OSError as e:
        raise UserError(f"cannot write {md}: {e.strerror or e}") from None
    console.print(f"report: {md} ({len(rows)} runs, {len(labels)} engines, {len(pngs)} plots)")
    return md
