"""`llmrs bench` and `llmrs report`: the typer commands. Thin: parse, build options, call bench.py / report.py."""

from __future__ import annotations

import math
import os
import shlex
import sys
from enum import Enum
from pathlib import Path

import typer

from llmrs.errors import UserError


DEFAULT_DURATION_S = 60.0  # (llmrs.bench.sizing.DEFAULT_DURATION_S, without importing the bench at start-up)


class Backend(str, Enum):
    completions = "completions"
    chat = "chat"


class PromptFormat(str, Enum):
    text = "text"
    ids = "ids"


def default_workers() -> int:
    """Half the cores (the other half for the server when it shares the machine), 1 to 8."""
    return max(1, min(8, (os.cpu_count() or 2) // 2))


def _rate(text: str) -> float:
    try:
        v = float(text)
    except ValueError as e:
        raise UserError(f"--request-rate {text!r}: expected a number or inf") from e
    if not v > 0:
        raise UserError("--request-rate must be > 0 (inf sends everything at once)")
    return v


def _percentiles(text: str) -> tuple[float, ...]:
    try:
        ps = tuple(float(p) for p in text.split(",") if p.strip())
    except ValueError as e:
        raise UserError(f"--percentiles {text!r}: expected numbers like 50,90,99") from e
    if not ps or any(not 0 < p <= 100 for p in ps):
        raise UserError("--percentiles must be in (0, 100]")
    return ps


def bench(
    url: str = typer.Option(None, "--url", help="Base URL of a running OpenAI-compatible server (e.g. http://127.0.0.1:8000). Default: start `llmrs serve [--model]` on a free 127.0.0.1 port, and stop it afterwards."),
    server_cmd: str = typer.Option(None, "--server-cmd", help="Start this server command, wait for GET /health, stop it afterwards, e.g. \"vllm serve Qwen/Qwen2.5-0.5B --port {port}\". {port} is replaced by a free port; otherwise the command's --port N (or 8000) is used."),
    server_timeout: float = typer.Option(600.0, help="Seconds to wait for a started server to be ready (GET /health answering 200, or GET /v1/models where it has no /health)."),
    model: str = typer.Option(None, "--model", "-m", help="Model name sent in requests (default: the first of /v1/models). Without --url/--server-cmd: the MODEL given to `llmrs serve`."),
    backend: Backend = typer.Option(None, show_default="completions; chat for multi-turn", help="API: /v1/completions or /v1/chat/completions."),
    endpoint: str = typer.Option("", help="Override the request path (default: /v1/completions or /v1/chat/completions)."),
    concurrency: int = typer.Option(None, "--concurrency", "-c", show_default="16; a trace replay: no cap", help="Most requests in flight at once (0: no cap); a multi-turn run: conversations at once (each has one request in flight at most, and holds its slot between turns)."),
    num_prompts: int = typer.Option(None, "--num-prompts", "-n", show_default="sized to --duration", help="Requests per run, exactly. Not given: before each run a ~10 s probe at the run's concurrency and rate measures the server's tokens/s, and the run sends as many requests as it finishes in about --duration seconds (at most max(1000, 4 x concurrency)); where that is fewer than --concurrency the server saturated, and the bench says so after the run."),
    duration: float = typer.Option(DEFAULT_DURATION_S, "--duration", metavar="SECONDS", help="Without -n: the seconds each run aims at (its probe comes before it: 10 s, or this long where shorter). Ignored with -n."),
    request_rate: str = typer.Option(None, metavar="FLOAT", show_default="inf", help="Mean arrivals per second (gamma process); inf sends all at once."),
    burstiness: float = typer.Option(1.0, help="Gamma shape of inter-arrival times: 1 = Poisson, <1 burstier, >1 more regular."),
    input_len: int = typer.Option(256, help="Prompt tokens of random prompts (exact, as the server tokenizes them)."),
    output_len: int = typer.Option(None, help="max_tokens per request (default: 128, or the dataset's reply length)."),
    range_ratio: float = typer.Option(0.0, help="Random lengths uniform in [L*(1-r), L*(1+r)] for input and output."),
    dataset: Path = typer.Option(None, help="Prompts file: ShareGPT .json, or .jsonl of {\"prompt\": text or [ids], \"output_len\": N}; a .jsonl whose rows have \"timestamp\" (s from the start) is a trace, replayed in time: each row {\"timestamp\", \"prompt\" or \"input_len\", \"output_len\"} is sent at its timestamp (no --request-rate; the trace decides the count). Default: random tokens."),
    trace_speed: float = typer.Option(1.0, "--trace-speed", metavar="X", help="A trace replay runs X times as fast as its timestamps (2: twice as fast)."),
    multi_turn: bool = typer.Option(False, "--multi-turn", help="Replay the ShareGPT --dataset's conversations turn by turn over /v1/chat/completions: each turn's prompt is the history so far (earlier user messages and the server's actual replies) + the new user message, sent after the previous answer (+ --think-time); -n counts conversations. TTFT is reported per turn."),
    turns: int = typer.Option(None, "--turns", metavar="N", help="Multi-turn conversations of N random user messages of --input-len tokens each (implies --multi-turn without a --dataset); with a ShareGPT --dataset: at most N turns of each."),
    think_time: float = typer.Option(0.0, "--think-time", metavar="SECONDS", help="Multi-turn: seconds between an answer's end and the next turn's send."),
    prefix_len: int = typer.Option(0, help="Shared random prefix of this many tokens in front of every prompt (prefix caching)."),
    prompt_format: PromptFormat = typer.Option(PromptFormat.text, help="Random prompts as text (needs the server's /tokenize or --tokenizer) or token ids (completions only)."),
    tokenizer: str = typer.Option(None, help="Tokenizer for exact prompt lengths when the server has no tokenize endpoint: a tokenizer.json, a Hugging Face model directory, a .gguf file or an embedded model name (smollm2-135m)."),
    gpu: str = typer.Option(None, "--gpu", help="The GPU each run is graded against (a name or key from `llmrs gpus`, or auto). Default: the GPU NVML sees here; none: the runs are not graded."),
    use_measured: bool = typer.Option(False, "--use-measured", help="Grade against the ceilings `llmrs roofline --measure` stored for the GPU, not its datasheet."),
    telemetry: bool = typer.Option(True, "--telemetry/--no-telemetry", help="Sample the GPUs through NVML every 100 ms during the runs (clocks, power, utilization, memory, temperature, throttling), saved as NAME.telemetry.csv."),
    scrape_metrics: bool = typer.Option(None, "--scrape-metrics/--no-scrape-metrics", show_default="on for llmrs and vLLM servers", help="Poll the server's Prometheus /metrics every 0.5 s during the runs (running, waiting, KV usage, preemptions, prefix-cache hits), saved as NAME.metrics.csv."),
    model_config: str = typer.Option(None, "--model-config", help="The served model (a Hugging Face directory or its config.json, a .gguf, an embedded model name, or a preset from `llmrs roofline`): its costs grade each run against the roofline, and its tokenizer builds the prompts when the server has no tokenize endpoint and no --tokenizer is given."),
    ignore_eos: bool = typer.Option(False, "--ignore-eos/--no-ignore-eos", help="Send ignore_eos (vLLM, llmrs) so every request generates exactly max_tokens."),
    temperature: float = typer.Option(0.0, help="Sampling temperature sent with each request."),
    top_p: float = typer.Option(None, help="top_p sent with each request (not sent when not given)."),
    top_k: int = typer.Option(None, help="top_k sent with each request (vLLM, SGLang, llama.cpp, llmrs; -1 or 0: off)."),
    min_p: float = typer.Option(None, help="min_p sent with each request (vLLM, SGLang, llama.cpp, llmrs)."),
    warmup: int = typer.Option(0, help="Warm-up requests sent (and discarded) before measuring."),
    seed: int = typer.Option(0, help="Seed for prompts and arrival times."),
    timeout: float = typer.Option(600.0, help="Seconds a request may take in all before it counts as failed."),
    api_key: str = typer.Option(None, envvar="OPENAI_API_KEY", help="Bearer token sent to the server."),
    label: str = typer.Option(None, help="Engine name in results and reports (default: owned_by from /v1/models)."),
    workers: int = typer.Option(default_workers(), show_default="half the cores, 1 to 8", help="Client processes the load is spread over (each parses its share of the streams)."),
    sweep: str = typer.Option(None, help="Run once per value: concurrency=1,16,64,256 or request_rate=1,4,inf."),
    slo: str = typer.Option(None, help="Goodput SLOs in ms, e.g. ttft=200,tpot=50 (keys: ttft, tpot, e2el)."),
    percentiles: str = typer.Option("50,90,99", help="Latency percentiles to report."),
    out_dir: Path = typer.Option(Path("bench-results"), "--out-dir", "-o", help="Where results JSON and CSVs go."),
    name: str = typer.Option(None, help="Results file stem (default: LABEL-YYYYmmdd-HHMMSS with --label, "
                                        "else bench-YYYYmmdd-HHMMSS)."),
    report: Path = typer.Option(None, "--report", help="Also write a report (markdown + PNGs) of this run into this directory."),
    tensor_parallel_size: int = typer.Option(1, "--tensor-parallel-size", help="Without --url/--server-cmd: start `llmrs serve` on this many GPUs (tensor parallelism over NCCL)."),
    verbose: bool = typer.Option(False, "--verbose", help="Also show each run's usage cross-check with the re-tokenized text (round-trip differences are normal) and the server's prefix-cache and preemption counters."),
    serve_args: str = typer.Option(None, "--serve-args", help="Without --url/--server-cmd: more options for the `llmrs serve` this bench starts, e.g. \"--max-num-seqs 256 --gpu-memory-utilization 0.85\"."),
) -> None:
    """Load-test an OpenAI-compatible server (ours, vLLM, SGLang, llama.cpp, ...): TTFT, TPOT, ITL, E2E, throughput, goodput."""
    from llmrs.bench.bench import BenchOptions, parse_sweep, run_bench
    from llmrs.bench.dataset import WorkloadConfig
    from llmrs.bench.interrupts import Interrupted
    from llmrs.bench.metrics import parse_slo

    if url and not url.startswith(("http://", "https://")):
        raise UserError(f"--url {url!r}: expected http://HOST:PORT")
    if (url or server_cmd) and (tensor_parallel_size != 1 or serve_args):
        raise UserError("--tensor-parallel-size and --serve-args apply to the `llmrs serve` bench starts itself; "
                        "with --url or --server-cmd, give them to your server")
    if tensor_parallel_size < 1:
        raise UserError(f"--tensor-parallel-size must be at least 1 (got {tensor_parallel_size})")
    extra = shlex.split(serve_args or "")
    if tensor_parallel_size != 1:
        extra += ["--tensor-parallel-size", str(tensor_parallel_size)]
    try:
        slo_ms = parse_slo(slo)
    except ValueError as e:
        raise UserError(f"--slo: {e}") from e
    from llmrs.bench.dataset import is_trace

    multi = multi_turn or (turns is not None and not dataset)
    if multi and backend == Backend.completions:
        raise UserError("multi-turn conversations are sent as chat messages (/v1/chat/completions): drop "
                        "--backend completions")
    if turns is not None and dataset and not multi_turn:
        raise UserError("--turns with a --dataset limits the turns of --multi-turn conversations: add --multi-turn")
    trace = is_trace(str(dataset)) if dataset else False
    if trace and request_rate is not None:
        raise UserError("--request-rate does not apply to a trace replay: each request is sent at its row's "
                        "timestamp (--trace-speed compresses time)")
    if concurrency is None:
        concurrency = 0 if trace else 16
    wl = WorkloadConfig(
        num_prompts=1 if num_prompts is None else num_prompts, input_len=input_len, output_len=output_len, range_ratio=range_ratio,
        prefix_len=prefix_len, dataset=str(dataset) if dataset else None, prompt_format=prompt_format.value,
        backend=(backend or (Backend.chat if multi else Backend.completions)).value, seed=seed,
        multi_turn=multi, turns=turns,
    )
    if input_len < 1 or (output_len is not None and output_len < 1) or prefix_len < 0:
        raise UserError("--input-len and --output-len must be >= 1, --prefix-len >= 0")
    opts = BenchOptions(
        workload=wl, url=url, server_cmd=server_cmd, server_timeout=server_timeout, model=model,
        concurrency=concurrency or None, request_rate=_rate(request_rate or "inf"), burstiness=burstiness,
        sweep=parse_sweep(sweep), warmup=warmup, timeout=timeout, api_key=api_key, label=label, workers=workers,
        slo=slo_ms, percentiles=_percentiles(percentiles), tokenizer=tokenizer, model_config=model_config,
        gpu=gpu, use_measured=use_measured, telemetry=telemetry, scrape_metrics=scrape_metrics,
        ignore_eos=ignore_eos,
        temperature=temperature, top_p=top_p, top_k=top_k, min_p=min_p, endpoint=endpoint, out_dir=out_dir, name=name,
        command=shlex.join(["llmrs", *sys.argv[1:]]), serve_args=tuple(extra), auto_num_prompts=num_prompts is None,
        duration=duration, verbose=verbose, trace_speed=trace_speed, think_time=think_time,
    )
    if not (server_timeout > 0 and math.isfinite(server_timeout)):
        raise UserError(f"--server-timeout must be a positive number of seconds (got {server_timeout:g})")
    if burstiness <= 0 or not math.isfinite(burstiness):
        raise UserError("--burstiness must be a positive number")
    if not (temperature >= 0 and math.isfinite(temperature)):
        raise UserError(f"--temperature {temperature}: must be >= 0")
    if top_p is not None and not 0 < top_p <= 1:
        raise UserError(f"--top-p {top_p}: must be in (0, 1]")
    if top_k is not None and top_k < -1:
        raise UserError(f"--top-k {top_k}: must be -1, 0 (off) or positive")
    if min_p is not None and not 0 <= min_p <= 1:
        raise UserError(f"--min-p {min_p}: must be in [0, 1]")
    if model_config:  # a path that is not there: said before any server starts
        from llmrs.bench.observe import check_model_config

        check_model_config(model_config)
    _writable_dir(out_dir, "--out-dir")  # before the run, not after it: the results must have somewhere to go
    if report:
        _writable_dir(report, "--report")
    try:
        path = run_bench(opts)
    except Interrupted as e:  # what finished is saved; the exit status says how it ended (130, 143, 129)
        saved = f"what finished is in {e.path}" if e.path is not None else "nothing was measured"
        print(f"interrupted by {e}: {saved}", file=sys.stderr)
        if report and e.path is not None:
            print("no report written (interrupted); to write one of what finished: "
                  f"llmrs report {shlex.quote(str(e.path))} -o {shlex.quote(str(report))}", file=sys.stderr)
        raise typer.Exit(e.exit_code) from None
    if report:
        from llmrs.bench.report import write_report

        write_report([str(path)], report)


def report(
    results: list[Path] = typer.Argument(..., help="Results JSON files from `llmrs bench` (or directories of them)."),
    out: Path = typer.Option(Path("reports/latest"), "--out", "-o", help="Directory for report.md and the PNGs."),
    baseline: str = typer.Option(None, help="Label the ratios are relative to "
                                            "(default: the first results file's label)."),
    title: str = typer.Option("llmrs benchmark report", help="Report title."),
) -> None:
    """Side-by-side comparison of saved bench results: report.md + throughput / latency PNGs, deterministic names."""
    from llmrs.bench.report import write_report

    _writable_dir(out, "--out")
    write_report([str(p) for p in results], out, baseline=baseline, title=title)


def _writable_dir(d: Path, flag: str) -> None:
    """Create `d` if needed; a place that cannot be written (a file in the way, no permission) is a UserError."""
    try:
        d.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UserError(f"{flag} {d}: cannot write there ({e.strerror or e})") from None
    if not os.access(d, os.W_OK):
        raise UserError(f"{flag} {d}: cannot write there (no permission)")


def register(app: typer.Typer) -> None:
    """Adds `bench` and `report` to the llmrs app."""
    app.command("bench")(bench)
    app.command("report")(report)
