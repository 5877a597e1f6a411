"""One `llmrs bench` invocation: server (given, or started and stopped), workload, each sweep point, results.

    server  = --url, else start --server-cmd, else start `llmrs serve [--model]`  (server.py)
    prompts = built per sweep point (dataset.py, with the server's tokenizer when it has one)
    for each sweep point: [no -n: a probe sizes the run, sizing.py] -> arrivals -> run_load over worker processes
                          -> summarize -> save JSON + CSV -> table
An interrupt (Ctrl-C, SIGTERM, SIGHUP: interrupts.py) during a run stops sending, saves what finished (the run and
the results file marked interrupted) and ends the sweep; run_bench then raises Interrupted, whose exit code is
128 + the signal's. The started server is always stopped (server.py), on every way out.
Traffic shapes: a load (arrivals from --request-rate, the default); a trace replay (a --dataset trace: each request
at its row's timestamp / --trace-speed, the trace decides the count: no probe); multi-turn conversations (turn by
turn, each after the previous answer + --think-time, with the history in front; -n and --concurrency count
conversations). The mode is in the console, each run's `mode` and the results' `params`.
A server that cannot be reached, or a --model its /v1/models does not list, stops the bench before any request;
a run in which every request failed ends the sweep, keeps its results, and is a UserError naming the failures.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import re
import signal
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path

import httpx
from rich.console import Console

import llmrs
from llmrs.bench import console as out
from llmrs.bench import sizing
from llmrs.bench.arrivals import arrival_offsets
from llmrs.bench.client import OPTIONAL_SAMPLING, ClientConfig
from llmrs.bench.dataset import WorkloadConfig, build_trace, build_workload, is_trace
from llmrs.bench.interrupts import Interrupted, Interrupts, signal_name
from llmrs.bench.metrics import Summary, output_tokens, summarize
from llmrs.bench.observe import Observers, grade_context
from llmrs.bench.observe import lines as observer_lines
from llmrs.bench.records import RequestResult, RequestSpec
from llmrs.bench.results import SCHEMA, requests_frame, run_tag, write_json
from llmrs.bench.runner import RunOutcome, run_load
from llmrs.bench.server import ManagedServer, llmrs_serve_argv
from llmrs.bench.sysinfo import (client_host, gpu_info, graph_capture_failures, prefix_cache_delta, prefix_cache_from,
                                  prefix_cache_notes, server_identity, server_metrics)
from llmrs.bench.tokenization import Tokenizer, choose_tokenizer
from llmrs.bench.worker import client_kind
from llmrs.errors import UserError

SWEEP_KEYS = {"concurrency": "concurrency", "request_rate": "request_rate", "request-rate": "request_rate", "rate": "request_rate"}


@dataclass(slots=True)
class BenchOptions:
    """Every knob of `llmrs bench` (the CLI fills it; tests build it directly)."""

    workload: WorkloadConfig = field(default_factory=WorkloadConfig)
    url: str | None = None
    server_cmd: str | None = None
    server_timeout: float = 600.0
    model: str | None = None
    concurrency: int | None = 16
    request_rate: float = math.inf
    burstiness: float = 1.0
    sweep: tuple[str, list[float]] | None = None
    warmup: int = 0
    timeout: float = 600.0
    api_key: str | None = None
    label: str | None = None
    workers: int = 1
    slo: dict[str, float] = field(default_factory=dict)
    percentiles: tuple[float, ...] = (50, 90, 99)
    tokenizer: str | None = None  # --tokenizer: tokenizer.json, HF directory, .gguf or embedded model name
    model_config: str | None = None  # --model-config: the served model (its tokenizer, when the server has none)
    ignore_eos: bool = False
    temperature: float = 0.0
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    endpoint: str = ""
    out_dir: Path = Path("bench-results")
    name: str | None = None
    command: str = ""
    serve_args: tuple[str, ...] = ()  # more `llmrs serve` options for the server this bench starts itself
    # -n not given: a probe before each run sizes it to about `duration` seconds on the server measured (sizing.py);
    # given, workload.num_prompts is the count of every run, and a warning says which runs can never fill their cap
    auto_num_prompts: bool = False
    duration: float = sizing.DEFAULT_DURATION_S  # --duration: the seconds a sized run aims at
    gpu: str | None = None  # --gpu: the GPU runs are graded against (default: the one NVML sees here)
    use_measured: bool = False  # --use-measured: `llmrs roofline --measure`'s stored ceilings, not the datasheet's
    telemetry: bool = True  # --telemetry/--no-telemetry: NVML sampled during the runs where there is a GPU
    scrape_metrics: bool | None = None  # --scrape-metrics: None = on for llmrs and vLLM servers
    nvml_module: str = "pynvml"  # the NVML the telemetry sampler imports (tests name a stand-in)
    verbose: bool = False  # also the usage cross-check with the re-tokenized text, and each run's server counters
    trace_speed: float = 1.0  # --trace-speed: a trace replay runs this many times as fast as its timestamps
    think_time: float = 0.0  # --think-time: a conversation's next turn is sent this long after the previous answer


TRACE, MULTI_TURN, LOAD = "trace replay", "multi-turn", "load"


def mode(o: BenchOptions) -> str:
    """The traffic shape: TRACE (the --dataset is a trace), MULTI_TURN (workload.multi_turn), else LOAD."""
    if o.workload.multi_turn:
        return MULTI_TURN
    return TRACE if is_trace(o.workload.dataset) else LOAD


def check_mode(o: BenchOptions) -> None:
    """The options that do not go with the run's traffic shape, as a UserError."""
    m = mode(o)
    if not (o.trace_speed > 0 and math.isfinite(o.trace_speed)):
        raise UserError(f"--trace-speed must be a positive number (got {o.trace_speed:g})")
    if not (o.think_time >= 0 and math.isfinite(o.think_time)):
        raise UserError(f"--think-time must be a number of seconds >= 0 (got {o.think_time:g})")
    if m == TRACE:
        if math.isfinite(o.request_rate) or (o.sweep and o.sweep[0] == "request_rate"):
            raise UserError("--request-rate does not apply to a trace replay: each request is sent at its row's "
                            "timestamp (--trace-speed compresses time)")
    elif o.trace_speed != 1:
        raise UserError("--trace-speed applies to a trace replay (a --dataset .jsonl whose rows have 'timestamp')")
    if m == MULTI_TURN:
        if is_trace(o.workload.dataset):
            raise UserError("a trace replay is not multi-turn: give --multi-turn a ShareGPT --dataset (or none)")
        if not o.workload.dataset and not o.workload.turns:
            raise UserError("--multi-turn without a --dataset replays random conversations: give --turns N")
    elif o.think_time:
        raise UserError("--think-time applies to multi-turn conversations (--multi-turn or --turns N)")


