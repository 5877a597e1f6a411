"""`llmrs synth` (random-weight checkpoints with a real model's shapes, and a GPU decode benchmark on them)
and `llmrs doctor` (GPU, driver, CUDA, CuPy, free memory, whether the kernels compile)."""

from __future__ import annotations

import importlib.util
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
        t = Table(title=f"single-stream decode, synthetic {like} ({quant or 'bf16'}) on {r['gpu']}")
        r["bandwidth_gbs_measured"] = round(bandwidth, 1)
        for k in ("ms_per_token", "ms_per_token_sync", "tok_s", "bytes_per_step", "achieved_gbs",
                  "bandwidth_gbs_measured", "floor_ms_measured", "fraction_of_floor_measured",
                  "bandwidth_gbs_datasheet", "floor_ms_datasheet", "fraction_of_floor_datasheet", "prefill_ms"):
            if r.get(k) is not None:
                t.add_row(k, f"{r[k]:,.4g}" if isinstance(r[k], float) else str(r[k]))
        Console().print(t)
        if r["datasheet_gpu"] is None:
            console.print(f"[yellow]{r['gpu']} is not in the GPU database (`llmrs gpus`): no datasheet floor, "
                          "only the measured one")
        else:
            console.print(f"[dim]datasheet floor: {r['datasheet_gpu']}'s {r['bandwidth_gbs_datasheet']:,.0f} GB/s "
                          "(llmrs gpus)")
        if json_out:
            json_out.write_text(json.dumps(r, indent=1))


def doctor(json_out: bool = typer.Option(False, "--json", help="Print JSON instead of a table.")) -> None:
    """What this installation can run: the CPU backend (numpy, tokenizers, the embedded model), the optional
    extras, and on an NVIDIA GPU the driver, CUDA runtime, CuPy, free memory and whether every kernel compiles.

    Exit 0 when a model can run here (on the CPU at least), 1 when it cannot, or when a GPU is there but its
    kernels do not compile (the GPU is what --device auto would use)."""
    checks: list[dict] = []

    def check(name: str, ok: bool | None, detail: str) -> bool:
        checks.append({"check": name, "status": {True: "ok", False: "problem", None: "-"}[ok], "detail": detail})
        return bool(ok)

    import platform

    from llmrs import __version__

    check("llmrs", True, f"{__version__}, Python {platform.python_version()}")
    cpu_ok = all([check(dist, *_dist_ready(dist, module)) for dist, module in CPU_NEEDS])
    cpu_ok = check("embedded model", *_embedded_model()) and cpu_ok
    check("CPU backend", cpu_ok, "ready: runs any supported model with --device cpu (the default without a GPU)"
          if cpu_ok else "cannot run a model: see the problems above")
    for extra, modules in EXTRAS.items():
        missing = [m for m in modules if importlib.util.find_spec(m.split(".")[0]) is None]
        check(f"extra [{extra}]", None if missing else True,
              f"not installed ({', '.join(missing)}): {INSTALL} '.[{extra}]'" if missing else "installed")
    gpu = _gpu_checks()
    for name, ok, detail in gpu.pop("rows"):
        check(name, ok, detail)
    gpu_broken = gpu["cuda_available"] and not gpu["kernels_ok"]
    ready = cpu_ok and not gpu_broken
    where = "the GPU and the CPU" if gpu["cuda_available"] and not gpu_broken else "the CPU"
    verdict = (f"ready: llmrs can run models on {where}" if ready else
               "not ready: the GPU's kernels do not compile" if gpu_broken else "not ready: no model can run here")
    if json_out:
        print(json.dumps({"ready": ready, "cpu_ready": cpu_ok, **gpu, "checks": checks, "verdict": verdict},
                         indent=1))
    else:
        t = Table(title="llmrs doctor")
        for col in ("check", "status", "detail / what to do"):
            t.add_column(col, overflow="fold")
        for c in checks:
            status = {"ok": "[green]ok[/]", "problem": "[red]problem[/]"}.get(c["status"], c["status"])
            t.add_row(escape(c["check"]), status, escape(c["detail"]))
        out = Console()
        out.print(t)
        out.print(f"[green]{verdict}[/]" if ready else f"[red]{verdict}[/]")
    if not ready:
        raise SystemExit(1)


# what the CPU backend needs (distribution, module): the reference decoder, tokenizers, checkpoints, chat templates
CPU_NEEDS = [("numpy", "numpy"), ("tokenizers", "tokenizers"), ("safetensors", "safetensors"), ("gguf", "gguf"),
             ("jinja2", "jinja2")]
