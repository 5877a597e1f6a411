"""`llmrs synth` (random-weight checkpoints with a real model's shapes, and a GPU decode benchmark on them)
and `llmrs doctor` (GPU, driver, CUDA, CuPy, free memory, whether the kernels compile)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from llmrs.cli.options import model_argument, one_model
from llmrs.errors import UserError

console = Console(stderr=True)


def synth(
    model_arg: Optional[str] = model_argument("Preset whose exact shapes to copy (`llmrs roofline --gpu G` lists "
                                              "them), or --like / --model."),
    like: Optional[str] = typer.Option(None, "--like", "--model", "-m", metavar="PRESET",
                                       help="Same as MODEL: the preset whose shapes to copy."),
    out: Optional[Path] = typer.Option(None, "--out", help="Write a Hugging Face-style checkpoint directory here "
                                                             "(an earlier `llmrs synth` checkpoint there is replaced; "
                                                             "another model's is refused)."),
    seed: int = typer.Option(0, "--seed", help="Seed of the random weights."),
    quant: Optional[str] = typer.Option(None, "--quant", show_default="bf16",
                                        help="'awq': write a quantized checkpoint (AutoAWQ 4-bit GEMM packing); with "
                                             "--decode-bench, time 4-bit weights packed on the GPU (the linear "
                                             "layers; embeddings and lm_head bf16)."),
    group_size: int = typer.Option(128, "--group-size",
                                   help="--quant awq: weights per scale/zero group (a multiple of 32)."),
    decode_bench: bool = typer.Option(False, "--decode-bench",
                                      help="Build the weights on the GPU (no files) and time single-stream decode."),
    prompt_len: int = typer.Option(128, "--prompt-len", help="Decode bench: prompt tokens before decoding."),
    steps: int = typer.Option(128, "--steps", help="Decode bench: timed decode steps."),
    bandwidth: Optional[float] = typer.Option(None, "--bandwidth-gbs",
                                              help="Decode bench: measured GB/s for the floor (else measured now)."),
    json_out: Optional[Path] = typer.Option(None, "--json", help="Decode bench: also save the result as JSON."),
) -> None:
    """A checkpoint with PRESET's exact shapes and random bf16 weights, or (--decode-bench) decode speed on it."""
    from llmrs.model.presets import preset_config

    like = one_model(model_arg, like)
    if like is None:
        raise UserError("name the preset to copy: llmrs synth PRESET (or --like PRESET), e.g. qwen2.5-7b")
    preset_config(like)  # UserError for an unknown preset
    if out is None and not decode_bench:
        raise UserError("give --out DIR (write a checkpoint) or --decode-bench (time decode on the GPU)")
    if group_size < 32 or group_size % 32:
        raise UserError(f"--group-size {group_size}: expected a positive multiple of 32 (128, 64 or 32)")
    if decode_bench:  # before any checkpoint is written
        from llmrs.backends.cuda import cuda_available

        ok, why = cuda_available()
        if not ok:
            raise UserError(f"--decode-bench times decode on a GPU and needs CuPy and an NVIDIA GPU: {why}")
        if bandwidth is not None and not bandwidth > 0:
            raise UserError(f"--bandwidth-gbs {bandwidth}: expected a positive GB/s")
    if out is not None:
        from llmrs.bench.checkpoint import write_checkpoint

        with console.status(f"writing {like} to {out} ..."):
            try:
                info = write_checkpoint(like, out, seed=seed,
                                        progress=lambda f: console.print(f"[dim]wrote {f}[/dim]"),
                                        quant=quant, group_size=group_size)
            except OSError as e:  # an unwritable or full destination: the user's to fix
                raise UserError(f"--out {out}: cannot write there ({e.strerror or e})") from None
        if info["removed"]:
            console.print(f"[dim]replaced the earlier checkpoint there: removed {', '.join(info['removed'])}[/dim]")
        console.print(f"[bold]{info['parameters']:,}[/bold] parameters ({info['quant']}), {info['bytes'] / 1e9:.2f} GB in "
                      f"{len(info['files'])} file(s) -> {out}")
    if decode_bench:
        from llmrs.profiling.decode_bench import decode_benchmark

        if bandwidth is None:
            from llmrs.roofline.measured import import_cupy, measure_bandwidth

            bandwidth = measure_bandwidth(import_cupy(), 1 << 30)
        with console.status(f"building {like} on the GPU and decoding ..."):
            r = decode_benchmark(like, prompt_len=prompt_len, steps=steps, bandwidth_gbs=bandwidth, quant=quant,
                                 group_size=group_size)
        t = Table(title=f"single-stream decode, synthetic {like} ({quant or 'bf16'})")
        for k in ("ms_per_token", "ms_per_token_sync", "tok_s", "bytes_per_step", "achieved_gbs", "floor_ms_measured",
                  "fraction_of_floor_measured", "floor_ms_datasheet", "fraction_of_floor_datasheet", "prefill_ms"):
            if k in r:
                t.add_row(k, f"{r[k]:,.4g}" if isinstance(r[k], float) else str(r[k]))
        r["bandwidth_gbs_measured"] = round(bandwidth, 1)
        Console().print(t)
        if json_out:
            json_out.write_text(json.dumps(r, indent=1))


def doctor(json_out: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    """GPU, driver, CUDA runtime, CuPy, free memory, and whether every kernel compiles (exit 1 if not)."""
    from llmrs.backends.cuda import cuda_available

    ok, why = cuda_available()
    data: dict = {"cuda_available": ok, "device": why if ok else None, "problem": None if ok else why}
    rc = 0
    if ok:
        import cupy as cp

        rt = cp.cuda.runtime
        free, total = rt.memGetInfo()
        props = rt.getDeviceProperties(0)
        data.update(driver=rt.driverGetVersion(), runtime=rt.runtimeGetVersion(), cupy=cp.__version__,
                    compute_capability=f"{props['major']}.{props['minor']}", sms=props["multiProcessorCount"],
                    memory_total_gb=round(total / 1e9, 1), memory_free_gb=round(free / 1e9, 1))
        try:
            from llmrs.backends.cuda.kernels import ENTRY_POINTS, get_kernels

            k = get_kernels()
            data["kernels"] = f"{sum(len(v) for v in ENTRY_POINTS.values())} entry points compiled"
            if k.wgmma_arch:  # the arch-specific kernels (wgmma: sm_90a)
                data["kernels_" + k.wgmma_arch] = f"{len(k.wgmma_fns())} entry points compiled"
        except Exception as e:  # a compile error: show the compiler's message
            data["kernels"] = f"FAILED: {e}"
            rc = 1
    else:
        rc = 1
    if json_out:
        print(json.dumps(data, indent=1))
    else:
        t = Table(title="llmrs doctor")
        for k, v in data.items():
            t.add_row(k, escape(str(v)))
        Console().print(t)
    if rc:
        raise typer.Exit(rc)


def register(app: typer.Typer) -> None:
    app.command("synth")(synth)
    app.command("doctor")(doctor)