def parse_sweep(text: str | None) -> tuple[str, list[float]] | None:
    """'concurrency=1,16,64' or 'request_rate=1,4,inf' -> (key, values)."""
    if not text:
        return None
    k, sep, vals = text.partition("=")
    key = SWEEP_KEYS.get(k.strip().lower())
    if not sep or key is None:
        raise UserError(f"--sweep {text!r}: expected concurrency=A,B,... or request_rate=A,B,...")
    try:
        values = [float(v) for v in vals.split(",") if v.strip()]
    except ValueError as e:
        raise UserError(f"--sweep {text!r}: values must be numbers (or inf for request_rate)") from e
    if not values or any(not v > 0 for v in values):  # NaN too
        raise UserError(f"--sweep {text!r}: values must be > 0")
    if key == "concurrency" and any(math.isinf(v) or v != int(v) for v in values):
        raise UserError(f"--sweep {text!r}: concurrency values must be whole numbers")
    return key, values


def sweep_points(o: BenchOptions) -> list[tuple[int | None, float]]:
    """(concurrency, request_rate) of each run."""
    if o.sweep is None:
        return [(o.concurrency, o.request_rate)]
    key, values = o.sweep
    if key == "concurrency":
        return [(int(v), o.request_rate) for v in values]
    return [(o.concurrency, v) for v in values]