# optional extras (pyproject.toml) -> modules they bring
EXTRAS = {"serve": ["fastapi", "uvicorn", "pydantic", "prometheus_client"], "bench": ["httpx", "pandas", "matplotlib"],
          "roofline": ["matplotlib", "pynvml"], "ptx": ["cuda.bindings", "nvidia"]}
INSTALL = "in the llmrs checkout: pip install -e"  # as the README installs (make run)


def _dist_ready(dist: str, module: str) -> tuple[bool, str]:
    """(importable, version or what went wrong) of a package the CPU backend needs."""
    from importlib import import_module, metadata

    try:
        import_module(module)
    except Exception as e:  # missing, or broken (a wheel for another Python)
        return False, f"cannot import {module} ({type(e).__name__}: {e}): {INSTALL} . (or make run)"
    try:
        return True, metadata.version(dist)
    except metadata.PackageNotFoundError:
        return True, "importable"


def _embedded_model() -> tuple[bool, str]:
    """The embedded default model present, and its tokenizer working on it."""
    from llmrs.errors import UserError
    from llmrs.model.loader import DEFAULT_MODEL, load

    try:
        loaded = load(DEFAULT_MODEL, read_tensors=False)
        ids = loaded.tokenizer.encode("Hello, world")
    except UserError as e:
        return False, f"{e} (make run installs it)"
    except Exception as e:  # a broken file or tokenizer
        return False, f"{DEFAULT_MODEL}: {type(e).__name__}: {e}"
    size = loaded.source.path.stat().st_size / 1e6
    return True, (f"{DEFAULT_MODEL}: {loaded.config.num_parameters() / 1e6:.0f} M parameters, {size:.0f} MB at "
                  f"{loaded.source.path}; its tokenizer works ({len(ids)} tokens for 'Hello, world')")


def _gpu_checks() -> dict:
    """The GPU part: CuPy, the device, driver and runtime, free memory, the kernels compiled for it."""
    from llmrs.backends.cuda import cuda_available

    ok, why = cuda_available()
    data: dict = {"cuda_available": ok, "device": why if ok else None, "kernels_ok": None, "rows": []}
    rows = data["rows"]
    if not ok:
        seen = _nvml_gpu()
        if "CuPy is not installed" in why:
            why = "CuPy is not installed: " + (f"for the {seen}, {INSTALL} '.[cuda13]' (or cuda12)" if seen else
                                               f"no GPU backend (for an NVIDIA GPU: {INSTALL} '.[cuda13]')")
        rows.append(("GPU backend", False if seen else None, why))
        data["gpu_backend"] = why
        return data
    import cupy as cp

    rt = cp.cuda.runtime
    free, total = rt.memGetInfo()
    props = rt.getDeviceProperties(0)
    data.update(driver=rt.driverGetVersion(), runtime=rt.runtimeGetVersion(), cupy=cp.__version__,
                compute_capability=f"{props['major']}.{props['minor']}", sms=props["multiProcessorCount"],
                memory_total_gb=round(total / 1e9, 1), memory_free_gb=round(free / 1e9, 1))
    rows.append(("GPU", True, f"{why}, compute capability {data['compute_capability']}, {data['sms']} SMs, "
                              f"{data['memory_free_gb']} of {data['memory_total_gb']} GB free"))
    rows.append(("CUDA", True, f"driver {data['driver']}, runtime {data['runtime']}, CuPy {data['cupy']}"))
    try:
        from llmrs.backends.cuda.kernels import ENTRY_POINTS, get_kernels

        k = get_kernels()
        data["kernels"] = f"{sum(len(v) for v in ENTRY_POINTS.values())} entry points compiled"
        if k.wgmma_arch:  # the arch-specific kernels (wgmma: sm_90a)
            data["kernels_" + k.wgmma_arch] = f"{len(k.wgmma_fns())} entry points compiled"
        data["kernels_ok"] = True
        rows.append(("GPU kernels", True, data["kernels"] + (f"; {k.wgmma_arch}: {data['kernels_' + k.wgmma_arch]}"
                                                             if k.wgmma_arch else "")))
    except Exception as e:  # a compile error: show the compiler's message
        data["kernels"] = f"FAILED: {e}"
        data["kernels_ok"] = False
        rows.append(("GPU kernels", False, data["kernels"]))
    return data


def _nvml_gpu() -> str | None:
    """The name of an NVIDIA GPU that NVML sees (driver present), where CuPy cannot tell; None otherwise."""
    try:
        from llmrs.roofline.gpus import detect_local_gpu_name

        return detect_local_gpu_name()
    except Exception:  # no nvidia-ml-py, no driver, no GPU
        return None


def register(app: typer.Typer) -> None:
    app.command("synth")(synth)
    app.command("doctor")(doctor)
