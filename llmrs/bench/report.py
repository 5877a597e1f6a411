"""`llmrs report`: saved bench results -> report.md with side-by-side tables and ratios, plus PNG plots.

Each run of each results file is one row, keyed by engine label and setting (backend, input/output length, the
sampling asked for where not greedy, concurrency, request rate). The side-by-side table puts engines next to each
other per setting, the way the llm-rs posts do ("llm-rs / vLLM 35.5 / 27.0 tok/s"), with each engine's ratio to
the baseline (the first label or --baseline). File names are fixed (report.md, and the PNGs of plots.py: lines
against concurrency for sweeps, bars for single runs) and the text carries no timestamps of its own, so a
regenerated report diffs cleanly in git.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console

from llmrs.bench.client import OPTIONAL_SAMPLING
from llmrs.bench.console import share_of_core
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
    head = "| engine | setting | ok | failed | req/s | out tok/s | total tok/s | TTFT p50 | TTFT p99 | TPOT p50 | TPOT p99 | ITL p50 | E2E p50 | goodput | client CPU |"
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
            f"{_f(stat(s, 'tpot_ms', 'median'), 2)} | {_f(pct(s, 'tpot_ms', 'p99'), 2)} | "
            f"{_f(stat(s, 'itl_ms', 'median'), 2)} | {_f(stat(s, 'e2el_ms', 'median'))} | "
            f"{_f(stat(s, 'goodput'), 2)} | {share_of_core(r.client_busy)} |"
        )
    return lines


METRICS = (  # (title, key path, unit, higher is better)
    ("output throughput", ("output_throughput",), "tok/s", True),
    ("TTFT p50", ("ttft_ms", "median"), "ms", False),
    ("TPOT p50", ("tpot_ms", "median"), "ms", False),
    ("E2E p50", ("e2el_ms", "median"), "ms", False),
)


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
    head = ["setting"] + [f"{t} ({names})" for t, *_ in METRICS]
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


def render_markdown(rows: list[Row], labels: list[str], baseline: str, title: str, pngs: list[str], sources: list[str]) -> str:
    md = [f"# {title}", ""]
    md += ["Generated by `llmrs report` from: " + ", ".join(f"`{s}`" for s in sources) + ".", ""]
    md += [f"## Side by side (baseline: {baseline})", "",
           "Ratios are each engine against the baseline, oriented so that > 1.00x is better "
           "(more throughput, less latency).", ""]
    md += side_by_side(rows, labels, baseline) + [""]
    md += ["## All runs", "", "Latencies in ms; failed requests are excluded from latencies and listed with their reasons. "
           "`client CPU` is the busiest client worker's share of one core (near 100%: the client may be the bottleneck).", ""]
    ordered = sorted(rows, key=lambda r: (labels.index(r.label), r.sort_key()))
    md += runs_table(ordered) + [""]
    md += eager_lines(ordered)
    md += setup_lines(rows, labels)
    if pngs:
        md += ["## Plots", ""] + [f"![{Path(p).stem}]({p})" for p in pngs] + [""]
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
    pngs = write_plots(rows, labels, out)
    sources = sorted(dict.fromkeys(r.source for r in rows))
    try:
        md.write_text(render_markdown(rows, labels, baseline, title, pngs, sources))
    except OSError as e:
        raise UserError(f"cannot write {md}: {e.strerror or e}") from None
    console.print(f"report: {md} ({len(rows)} runs, {len(labels)} engines, {len(pngs)} plots)")
    return md