def _slug(s: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", s).strip("-") or "server"


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


@contextlib.contextmanager
def server_context(o: BenchOptions, console: Console):
    """Yields (base_url, server metadata). Starts and always stops the server when this bench owns it."""
    if o.url and not o.server_cmd:
        yield o.url.rstrip("/"), {"managed": False}
        return
    cmd = o.server_cmd or llmrs_serve_argv(o.model, o.serve_args)
    log = o.out_dir / f"{o.name or 'server'}.server.log"
    srv = ManagedServer.from_command(cmd, log, o.server_timeout)
    if o.url:
        srv.url = o.url.rstrip("/")
    console.print(f"starting server: [cyan]{srv.command}[/] (log: {log})")
    if console.is_terminal:
        status = console.status(f"waiting for {srv.url}/health")
        srv.on_wait, srv.note_every_s = (lambda t: status.update(f"waiting for {srv.url}/health: {t:.0f}s")), 1.0
    else:
        status = contextlib.nullcontext()
        srv.on_wait = lambda t: console.print(f"waiting for {srv.url}/health: {t:.0f}s (log: {log})")
    with status:
        srv.start()
    try:
        console.print(f"server ready at {srv.url} after {srv.started_s:.1f}s")
        yield srv.url, {"managed": True, "command": srv.command, "startup_s": round(srv.started_s, 2), "log": str(log)}
    finally:
        try:
            console.print("stopping the server...")
        finally:
            srv.stop()
        console.print("server stopped")


async def _prepare(o: BenchOptions, base_url: str, model: str) -> tuple[list[RequestSpec], Tokenizer | None, str]:
    """The first run's prompts (a sized bench: one, which checks the workload before any probe), the tokenizer and
    where it comes from."""
    n = 1 if o.auto_num_prompts else o.workload.num_prompts
    async with httpx.AsyncClient(timeout=60.0, trust_env=False) as c:
        choice = await choose_tokenizer(base_url, model, c, o.tokenizer, model_config=o.model_config)
        specs = await _build(o, replace(o.workload, num_prompts=n), choice.tokenizer)
    return specs, choice.tokenizer, choice.source


def point_seed(o: BenchOptions, i: int) -> int:
    """The prompt seed of sweep point i (WARMUP_POINT: the warm-up requests). Random prompts are drawn afresh for
    every point and for the warm-up, so a server's prefix cache does not carry one point's prompts into the next:
    with one set, every point after the first found its prompts cached (an H200 serving a 7B, 256 concurrent:
    17.3-19.8k output tok/s behind a 64-concurrent point of the same prompts, 13.0k cold). Dataset prompts stay
    the same at every point (the workload's seed); a trace's random prompts (rows with input_len) are drawn afresh
    like random ones, its given prompts are the trace's."""
    return o.workload.seed if o.workload.dataset and mode(o) != TRACE else o.workload.seed + i


WARMUP_POINT = 1_000_003
PROBE_POINT = 2_000_003  # the probe of sweep point i draws its prompts with seed + PROBE_POINT + i


def probe_seed(o: BenchOptions, i: int) -> int:
    """The prompt seed of sweep point i's probe: never a run's (dataset prompts too are picked in another order), so
    the run's prompts are not in the server's prefix cache from the probe."""
    return o.workload.seed + PROBE_POINT + i


async def _build(o: BenchOptions, wl: WorkloadConfig, tok: Tokenizer | None) -> list[RequestSpec]:
    """The requests of workload `wl`: a trace's every row (with -n: its first n), else build_workload's."""
    if mode(o) == TRACE:
        specs = await build_trace(wl, tok)
        return specs if o.auto_num_prompts else specs[:wl.num_prompts]
    return await build_workload(wl, tok)


@contextlib.asynccontextmanager
async def _live_tokenizer(tok: Tokenizer | None, base_url: str, model: str) -> AsyncIterator[Tokenizer | None]:
    """`tok`, usable inside the block: a server tokenizer gets a fresh client (the one it was made with closed)."""
    from llmrs.bench.tokenization import ServerTokenizer

    async with httpx.AsyncClient(timeout=60.0, trust_env=False) as c:
        yield tok.with_client(c) if isinstance(tok, ServerTokenizer) else tok


def _few_prompts_warning(o: BenchOptions) -> str | None:
    """The warning for a given -n below a run's concurrency cap (that many slots can never be used), else None."""
    n = o.workload.num_prompts
    caps = sorted({cap for cap, _ in sweep_points(o) if cap and cap > n})
    if o.auto_num_prompts or not caps or mode(o) == TRACE:
        return None
    which = f"--concurrency {caps[0]}" if len(caps) == 1 else "concurrency " + ", ".join(map(str, caps))
    return (f"warning: -n {n} is less than {which}: at most {n} requests are ever in flight; "
            f"give -n {caps[-1]} or more to fill every slot")


async def _point_specs(o: BenchOptions, i: int, n: int, first: list[RequestSpec], tok: Tokenizer | None,
                       base_url: str, model: str) -> list[RequestSpec]:
    """The n prompts of sweep point i (`first`, the prompts already built, where they are the same)."""
    seed = point_seed(o, i)
    if seed == o.workload.seed and (n == len(first) or mode(o) == TRACE):
        return first
    async with _live_tokenizer(tok, base_url, model) as live:
        return await _build(o, replace(o.workload, seed=seed, num_prompts=n), live)


async def _text_tokens(tok: Tokenizer, base_url: str, model: str, results: list[RequestResult]) -> dict[int, int]:
    """Re-tokenized length of each completed request's text, for the usage cross-check."""
    async with _live_tokenizer(tok, base_url, model) as live:
        sem = asyncio.Semaphore(32)

        async def one(r: RequestResult, n_special: int) -> tuple[int, int]:
            async with sem:
                return r.idx, len(await live.encode(r.text)) - n_special

        try:  # the cross-check is best effort: a server gone by now must not lose the results
            n_special = len(await live.encode(""))
            return dict(await asyncio.gather(*(one(r, n_special) for r in results if r.success and r.text)))
        except (httpx.HTTPError, KeyError, ValueError):
            return {}


def _client_cpu(outcome: RunOutcome, main_cpu_s: float) -> dict:
    busy = [round(c.busy, 3) for c in outcome.cpu]
    return {
        "workers": len(outcome.cpu),
        "cpu_s": round(sum(c.cpu_s for c in outcome.cpu), 3),
        "busy_per_worker": busy,
        "main_cpu_s": round(main_cpu_s, 3),
        "saturated": any(b > out.SATURATED for b in busy),
    }


def send_offsets(o: BenchOptions, specs: list[RequestSpec], rate: float, seed: int) -> list[float]:
    """Each request's send offset (s after the start): a trace's timestamp / --trace-speed; else the gamma arrivals
    at `rate`, one per request or, multi-turn, one per conversation (its later turns follow its answers)."""
    if mode(o) == TRACE:
        return [s.at / o.trace_speed for s in specs]
    if mode(o) != MULTI_TURN:
        return arrival_offsets(len(specs), rate, o.burstiness, seed).tolist()
    convs = list(dict.fromkeys(s.conversation for s in specs))
    starts = dict(zip(convs, arrival_offsets(len(convs), rate, o.burstiness, seed).tolist(), strict=True))
    return [starts[s.conversation] for s in specs]


def tag_of(o: BenchOptions, cap: int | None, rate: float) -> str:
    return run_tag(cap, rate, o.trace_speed if mode(o) == TRACE else None)


def run_one(o: BenchOptions, cfg: ClientConfig, specs: list[RequestSpec], cap: int | None, rate: float,
            console: Console, intr: Interrupts | None = None) -> tuple[RunOutcome, dict]:
    """One sweep point with a live progress bar; returns the merged outcome and the client's CPU use."""
    offsets = send_offsets(o, specs, rate, o.workload.seed)
    cpu0 = time.process_time()
    with out.RunProgress(console, tag_of(o, cap, rate), len(specs)) as progress:
        outcome = run_load(specs, offsets, cfg, cap=cap, workers=o.workers, on_progress=progress.update,
                           interrupted=intr.pending if intr else None, think_time=o.think_time)
    return outcome, _client_cpu(outcome, time.process_time() - cpu0)


def run_bench(o: BenchOptions, console: Console | None = None) -> Path:
    """Runs every sweep point and returns the results JSON path (rewritten after each run). An interrupt (SIGINT,
    SIGTERM, SIGHUP) ends it with Interrupted (`.path`: the results saved so far, `.exit_code`)."""
    console = console or Console()
    if o.workers < 1:
        raise UserError("--workers must be >= 1")
    if o.concurrency is not None and o.concurrency < 1:
        raise UserError("--concurrency must be >= 1")
    if o.warmup < 0:
        raise UserError(f"--warmup must be >= 0 (got {o.warmup})")
    if not (o.timeout > 0 and math.isfinite(o.timeout)):
        raise UserError(f"--timeout must be a positive number of seconds (got {o.timeout:g})")
    if not (o.duration > 0 and math.isfinite(o.duration)):
        raise UserError(f"--duration must be a positive number of seconds (got {o.duration:g})")
    check_mode(o)
    o = replace(o, name=o.name or f"{_slug(o.label or 'bench')}-{datetime.now().strftime('%Y%m%d-%H%M%S')}")
    with Interrupts(console) as intr:
        return _run_bench(o, console, intr)


def _run_bench(o: BenchOptions, console: Console, intr: Interrupts) -> Path:
    started = _now()
    empty: list[tuple[str, Summary]] = []  # runs in which every request failed
    path = o.out_dir / f"{o.name}.json"
    doc: dict | None = None
    obs: Observers | None = None
    with server_context(o, console) as (base_url, meta):
        try:
            ident = server_identity(base_url, o.api_key)
            if "unreachable" in ident:
                raise UserError(f"cannot reach {base_url}: {ident['unreachable']}")
            models = ident.get("models") or []
            model = o.model if (o.model and (o.url or o.server_cmd)) else (models[0]["id"] if models else o.model)
            if not model:
                raise UserError(f"no --model given and {base_url} names none (/v1/models: "
                                f"{ident.get('models_error', 'empty')}; no TGI /info or llama-server /props either)")
            if ident.get("engine") != "tgi":  # TGI's OpenAI routes take any model name
                _check_served(model, models, base_url)
            engine = ident.get("engine")
            label = o.label or (engine if engine and engine != "unknown" else None) or \
                (models[0].get("owned_by") if models else None) or "server"
            cfg = ClientConfig(base_url, model, o.workload.backend, o.endpoint, o.api_key, o.timeout, o.ignore_eos,
                               o.temperature, o.top_p, o.top_k, o.min_p)
            with console.status("building prompts..."):
                specs, tok, tok_source = intr.run(_prepare(o, base_url, model))
            source = 'dataset ' + o.workload.dataset if o.workload.dataset else 'random tokens'
            if mode(o) == TRACE:
                console.print(_trace_line(o, specs, tok_source), highlight=False)
            elif mode(o) == MULTI_TURN and not o.auto_num_prompts:
                console.print(_conversations_line(o, specs, source, tok_source), highlight=False)
            elif o.auto_num_prompts:
                console.print(f"prompts: {source} (tokenizer: {tok_source}); each run's count sized by a probe to "
                              f"about {o.duration:g} s")
            else:
                console.print(f"{len(specs)} prompts ({source}; tokenizer: {tok_source})")
            if mode(o) == MULTI_TURN and o.auto_num_prompts:
                console.print("multi-turn conversations (chat), each turn after the previous answer"
                              + (f" + {o.think_time:g} s think time" if o.think_time else "")
                              + "; -n and --concurrency count conversations", highlight=False)
            if warning := _few_prompts_warning(o):
                console.print(f"[yellow]{warning}")
            doc = {
                "schema": SCHEMA,
                "llmrs_version": llmrs.__version__,
                "label": label,
                "command": o.command or " ".join(sys.argv),
                "started_at": started,
                "finished_at": None,
                "interrupted": None,  # the signal that ended the bench early ("SIGTERM"), else null
                "server": {**ident, **meta, "model": model},
                "tokenizer": tok_source,
                "gpus": gpu_info(),
                "client": {**client_host(), "workers": o.workers, "http_client": client_kind(base_url)},
                "params": _params(o),
                "runs": [],
            }
            grade = grade_context(o.model_config, o.gpu, o.use_measured, model, models, doc["gpus"])
            obs = Observers.start(grade, o.out_dir, o.name, base_url, engine, o.telemetry, o.scrape_metrics,
                                  o.api_key, o.nvml_module)
            doc["observers"] = obs.doc()
            if _synthetic(model, models):
                doc["usage_check"] = ("skipped: the server's weights are random (synthetic), and random tokens do "
                                      "not round-trip through a tokenizer")
            for line in _observer_notes(doc["observers"]):
                console.print(f"[dim]{line}", highlight=False)
            write_json(path, doc)
            if o.warmup:
                n_warm = max(1, o.warmup) if o.auto_num_prompts else len(specs)
                warm_specs = intr.run(_point_specs(o, WARMUP_POINT, n_warm, specs, tok, base_url, model))
                warm = [replace(warm_specs[i % len(warm_specs)], idx=i, conversation=-1, turn=0, at=0.0)
                        for i in range(o.warmup)]
                console.print(f"warmup: {o.warmup} requests")
                with intr.deferred():
                    res = run_load(warm, [0.0] * len(warm), cfg, cap=o.concurrency, workers=o.workers,
                                   interrupted=intr.pending).results
                if intr.signum:
                    raise Interrupted(intr.signum)
                if bad := [r for r in res if not r.success]:
                    console.print(f"[yellow]warmup: {len(bad)} of {len(res)} failed (first: {bad[0].error})")
            rows: list[tuple[str, Summary]] = []
            for point, (cap, rate) in enumerate(sweep_points(o)):
                tag = tag_of(o, cap, rate)
                sized = None
                if o.auto_num_prompts and mode(o) != TRACE:  # (a trace decides its own count)
                    sized, per_unit = _probe(o, cfg, point, cap, rate, tok, base_url, model, console, intr)
                    if sized is None:  # interrupted: nothing of this point was measured
                        doc["finished_at"], doc["interrupted"] = _now(), signal_name(intr.signum)
                        write_json(path, doc)
                        break
                    sized.drain_s = _drain(o, base_url, console, intr)
                    if intr.signum:  # interrupted while the server let go of the probe's requests
                        doc["finished_at"], doc["interrupted"] = _now(), signal_name(intr.signum)
                        write_json(path, doc)
                        break
                    console.print(sized.line(), highlight=False)
                n = o.workload.num_prompts
                if sized:  # multi-turn: the requests sized, as conversations of the probe's mean length
                    n = max(1, round(sized.num_prompts / per_unit))
                    if mode(o) == MULTI_TURN:
                        console.print(f"multi-turn: {per_unit:.1f} turns a conversation in the probe: sending {n:,} "
                                      f"conversation{'s' if n != 1 else ''}", highlight=False)
                point_specs = intr.run(_point_specs(o, point, n, specs, tok, base_url, model))
                with intr.deferred():  # the run and the saving of its results: an interrupt stops them, in order
                    s, csv = _run_point(o, cfg, point, point_specs, cap, rate, tok, base_url, model, label, doc,
                                        path, console, intr, sized, obs)
                rows.append((tag, s))
                if intr.signum:
                    break
                if s.completed == 0:
                    empty.append((csv, s))
                    console.print(f"[yellow]warning: every request of {tag} failed: no latency was measured "
                                  f"(the failed requests are in {o.out_dir / csv})")
                    break  # the next point would fail the same way
            if len(rows) > 1:
                console.print(out.sweep_table(rows))
        except BaseException as e:
            if doc is not None:  # what finished stays on disk, and says how the bench ended
                doc["finished_at"] = _now()
                if isinstance(e, KeyboardInterrupt):
                    doc["interrupted"] = signal_name(getattr(e, "signum", signal.SIGINT))
                else:
                    doc["error"] = f"{type(e).__name__}: {e}"
                with contextlib.suppress(UserError):
                    write_json(path, doc)
            if isinstance(e, KeyboardInterrupt) and not isinstance(e, Interrupted):
                raise Interrupted(signal.SIGINT, path if doc else None) from None
            if isinstance(e, Interrupted):
                e.path = path if doc else None
            raise
        finally:
            if obs is not None:
                obs.stop()
    console.print(f"results: {path}")
    if intr.signum:
        raise Interrupted(intr.signum, path)
    if empty:
        csv, s = empty[0]
        reasons = ", ".join(f"{k}: {v}" for k, v in s.failures.items()) or "no reason recorded"
        raise UserError(f"all {s.failed} requests failed ({reasons}); each failure is in {o.out_dir / csv}")
    return path


def _run_point(o: BenchOptions, cfg: ClientConfig, point: int, specs: list[RequestSpec], cap: int | None, rate: float,
               tok: Tokenizer | None, base_url: str, model: str, label: str, doc: dict, path: Path, console: Console,
               intr: Interrupts, sized: sizing.Sizing | None = None,
               obs: Observers | None = None) -> tuple[Summary, str]:
    """One sweep point: the run, its summary, its CSV, its entry in the results file, its table and notes."""
    tag = tag_of(o, cap, rate)
    metrics0 = server_metrics(base_url, o.api_key)
    outcome, cpu = run_one(o, cfg, specs, cap, rate, console, intr)
    if outcome.interrupted and not intr.signum:  # a KeyboardInterrupt the handlers did not see (not main thread)
        intr.signum = outcome.signum or signal.SIGINT
    metrics = server_metrics(base_url, o.api_key)
    cache = prefix_cache_delta(prefix_cache_from(metrics0), prefix_cache_from(metrics), _looked_up(outcome.results))
    cache_notes = prefix_cache_notes(cache)
    if mode(o) == MULTI_TURN:
        cache, cache_notes = _history_reuse(cache, outcome.results)
    eager = graph_capture_failures(metrics)  # (an llmrs server's; None from others)
    # the usage cross-check re-tokenizes every reply: an interrupted bench skips it and exits promptly
    # (skipped against random weights: their replies never round-trip, doc["usage_check"] says so)
    check = tok and not intr.signum and "usage_check" not in doc
    text_tokens = intr.run(_text_tokens(tok, base_url, model, outcome.results)) if check else {}
    s = summarize(outcome.results, outcome.t0, percentiles=o.percentiles, slo=o.slo, text_tokens=text_tokens)
    csv = f"{o.name}-{tag}.csv"
    try:
        requests_frame(outcome.results, outcome.t0, text_tokens).to_csv(o.out_dir / csv, index=False)
    except OSError as e:
        raise UserError(f"cannot write {o.out_dir / csv}: {e.strerror or e}") from None
    shown_rate = _trace_rate(o, specs) if mode(o) == TRACE else rate
    doc["runs"].append({
        "tag": tag, "mode": mode(o), "concurrency": cap,
        "request_rate": shown_rate if math.isfinite(shown_rate) else "inf",
        "burstiness": o.burstiness, "seed": point_seed(o, point), "num_prompts": len(specs),
        **_shape(o, specs),
        "interrupted": outcome.interrupted, "summary": s.to_dict(), "prefix_cache": cache,
        "server_graph_capture_failures": eager, "client_cpu": cpu, "csv": csv,
        "sizing": sized.to_dict() if sized else None,
    })
    sections = obs.run_sections(outcome.results, outcome.t0, s.duration_s, s.total_output_tokens) if obs else {}
    doc["runs"][-1].update(sections)
    if obs:
        doc["observers"] = obs.doc()
    doc["finished_at"] = _now()
    if intr.signum:
        doc["interrupted"] = signal_name(intr.signum)
    write_json(path, doc)
    title = f"{label} {tag}"
    if intr.signum:
        title += f" (interrupted by {signal_name(intr.signum)})"
    console.print(out.summary_table(title, s, cpu, o.verbose))
    for line in observer_lines(sections):
        console.print(line, highlight=False)
    if o.verbose and cache:
        console.print(f"server /metrics over the run ({cache['source']}): prefix-cache lookups "
                      f"{cache['query_tokens']:,} tokens, hits {cache['hit_tokens']:,}, preemptions "
                      f"{'-' if cache['preemptions'] is None else cache['preemptions']}")
    if cache and "history_tokens" in cache:
        console.print(f"multi-turn: the server's prefix cache found {cache['history_hit_tokens']:,} of the "
                      f"{cache['history_tokens']:,} history tokens the later turns sent again", highlight=False)
    for note in cache_notes:
        console.print(f"[yellow]{note}")
    if s.usage_miscount:
        console.print(f"[red]warning: the server's usage count cannot be right for {s.usage_miscount} request(s) "
                      "(more tokens than max_tokens, or fewer than the chunks streamed): its token counts, and the "
                      "throughput computed from them, are not trustworthy; the CSV has each request's counts")
    if eager:
        console.print(f"[yellow]warning: the server's CUDA graph capture failed for {eager} step shape(s), "
                      "which run eagerly and slower (the server's log says why): these figures are not its "
                      "graphed speed")
    if cpu["saturated"]:
        console.print(f"[yellow]warning: a client worker was busy {max(cpu['busy_per_worker']):.0%} of a core; the client may be the bottleneck: raise --workers")
    if sized and (note := sized.note()):
        console.print(f"[yellow]{note}", highlight=False)
    if intr.signum:
        console.print(f"[yellow]interrupted by {signal_name(intr.signum)}: saved the {s.completed + s.failed} "
                      f"requests that finished; {s.cut_off} in flight were cut off and {s.not_sent} never sent "
                      "(neither counts as failed)")
    return s, csv


def _drain(o: BenchOptions, base_url: str, console: Console, intr: Interrupts) -> float | None:
    """Waits for the server to let go of the probe's cut-off requests (sizing.wait_idle), so the run does not start
    behind them; says so when that takes more than a second."""
    said = []

    def busy(t: float, running: float, waiting: float) -> None:
        if t > 1.0 and not said:
            said.append(True)
            console.print(f"waiting for the server to drop the probe's requests ({running:.0f} running, "
                          f"{waiting:.0f} waiting)...", highlight=False)

    with intr.deferred():
        return sizing.wait_idle(base_url, o.api_key, on_wait=busy, stop=lambda: intr.signum is not None)


def _probe(o: BenchOptions, cfg: ClientConfig, point: int, cap: int | None, rate: float, tok: Tokenizer | None,
           base_url: str, model: str, console: Console, intr: Interrupts) -> tuple[sizing.Sizing | None, float]:
    """Sweep point `point`'s probe (sizing.py) and the run's size from it (None when an interrupt stopped it), with
    the requests one unit of the workload makes: 1, or multi-turn the probe's mean turns a conversation (the probe
    sends conversations; the sizing counts requests, each costing its prompt as sent: the history included)."""
    probe_s = sizing.probe_seconds(o.duration)
    k = sizing.probe_count(cap, rate, probe_s)
    seed = probe_seed(o, point)
    async def build() -> list[RequestSpec]:
        async with _live_tokenizer(tok, base_url, model) as live:
            return await _build(o, replace(o.workload, seed=seed, num_prompts=k), live)

    specs = intr.run(build())
    offsets = send_offsets(o, specs, rate, seed)
    what = f"-c {cap}" if cap else "no concurrency cap"
    what += f", --request-rate {rate:g}" if math.isfinite(rate) else ""
    with intr.deferred(), out.ProbeProgress(console, what, probe_s) as progress:
        stop = sizing.ProbeStop(len(specs), cap, probe_s, o.duration, intr.pending, progress.update)
        outcome = run_load(specs, offsets, cfg, cap=cap, workers=o.workers, on_progress=stop.progress,
                           interrupted=stop, think_time=o.think_time)
    if outcome.signum not in (None, sizing.PROBE_STOPPED) and not intr.signum:  # a KeyboardInterrupt run_load saw
        intr.signum = outcome.signum
    if intr.signum:
        return None, 1.0
    per_unit, shape = 1.0, specs
    if mode(o) == MULTI_TURN:
        per_unit = len(specs) / max(1, len({s.conversation for s in specs}))
        sent = [r for r in outcome.results if r.start]
        shape = [RequestSpec(r.idx, "", r.prompt_tokens if r.prompt_tokens is not None else r.input_len,
                             r.max_tokens) for r in sent] or specs
    return sizing.size_run(sizing.measure(outcome.results, outcome.t0), shape, o.duration, cap, rate), per_unit


def _trace_rate(o: BenchOptions, specs: list[RequestSpec]) -> float:
    """A trace replay's mean request rate as sent (requests over the replayed span; inf: all at one instant)."""
    span = (specs[-1].at - specs[0].at) / o.trace_speed if specs else 0.0
    return (len(specs) - 1) / span if span > 0 else math.inf


def _shape(o: BenchOptions, specs: list[RequestSpec]) -> dict:
    """A run's `trace` or `multi_turn` entry in the results (what was replayed), else nothing."""
    if mode(o) == TRACE:
        span = specs[-1].at if specs else 0.0
        return {"trace": {"file": o.workload.dataset, "speed": o.trace_speed, "requests": len(specs),
                          "span_s": span, "replayed_s": span / o.trace_speed,
                          "concurrency": "no cap" if not o.concurrency else o.concurrency}}
    if mode(o) == MULTI_TURN:
        n = len({s.conversation for s in specs})
        return {"multi_turn": {"conversations": n, "requests": len(specs),
                               "turns_mean": round(len(specs) / max(n, 1), 3),
                               "turns_max": max((s.turn for s in specs), default=-1) + 1,
                               "think_time_s": o.think_time}}
    return {}


def _trace_line(o: BenchOptions, specs: list[RequestSpec], tok_source: str) -> str:
    span = specs[-1].at if specs else 0.0
    cap = f"at most {o.concurrency} in flight" if o.concurrency else "no concurrency cap"
    speed = f" at {o.trace_speed:g}x speed: {span / o.trace_speed:,.1f} s" if o.trace_speed != 1 else ""
    return (f"trace replay of {o.workload.dataset}: {len(specs)} requests over {span:,.1f} s{speed}, each sent at its "
            f"timestamp ({cap}; tokenizer: {tok_source})")


def _conversations_line(o: BenchOptions, specs: list[RequestSpec], source: str, tok_source: str) -> str:
    n = len({s.conversation for s in specs})
    think = f" + {o.think_time:g} s think time" if o.think_time else ""
    cap = f"at most {o.concurrency} at once" if o.concurrency else "no cap"
    return (f"multi-turn: {n} conversations, {len(specs)} turns ({source}; tokenizer: {tok_source}), chat, each turn "
            f"after the previous answer{think} with the history so far ({cap})")


def _history_reuse(cache: dict | None, results: list[RequestResult]) -> tuple[dict | None, list[str]]:
    """A multi-turn run's prefix-cache delta and notes: each later turn sends its conversation's history again
    (the previous turn's prompt and answer), and hits on it are the reuse the run measures, not contamination:
    `history_tokens` counts them, `history_hit_tokens` the hits within them; the notes speak of the rest."""
    if not cache:
        return cache, []
    prev: dict[tuple[int, int], RequestResult] = {(r.conversation, r.turn): r for r in results}
    history = 0
    for r in results:
        p = prev.get((r.conversation, r.turn - 1))
        if r.turn > 0 and p is not None and (r.success or r.chunks or r.interrupted == "in flight"):
            history += (p.prompt_tokens if p.prompt_tokens is not None else p.input_len) + output_tokens(p)
    reuse = min(cache["hit_tokens"], history)
    cache = {**cache, "history_tokens": history, "history_hit_tokens": reuse}
    rest = {**cache, "hit_tokens": cache["hit_tokens"] - reuse}
    rest["hit_rate"] = round(rest["hit_tokens"] / cache["query_tokens"], 4) if cache["query_tokens"] else 0.0
    if rest.get("hit_tokens_seen_before") is not None:
        rest["hit_tokens_seen_before"] = max(0, rest["hit_tokens_seen_before"] - reuse)
    return cache, prefix_cache_notes(rest)


def _synthetic(model: str, models: list[dict]) -> bool:
    """Whether the served model is `llmrs serve --synthetic` (random weights)."""
    entry = next((m for m in models if m.get("id") == model), {})
    return any(str(v).startswith("synthetic:") for v in (model, entry.get("root")) if v)


def _observer_notes(d: dict) -> list[str]:
    """One line for each observer that is off, and why."""
    notes = []
    if not d["roofline"]["graded"]:
        notes.append(f"roofline: runs not graded: {d['roofline']['why']}")
    if d["telemetry"]["why"]:
        notes.append(f"GPU telemetry: {d['telemetry']['why']}")
    if d["server_series"]["why"]:
        notes.append(f"server /metrics series: {d['server_series']['why']}")
    return notes


def _looked_up(results: list[RequestResult]) -> int:
    """Prompt tokens the server looked up in its prefix cache at the run's requests' first admission: the prompts of
    the requests it admitted (those that completed, streamed something, or were cut off in flight), as it counted
    them (usage) where it said."""
    return sum(r.prompt_tokens if r.prompt_tokens is not None else r.input_len for r in results
               if r.success or r.chunks or r.interrupted == "in flight")


def _check_served(model: str, models: list[dict], base_url: str) -> None:
    """A model name the server's /v1/models list does not hold is a UserError (servers without the list: no check).
    A name matches a model's id or its root (vLLM lists the checkpoint path there)."""
    if models and not any(model in (m.get("id"), m.get("root")) for m in models):
        served = ", ".join(str(m.get("id")) for m in models)
        raise UserError(f"model {model!r} is not served at {base_url} (it serves: {served})")


def _params(o: BenchOptions) -> dict:
    w = asdict(o.workload)
    return {
        **w,
        "num_prompts": None if o.auto_num_prompts else o.workload.num_prompts,  # None: each run sized by a probe
        "num_prompts_auto": o.auto_num_prompts,
        "duration_s": o.duration if o.auto_num_prompts else None,
        "concurrency": o.concurrency,
        "request_rate": o.request_rate if math.isfinite(o.request_rate) else "inf",
        "burstiness": o.burstiness,
        "sweep": {"key": o.sweep[0], "values": [v if math.isfinite(v) else "inf" for v in o.sweep[1]]} if o.sweep else None,
        "warmup": o.warmup,
        "timeout": o.timeout,
        "ignore_eos": o.ignore_eos,
        "temperature": o.temperature,
        **{k: getattr(o, k) for k in OPTIONAL_SAMPLING},
        "endpoint": o.endpoint or None,
        "workers": o.workers,
        "slo_ms": o.slo,
        "percentiles": list(o.percentiles),
        "gpu": o.gpu, "use_measured": o.use_measured, "model_config": o.model_config, "telemetry": o.telemetry,
        "scrape_metrics": o.scrape_metrics,
        "api_key_set": bool(o.api_key),
        "mode": mode(o),
        "trace_speed": o.trace_speed if mode(o) == TRACE else None,
        "think_time_s": o.think_time if mode(o) == MULTI_TURN else None,
    }
