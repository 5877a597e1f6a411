"""Commands `llmrs gpus`, `llmrs roofline` and `llmrs ptx-check`: parse, call the package, print.

`register(app)` adds them to the main typer app (llmrs/cli/__init__.py). User mistakes raise UserError (one line,
exit 2); ptx-check exits 1 when a kernel uses local memory and 2 on a compile error.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict
from pathlib import Path
from typing import Any, Optional

import typer
from rich.console import Console

from llmrs.cli.options import model_argument, model_option, one_model
from llmrs.errors import UserError

KV_DTYPE_BYTES = {"bf16": 2.0, "fp16": 2.0, "fp8": 1.0, "f32": 4.0}


def _console() -> Console:
    return Console(width=max(Console().width, 160))


def _emit_json(obj: Any) -> None:
    typer.echo(json.dumps(obj, indent=2, default=str))


def _exit(code: int) -> None:
    """Leave with a meaningful exit code.

    NOTE: SystemExit rather than typer.Exit: llmrs.cli.main runs the app with standalone_mode=False, where click
    turns typer.Exit into a return value that main() does not pass on, so the code would be lost.
    """
    raise SystemExit(code)


def parse_ints(text: str, what: str) -> list[int]:
    """Comma-separated positive integers (`--batch 1,64,256`), else a UserError naming the option `what`."""
    try:
        values = [int(x) for x in text.replace(" ", "").split(",") if x]
    except ValueError:
        raise UserError(f"{what}: expected comma-separated integers, got {text!r}") from None
    if not values or any(v < 1 for v in values):
        raise UserError(f"{what}: expected positive integers, got {text!r}")
    return values


def gpus(
    name: Optional[str] = typer.Argument(None, help="Show one GPU with the source of every number (key or name)."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
) -> None:
    """List the GPU database: bandwidth, dense tensor TFLOP/s, SMs, L2, compute capability, ridge point."""
    from llmrs.roofline import render
    from llmrs.roofline.gpus import get_gpu, load_gpus

    specs = [get_gpu(name)] if name else load_gpus()
    if as_json:
        _emit_json([s.to_dict() for s in specs])
    elif name:
        render.print_gpu_detail(_console(), specs[0])
    else:
        render.print_gpus(_console(), specs)


ROOFLINE_MODEL_HELP = ("Preset (qwen2.5-0.5b/1.5b/3b/7b/14b/32b/72b, llama-3.1-8b/70b, smollm2-135m), a model "
                       "directory with config.json, or a .gguf file. Without one: the GPU's roofs and every "
                       "preset's decode floor on it.")


def roofline(
    model_arg: Optional[str] = model_argument(ROOFLINE_MODEL_HELP),
    gpu: str = typer.Option("auto", "--gpu", help="GPU key or name from `llmrs gpus`; 'auto' asks NVML."),
    model: Optional[str] = model_option(),
    fmt: Optional[str] = typer.Option(
        None, "--format", "-f",
        help="Weight format: bf16, fp16, fp8, awq (4.25 bit), gptq, q4_0 (4.5), q4_1 (5), q8_0 (8.5), q6_k, "
             "q4_f32 (6), f32. Default: the checkpoint's own (a .gguf's real tensor types; bf16 for presets)."),
    lm_head_format: Optional[str] = typer.Option(
        None, "--lm-head-format", help="Format of the output layer (and embedding). Default: bf16 for awq/gptq/fp8, "
                                       "else the weight format."),
    kv_dtype: str = typer.Option("bf16", "--kv-dtype", help="KV cache datatype: bf16, fp16, fp8, f32."),
    compute_dtype: Optional[str] = typer.Option(
        None, "--compute-dtype", help="Tensor roof for the math: bf16, fp16, fp8, int8, fp32. Default: per format."),
    batch: str = typer.Option("1,8,64,256", "--batch", "-b", help="Decode batch sizes, comma-separated."),
    context: int = typer.Option(512, "--context", min=0,
                                help="Tokens of context per sequence (KV re-read each decode step)."),
    prompts: int = typer.Option(256, "--prompts", min=1, help="Prefill load: number of prompts."),
    prompt_len: int = typer.Option(256, "--prompt-len", min=1, help="Prefill load: tokens per prompt."),
    max_batched_tokens: int = typer.Option(2048, "--max-batched-tokens", min=1,
                                           help="Prefill tokens per engine step (weights streamed once per step)."),
    plot: Optional[Path] = typer.Option(None, "--plot", help="Write a log-log roofline chart (.png/.svg/.pdf)."),
    measured: Optional[Path] = typer.Option(
        None, "--measured",
        help='Overlay measured points: JSON list (or {"points": [...]}) of {"label", "batch", "tokens_per_s"} or '
             '{"label", "flops", "bytes", "seconds"}.'),
    measure: bool = typer.Option(False, "--measure",
                                 help="Measure this GPU's real ceilings (copy + bf16 GEMM, needs CuPy) and store them."),
    use_measured: bool = typer.Option(False, "--use-measured",
                                      help="Use stored measured ceilings instead of datasheet ones."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of tables."),
    tp: int = typer.Option(1, "--tp", min=1, help="Tensor-parallel GPUs: per-GPU floors + all-reduce share."),
    tp_link_gbs: Optional[float] = typer.Option(
        None, "--tp-link-gbs", show_default="the GPU's NVLink, one direction",
        help="GPU-to-GPU bandwidth for --tp in GB/s (e.g. nccl-tests all_reduce_perf busbw)."),
) -> None:
    """Bandwidth and FLOP ceilings of a model on a GPU: decode floor, ridge point, KV bytes, batching, prefill.

    Without MODEL: the GPU's roofs (bandwidth, FLOP/s per datatype) and each preset's decode floor and
    compute-bound batch on it."""
    from llmrs.roofline import render
    from llmrs.roofline.analysis import analyze
    from llmrs.roofline.gpus import PEAK_FIELDS, get_gpu, measure_local_gpu
    from llmrs.roofline.measured import save_measurement
    from llmrs.roofline.model_source import build_cost, resolve_model

    model = one_model(model_arg, model)
    if model is None:  # the GPU overview: these draw or split one model
        needs_model = [flag for flag, given in (("--plot", plot is not None), ("--measured", measured is not None),
                                                ("--tp", tp > 1), ("--tp-link-gbs", tp_link_gbs is not None))
                       if given]
        if needs_model:
            raise UserError(f"{needs_model[0]} needs a MODEL (e.g. llmrs roofline qwen2.5-7b {needs_model[0]} ...)")
    if kv_dtype not in KV_DTYPE_BYTES:
        raise UserError(f"--kv-dtype: expected one of {', '.join(KV_DTYPE_BYTES)}, got {kv_dtype!r}")
    if compute_dtype is not None and compute_dtype not in PEAK_FIELDS:
        raise UserError(f"--compute-dtype: expected one of {', '.join(PEAK_FIELDS)}, got {compute_dtype!r}")
    batches = parse_ints(batch, "--batch")
    if tp_link_gbs is not None and not tp_link_gbs > 0:
        raise UserError(f"--tp-link-gbs {tp_link_gbs:g}: expected a positive GB/s")
    if plot is not None:
        from llmrs.roofline.plot import plot_path

        plot = plot_path(plot)  # a bad format is named before the work; no suffix: .png, the file really written
    out: dict[str, Any] = {}
    console = _console()
    if measure:
        m = measure_local_gpu()
        path = save_measurement(m)
        out["measurement"] = {**asdict(m), "stored_in": str(path)}
        if gpu == "auto":
            gpu = m.gpu_key
        use_measured = True
        if not as_json:
            console.print(f"measured {m.device_name}: {m.bandwidth_gbs:,.1f} GB/s copy, {m.bf16_tflops:,.1f} TFLOP/s "
                          f"{m.gemm_dtype} GEMM {m.gemm_shape} -> stored in {path}")
        if model is None:
            if as_json:
                _emit_json(out)
            return
    if model is None:
        from llmrs.roofline.analysis import gpu_overview

        o = gpu_overview(get_gpu(gpu), fmt, lm_head_format, KV_DTYPE_BYTES[kv_dtype], compute_dtype, context,
                         use_measured)
        if as_json:
            out.update(o.to_dict())
            _emit_json(out)
        else:
            render.print_gpu_overview(console, o)
        return
    src = resolve_model(model)  # a mistyped model is named before a missing GPU driver
    spec = get_gpu(gpu)
    cost = build_cost(src, fmt, lm_head_format, KV_DTYPE_BYTES[kv_dtype], compute_dtype)
    r = analyze(spec, cost, src.label, batches, context, prompts, prompt_len, max_batched_tokens, use_measured)
    tpr = None
    if tp > 1:
        from llmrs.roofline.tp import analyze_tp

        tpr = analyze_tp(spec, cost, r.roofs, tp, batches, context, tp_link_gbs)
    points = []
    if measured is not None:
        from llmrs.roofline.overlay import load_points, place_points

        points = place_points(load_points(measured), cost, r.roofs, context)
    if plot is not None:
        from llmrs.roofline.plot import plot_roofline

        plot = plot_roofline(r, spec, plot, points)
    if as_json:
        out.update(r.to_dict())
        out["measured_points"] = [asdict(p) for p in points]
        if tpr is not None:
            out["tensor_parallel"] = tpr.to_dict()
        if plot is not None:
            out["plot"] = str(plot)
        _emit_json(out)
        return
    render.print_roofline(console, r)
    if tpr is not None:
        from llmrs.roofline.tp import print_tp

        print_tp(console, tpr, context)
    if points:
        render.print_measured(console, points)
    if plot is not None:
        console.print(f"plot written to {plot}")


_ARCH_RE = re.compile(r"^sm_\d{2,3}[a-z]?$")
_DEFINE_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(=\S*)?$")


def ptx_check(
    files: Optional[list[Path]] = typer.Argument(
        None, help="CUDA sources (.cu) or directories; default: every kernel in llmrs/kernels_cu/."),
    arch: str = typer.Option("sm_80,sm_86,sm_89,sm_90", "--arch", help="Architectures, comma-separated."),
    allow: Optional[list[str]] = typer.Option(
        None, "--allow", help="Kernel (name or glob) allowed to use local memory; repeatable. Files can also say "
                              "`// ptx-check: allow NAME`."),
    define: Optional[list[str]] = typer.Option(
        None, "--define", "-D", help="A macro for the sources, NAME or NAME=VALUE (as nvcc's -D); repeatable: "
                                     "check a kernel's variant before running it, e.g. -D GV_MINB=5."),
    sass: bool = typer.Option(False, "--sass", help="Also disassemble (nvdisasm) and show each kernel's SASS "
                                                    "instructions, its main loop's length and opcode mix."),
    show_all: bool = typer.Option(False, "--all", help="Print every kernel's row, clean ones too (default: only "
                                                       "the kernels that are not clean, then a summary line)."),
    jobs: Optional[int] = typer.Option(None, "--jobs", "-j", min=1, show_default="the CPU cores available",
                                       help="File/arch pairs compiled at once, each in its own process."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
) -> None:
    """Compile kernels (NVRTC -> PTX, ptxas -> SASS) and count local memory: ld.local/st.local, spills, stack.

    Prints the toolchain, compiles over the CPU cores with progress on stderr, then the kernels that are not
    clean (--all: every kernel) and a one-line summary.
    Exit 0: clean; 1: a kernel spills or uses local memory, or ptxas serialized its wgmma (sm_90a), not
    --allow'ed; 2: a compile error (log shown).
    Templates: declare instantiations in the .cu, one per line: `// ptx-check: instantiate NAME<ARGS>`.
    Needs no GPU: pip install -e '.[ptx]' (cuda-bindings, nvidia-cuda-nvrtc, nvidia-cuda-nvcc).
    """
    import time

    from llmrs.roofline import render
    from llmrs.ptx.check import KERNELS_DIR, default_jobs, discover, run_check
    from llmrs.ptx.progress import CompileProgress
    from llmrs.ptx.toolchain import find_nvdisasm, find_toolchain, supported_archs

    defines = [d.strip() for d in define or []]
    bad_defines = [d for d in defines if not _DEFINE_RE.match(d)]
    if bad_defines:
        raise UserError(f"--define {bad_defines[0]!r}: expected NAME or NAME=VALUE (NAME a C identifier)")
    archs = [a.strip() for a in arch.split(",") if a.strip()]
    bad = [a for a in archs if not _ARCH_RE.match(a)]
    if not archs or bad:
        raise UserError(f"--arch: expected names like sm_86, got {arch!r}")
    for f in files or []:
        if not f.exists():
            raise UserError(f"{f}: no such file or directory")
        if f.is_file() and f.suffix != ".cu":
            raise UserError(f"{f}: not a CUDA source (expected a .cu file or a directory of them)")
    paths = discover(list(files or []))
    console = _console()
    if not paths:
        where = ", ".join(str(f) for f in files) if files else f"{KERNELS_DIR} (llmrs/kernels_cu/)"
        msg = f"no CUDA kernels to check: no *.cu files in {where}"
        if as_json:
            _emit_json({"files": [], "results": [], "errors": [], "message": msg})
        else:
            console.print(msg)
        return
    tc = find_toolchain()
    known = supported_archs()
    unknown = [a for a in archs if known and int(re.match(r"sm_(\d+)", a).group(1)) not in known]
    if unknown:
        raise UserError(f"--arch {', '.join(unknown)}: NVRTC {tc.nvrtc_version} compiles for "
                        + ", ".join(f"sm_{n}" for n in known))
    nvdisasm = find_nvdisasm() if sass else None
    jobs = min(jobs or default_jobs(), len(paths) * len(archs))
    if not as_json:
        console.print(f"[dim]NVRTC {tc.nvrtc_version}, ptxas {tc.ptxas_version} ({tc.ptxas_origin}: {tc.ptxas})[/]")
    t0 = time.monotonic()
    with CompileProgress(len(paths) * len(archs), jobs) as progress:
        results, errors = run_check(paths, archs, tc, list(allow or []), [f"-D{d}" for d in defines], nvdisasm,
                                    jobs=jobs, progress=progress)
    elapsed = time.monotonic() - t0
    if as_json:
        _emit_json({
            "toolchain": {"nvrtc": tc.nvrtc_version, "ptxas": str(tc.ptxas), "ptxas_version": tc.ptxas_version,
                          "ptxas_origin": tc.ptxas_origin},
            "files": [str(p) for p in paths], "archs": archs, "defines": defines,
            "results": [r.to_dict() for r in results], "errors": [asdict(e) for e in errors],
        })
    else:
        render.print_ptx(console, results if show_all else [r for r in results if r.status != "ok"], errors,
                         title=None if show_all else "ptx-check: the kernels that are not clean (--all: every one)")
        if sass:
            render.print_sass(console, results)
    flagged = [r for r in results if r.flagged]
    if not as_json:
        local = sorted({f"{r.name} ({r.arch})" for r in flagged if r.uses_local})
        if local:
            console.print(f"[red]{len(local)} kernel/arch pair(s) use local memory:[/] {', '.join(local)}; "
                          "fix them or --allow NAME")
        for r in flagged:
            if r.wgmma_serialized:
                console.print(f"[red]{r.name} ({r.arch}): ptxas serialized its wgmma[/], due to {r.wgmma_serialized}")
        console.print(ptx_summary(results, errors, len(paths), archs, elapsed, jobs))
    if errors:
        _exit(2)
    if flagged:
        _exit(1)


def ptx_summary(results: list, errors: list, n_files: int, archs: list[str], elapsed_s: float, jobs: int) -> str:
    """ptx-check's last line: the verdict, what was checked, the counts by status, the time it took."""
    counts: dict[str, int] = {}
    for r in results:
        key = "ok" if r.status == "ok" else "allowed" if r.status == "allowed" else "flagged"
        counts[key] = counts.get(key, 0) + 1
    what = (f"{len(results)} kernel/arch pair(s) from {n_files} file(s) x {len(archs)} arch(s)")
    took = f"({elapsed_s:.0f} s, {jobs} process{'es' if jobs != 1 else ''})"
    if not errors and not counts.get("flagged"):
        allowed = f"; {counts['allowed']} allowed by --allow" if counts.get("allowed") else ""
        wgmma = ", no serialized wgmma" if any(a.endswith("a") for a in archs) else ""
        return f"[green]clean[/]: {what}, no local memory, no spills{wgmma}{allowed} {took}"
    parts = [f"{counts[k]} {k}" for k in ("ok", "allowed", "flagged") if counts.get(k)]
    if errors:
        parts.append(f"{len(errors)} compile error(s)")
    return f"[red]not clean[/]: {what}: {', '.join(parts)} {took}"


def register(app: typer.Typer) -> None:
    """Add `gpus`, `roofline` and `ptx-check` to the main app."""
    app.command("gpus")(gpus)
    app.command("roofline")(roofline)
    app.command("ptx-check")(ptx_check)
