"""Command `llmrs plan`: capacity planning from the roofline cost model (llmrs/roofline/plan.py): parse, plan, print.

Every figure is labelled a floor (the roofline with a perfect engine) or calibrated (the floor divided by the
efficiency fitted on a bench results file).
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

from llmrs.cli.options import model_argument, model_option, one_model
from llmrs.errors import UserError
from llmrs.roofline.plan import Figures, Plan

PLAN_MODEL_HELP = ("Preset (qwen2.5-0.5b ... 72b, llama-3.1-8b/70b, smollm2-135m), a model directory with "
                   "config.json, or a .gguf file.")


def plan(
    model_arg: Optional[str] = model_argument(PLAN_MODEL_HELP),
    model: Optional[str] = model_option(),
    gpu: str = typer.Option("auto", "--gpu", help="GPU key or name from `llmrs gpus`; 'auto' asks NVML."),
    tp: int = typer.Option(1, "--tp", min=1, help="Tensor-parallel GPUs per replica (weights and KV split N ways, "
                                                  "two all-reduces per layer per step)."),
    tp_link_gbs: Optional[float] = typer.Option(
        None, "--tp-link-gbs", show_default="the GPU's NVLink, one direction",
        help="GPU-to-GPU bandwidth for --tp in GB/s (e.g. nccl-tests all_reduce_perf busbw)."),
    fmt: Optional[str] = typer.Option(
        None, "--format", "-f", help="Weight format: bf16, fp16, fp8, awq, gptq, q4_0, q4_1, q8_0, ... Default: the "
                                     "checkpoint's own (bf16 for presets)."),
    kv_dtype: str = typer.Option("bf16", "--kv-dtype", help="KV cache datatype: bf16, fp16, fp8, f32."),
    input_len: int = typer.Option(512, "--input-len", min=1, help="Prompt tokens per request."),
    output_len: int = typer.Option(256, "--output-len", min=2, help="Output tokens per request."),
    slo: Optional[str] = typer.Option(None, "--slo", help="Latency targets in ms, as `llmrs bench --slo`: "
                                                          "ttft=200,tpot=50 (keys ttft, tpot, e2el)."),
    rate: Optional[float] = typer.Option(None, "--rate", help="Requests/s to serve: is it met, at what concurrency "
                                                              "(Little's law: C = rate x E2E)."),
    concurrency: Optional[int] = typer.Option(None, "--concurrency", "-c", min=1,
                                              help="Requests in flight to predict (default: a range up to what fits)."),
    target_rate: Optional[float] = typer.Option(None, "--target-rate",
                                                help="Requests/s for the whole service: GPUs needed (replicas x tp)."),
    calibrate: Optional[Path] = typer.Option(
        None, "--calibrate", help="A `llmrs bench` results JSON with graded runs of this model on this GPU: fit the "
                                  "engine's efficiency and predict with it."),
    utilization: float = typer.Option(0.9, "--gpu-memory-utilization",
                                      help="Fraction of GPU memory for weights + KV cache (as vLLM's option)."),
    max_batched_tokens: int = typer.Option(2048, "--max-batched-tokens", min=1,
                                           help="Prefill tokens per engine step (longer prompts take several)."),
    use_measured: bool = typer.Option(False, "--use-measured",
                                      help="Use the ceilings `llmrs roofline --measure` stored, not the datasheet."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of tables."),
) -> None:
    """Capacity plan from the roofline: KV memory per concurrency, the largest concurrency and request rate within an
    SLO, predicted TTFT/TPOT/E2E and throughput, GPUs for a target rate; --calibrate fits a real engine's efficiency.
    """
    from llmrs.cli.roofline import KV_DTYPE_BYTES, _console, _emit_json
    from llmrs.roofline.gpus import get_gpu
    from llmrs.roofline.model_source import build_cost, resolve_model
    from llmrs.roofline.plan import PlanModel, calibrate as fit_calibration, make_plan, parse_slo

    name = one_model(model_arg, model)
    if name is None:
        raise UserError("llmrs plan needs a MODEL (e.g. llmrs plan qwen2.5-7b --gpu h200)")
    if rate is not None and concurrency is not None:
        raise UserError("give --rate or --concurrency, not both")
    if kv_dtype not in KV_DTYPE_BYTES:
        raise UserError(f"--kv-dtype: expected one of {', '.join(KV_DTYPE_BYTES)}, got {kv_dtype!r}")
    if tp_link_gbs is not None and not tp_link_gbs > 0:
        raise UserError(f"--tp-link-gbs {tp_link_gbs:g}: expected a positive GB/s")
    slo_ms = parse_slo(slo)
    src = resolve_model(name)  # a mistyped model is named before a missing GPU driver
    spec = get_gpu(gpu)
    cost = build_cost(src, fmt, None, KV_DTYPE_BYTES[kv_dtype])
    pm = PlanModel(spec, cost, tp, tp_link_gbs, use_measured, max_batched_tokens)
    cal = fit_calibration(pm, calibrate, src.label) if calibrate is not None else None
    p = make_plan(pm, src.label, input_len, output_len, utilization, slo_ms, concurrency, rate, target_rate, cal)
    if as_json:
        _emit_json(p.to_dict())
    else:
        print_plan(_console(), p)


def _ms(s: float) -> str:
    return f"{s * 1e3:,.1f} ms" if s < 1 else f"{s:,.2f} s"


def _gb(x: float) -> str:
    from llmrs.roofline.render import gb

    return gb(x)


def _pct(x: float) -> str:
    return f"{100 * x:+.1f}%"


def print_plan(console: Console, p: Plan) -> None:
    m = p.memory
    tp = f"TP {p.tp} over {p.link_gbs:,.0f} GB/s" if p.tp > 1 else "one GPU"
    console.print(f"[bold]{p.gpu_name}[/] ({p.ceilings}): {p.bandwidth_gbs:,.0f} GB/s, {p.peak_tflops:,.1f} TFLOP/s "
                  f"{p.compute_dtype}; [bold]{p.model}[/] {p.weight_format} weights, KV "
                  f"{m.kv_bytes_per_token:,.0f} bytes/token ({p.kv_dtype_bytes:g} B/value); {tp} per replica")
    console.print(f"requests of {p.input_len:,} prompt + {p.output_len:,} output tokens; prefill in steps of "
                  f"{p.max_batched_tokens:,} tokens")
    console.print(f"[bold]memory per GPU[/]: weights {_gb(m.weight_bytes)} + KV {_gb(m.kv_bytes_per_request)} per "
                  f"request ({p.input_len + p.output_len:,} tokens) within {_gb(m.budget_bytes)} "
                  f"({m.utilization:g} x {m.gpu_memory_bytes / 1e9:g} GB) -> at most "
                  f"[bold]{m.max_concurrency:,}[/] requests in flight")
    if p.calibration:
        print_calibration(console, p)
    cal = p.calibration is not None
    t = Table(title="predicted per concurrency (floor: the roofline with a perfect engine"
                    + ("; calibrated: floor / fitted efficiency)" if cal else ")"))
    # floor only: one row a concurrency, each column named floor; calibrated: a floor row and a calibrated row
    names = ["TTFT", "TPOT", "E2E", "req/s", "out tok/s"]
    cols = ["concurrency", "KV/GPU", "memory/GPU"] + (["figures"] if cal else []) + \
        [n if cal else f"{n} floor" for n in names] + ([f"SLO ({p.basis})"] if p.slo else [])
    for col in cols:
        t.add_column(col, justify="left" if col == "figures" else "right")
    for pt in p.points:
        mem = _gb(pt.memory_bytes) + ("" if pt.fits else " [red](> budget)[/]")
        verdict = ["[green]met[/]" if pt.meets_slo else "[red]missed[/]"] if p.slo else []
        head = [f"{pt.concurrency:,}", _gb(pt.kv_bytes), mem]
        if pt.calibrated is None:
            t.add_row(*head, *_figs(pt.floor), *verdict)
        else:
            t.add_row(*head, "floor", *_figs(pt.floor), *([""] if p.slo else []))
            t.add_row("", "", "", "calibrated", *_figs(pt.calibrated), *verdict, end_section=True)
    console.print(t)
    if p.slo:
        s = p.slo
        want = ", ".join(f"{k} <= {v:g} ms" for k, v in s.slo.items())
        if s.max_concurrency is None:
            console.print(f"[bold]SLO[/] {want}: [red]not met even by one request[/] ({s.basis})")
        else:
            console.print(f"[bold]SLO[/] {want} ({s.basis}): at most [bold]{s.max_concurrency:,}[/] requests in "
                          f"flight; the most requests/s within it: [bold]{s.max_request_rate:,.2f} req/s[/] "
                          f"({s.max_output_tok_s:,.0f} output tok/s) at concurrency {s.max_rate_concurrency:,}")
    if p.rate:
        r = p.rate
        verdict = "[green]met[/]" if r.met else "[red]not met[/]"
        console.print(f"[bold]--rate {r.rate:g} req/s[/]: {verdict}: {r.why}")
    if p.target:
        g = p.target
        if g.replicas is None:
            console.print(f"[bold]--target-rate {g.target_rate:g} req/s[/]: [red]unreachable[/]: the SLO is missed "
                          "even by one request per replica")
        else:
            console.print(f"[bold]--target-rate {g.target_rate:g} req/s[/] ({p.basis}): {g.replicas:,} replica(s) x "
                          f"TP {p.tp} = [bold]{g.gpus:,} GPU(s)[/], each replica at concurrency "
                          f"{g.concurrency_per_replica:,} serving {g.rate_per_replica:,.2f} req/s")
    for n in p.notes:
        console.print(f"[dim]note: {n}[/]")
    console.print("[dim]not counted: activation and CUDA-graph memory, KV block rounding, the engine's cap on running "
                  "sequences, per-step CPU time and NCCL latency" + (" (the calibration absorbs the last two)" if cal
                                                                    else "; --calibrate RESULTS.json fits them") + "[/]")


def _figs(f: Figures) -> list[str]:
    return [_ms(f.ttft_s), _ms(f.tpot_s), _ms(f.e2e_s), f"{f.request_rate:,.2f}", f"{f.output_tok_s:,.0f}"]


def print_calibration(console: Console, p: Plan) -> None:
    c = p.calibration
    assert c is not None
    console.print(f"[bold]calibrated[/] on {c.source}: decode efficiency [bold]{c.decode_efficiency:.3f}[/] "
                  f"(floor TPOT / measured, mean of {len(c.runs)} run(s)), prefill efficiency "
                  f"[bold]{c.prefill_efficiency:.3f}[/] (floor TTFT / measured, run {c.prefill_from})")
    if c.tpot_error_mean is None:
        console.print("calibration error: [yellow]unknown[/] (one graded run; bench two concurrencies or more to "
                      "measure it)")
    else:
        console.print(f"calibration error (leave-one-out over {len(c.runs)} runs): TPOT {100 * c.tpot_error_mean:.1f}%"
                      f" mean, {100 * c.tpot_error_max:.1f}% max; output tok/s {100 * c.output_tok_s_error_mean:.1f}% "
                      f"mean, {100 * c.output_tok_s_error_max:.1f}% max")
    t = Table(title="calibration runs (measured means vs the floor of each run's shape)")
    cols = ["run", "concurrency", "in/out", "TTFT measured", "TTFT floor", "TPOT measured", "TPOT floor",
            "decode eff.", "out tok/s measured"]
    loo = c.tpot_error_mean is not None
    if loo:
        cols += ["TPOT left-one-out", "out tok/s left-one-out"]
    for col in cols:
        t.add_column(col, justify="left" if col == "run" else "right")
    for r in c.runs:
        row = [r.tag, f"{r.concurrency:,.4g}", f"{r.input_len}/{r.output_len}", _ms(r.measured_ttft_s),
               _ms(r.floor_ttft_s), _ms(r.measured_tpot_s), _ms(r.floor_tpot_s), f"{r.decode_efficiency:.3f}",
               f"{r.measured_output_tok_s:,.0f}"]
        if loo:
            row += [f"{_ms(r.loo_tpot_s)} ({_pct(r.loo_tpot_error)})",
                    f"{r.loo_output_tok_s:,.0f} ({_pct(r.loo_output_tok_s_error)})"]
        t.add_row(*row)
    console.print(t)
    for s in c.skipped:
        console.print(f"[dim]skipped {s}[/]")


def register(app: typer.Typer) -> None:
    app.command("plan")(plan)
