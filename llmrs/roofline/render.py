"""Rich tables for `llmrs gpus`, `llmrs roofline` and `llmrs ptx-check` (the --json paths skip this file)."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from llmrs.roofline.analysis import GpuOverview, Roofline
from llmrs.roofline.gpus import NUMERIC_FIELDS, GpuSpec
from llmrs.roofline.overlay import MeasuredPoint
from llmrs.ptx.check import FileError, KernelResult


def gb(x: float) -> str:
    return f"{x / 1e9:,.2f} GB" if x >= 1e8 else f"{x / 1e6:,.1f} MB"


def secs(s: float) -> str:
    return f"{s * 1e3:,.2f} ms" if s < 1 else f"{s:,.2f} s"


def flops(x: float) -> str:
    if x >= 1e14:
        return f"{x / 1e15:,.3f} PFLOP"
    for unit, scale in (("TFLOP", 1e12), ("GFLOP", 1e9)):
        if x >= scale:
            return f"{x / scale:,.2f} {unit}"
    return f"{x / 1e6:,.1f} MFLOP"


def _num(v: float | None, star: bool = False) -> str:
    if v is None:
        return "-"
    s = f"{v:,.1f}" if isinstance(v, float) else f"{v:,}"
    return s + ("*" if star else "")


def print_gpus(console: Console, specs: list[GpuSpec]) -> None:
    t = Table(title="GPU ceilings (dense tensor TFLOP/s; * = derived from a sparse or half-rate figure)")
    for col in ("key", "name", "cc", "SMs", "memory", "GB/s", "bf16", "fp16", "fp8", "int8 TOP/s", "fp32", "L2 MB",
                "ridge bf16", "measured"):
        t.add_column(col, justify="left" if col in ("key", "name", "measured") else "right")
    for s in specs:
        meas = "-"
        if s.measured_bandwidth_gbs or s.measured_bf16_tflops:
            meas = f"{_num(s.measured_bandwidth_gbs)} GB/s, {_num(s.measured_bf16_tflops)} TFLOP/s"
        d = s.derived
        t.add_row(s.key, s.name, s.compute_capability, str(s.sm_count), f"{s.memory_gb:g} GB {s.memory_type}",
                  _num(float(s.bandwidth_gbs)), _num(s.bf16_tflops, "bf16_tflops" in d),
                  _num(s.fp16_tflops, "fp16_tflops" in d), _num(s.fp8_tflops, "fp8_tflops" in d),
                  _num(s.int8_tops, "int8_tops" in d), _num(s.fp32_tflops), f"{s.l2_mb:g}",
                  f"{s.ridge('bf16'):.0f}" if s.bf16_tflops else "-", meas)
    console.print(t)


def print_gpu_detail(console: Console, s: GpuSpec) -> None:
    t = Table(title=f"{s.name} ({s.key}, {s.arch})")
    t.add_column("field")
    t.add_column("value", justify="right")
    t.add_column("source / derivation", overflow="fold")
    for f in NUMERIC_FIELDS:
        v = getattr(s, f)
        note = s.sources.get(f, "")
        if f in s.derived:
            note += f"  [derived: {s.derived[f]}]"
        t.add_row(f, "-" if v is None else str(v), note)
    if s.measured_at:
        t.add_row("measured_bandwidth_gbs", _num(s.measured_bandwidth_gbs), f"llmrs roofline --measure, {s.measured_at}")
        t.add_row("measured_bf16_tflops", _num(s.measured_bf16_tflops), f"llmrs roofline --measure, {s.measured_at}")
    console.print(t)


def print_roofline(console: Console, r: Roofline) -> None:
    ro = r.roofs
    src = "measured" if ro.measured else "datasheet"
    console.print(f"[bold]{r.gpu_name}[/] ({src}): {ro.bandwidth / 1e9:,.0f} GB/s, "
                  f"{ro.peak_flops / 1e12:,.1f} TFLOP/s dense {ro.compute_dtype} -> ridge "
                  f"[bold]{ro.ridge:,.1f} FLOP/byte[/]")
    console.print(f"[bold]{r.model}[/]: {r.num_parameters / 1e9:,.3f} B parameters, weights {r.weight_format}, "
                  f"lm_head {r.lm_head_format}, KV {r.kv_bytes_per_token:,.0f} bytes/token "
                  f"({r.kv_dtype_bytes:g} B/value), {flops(r.flops_per_token)} per token (projections + logits)")
    comp = Table(title="weights by component", show_edge=False)
    for col in ("component", "parameters", "bits/weight", "bytes", "decode reads"):
        comp.add_column(col, justify="left" if col in ("component", "decode reads") else "right")
    for c in r.components:
        comp.add_row(c["name"], f"{c['params']:,}", f"{c['bits']:.4g}", gb(c["bytes"]),
                     "whole, every step" if c["role"] == "streamed" else "one row per token")
    console.print(comp)
    console.print(f"whole checkpoint: {gb(r.checkpoint_bytes)} / bandwidth = {secs(r.checkpoint_time_s)} per token "
                  f"({1 / r.checkpoint_time_s:,.1f} tok/s)")
    why = ("embedding tied to lm_head, so streamed as the output layer" if any(
        c["name"].startswith("embedding =") for c in r.components) else "embedding gathered, not streamed")
    console.print(f"[bold]decode floor[/]: a batch-1 step streams {gb(r.streamed_bytes)} ({why}) = "
                  f"[bold]{secs(r.decode_floor_s)}[/] per token -> at most "
                  f"[bold]{r.max_tokens_per_s:,.1f} tok/s[/] single-stream")
    t = Table(title=f"decode step per batch size (each sequence with {r.context} tokens of context)")
    for col in ("batch", "weights", "KV", "bytes/step", "FLOPs/step", "FLOP/byte", "memory", "compute", "bound",
                "step", "tok/s ceiling", "memory needed"):
        t.add_column(col, justify="right")
    for p in r.points:
        bound = f"[red]{p.bound}[/]" if p.bound == "compute" else p.bound
        need = gb(p.memory_needed_gb * 1e9) + ("" if p.fits else " [red](> GPU)[/]")
        t.add_row(str(p.batch), gb(p.weight_bytes), gb(p.kv_bytes), gb(p.bytes), flops(p.flops), f"{p.intensity:,.1f}",
                  secs(p.memory_s), secs(p.compute_s), bound, secs(p.step_s), f"{p.tokens_per_s:,.0f}", need)
    console.print(t)
    if r.compute_bound_batch is None:
        console.print(f"decode never turns compute-bound at context {r.context}: each sequence's KV reads outweigh "
                      "its FLOPs at the ridge")
    else:
        console.print(f"decode turns compute-bound from batch [bold]~{r.compute_bound_batch:,.0f}[/] "
                      f"(context {r.context}; ridge {ro.ridge:,.0f} FLOP/byte)")
    pf = r.prefill
    console.print(f"[bold]prefill[/] {pf.prompts} prompts x {pf.prompt_len} tokens = {pf.tokens:,} tokens: "
                  f"{flops(pf.flops)} (logits of each prompt's last token; {flops(pf.flops_all_logits)} with logits "
                  f"for every token), {gb(pf.bytes)} moved -> compute {secs(pf.compute_s)}, memory "
                  f"{secs(pf.memory_s)}: floor [bold]{secs(pf.floor_s)}[/] ({pf.bound}-bound, "
                  f"{pf.tokens_per_s:,.0f} prompt tok/s)")
    for n in r.notes:
        console.print(f"[dim]note: {n}[/]")


def print_gpu_overview(console: Console, o: GpuOverview) -> None:
    """`llmrs roofline --gpu G` without a model: the roofs, then each preset's decode floor and compute-bound batch."""
    src = "measured" if o.measured else "datasheet"
    console.print(f"[bold]{o.gpu_name}[/] ({o.gpu}, {src}): {o.memory_gb:g} GB, {o.bandwidth / 1e9:,.0f} GB/s")
    roofs = Table(title="compute roofs", show_edge=False)
    for col in ("datatype", "dense TFLOP/s", "ridge (FLOP/byte)"):
        roofs.add_column(col, justify="left" if col == "datatype" else "right")
    for dt, peak in o.peaks.items():
        ridge = o.ridge(dt)
        roofs.add_row(dt + (" (TOP/s)" if dt == "int8" else ""), "-" if peak is None else f"{peak / 1e12:,.1f}",
                      "-" if ridge is None else f"{ridge:,.1f}")
    console.print(roofs)
    t = Table(title=f"presets in {o.weight_format}: decode floor at batch 1 (streamed bytes / bandwidth), "
                    f"compute-bound batch at context {o.context}")
    for col in ("preset", "parameters", "checkpoint", "streamed/step", "decode floor", "tok/s ceiling",
                "compute-bound batch"):
        t.add_column(col, justify="left" if col == "preset" else "right")
    for p in o.presets:
        ckpt = gb(p.checkpoint_bytes) + ("" if p.fits else " [red](> GPU)[/]")
        cb = "never" if p.compute_bound_batch is None else f"~{p.compute_bound_batch:,.0f}"
        t.add_row(p.preset, f"{p.parameters / 1e9:,.2f} B", ckpt, gb(p.streamed_bytes),
                  f"{p.decode_floor_s * 1e3:,.2f} ms", f"{p.max_tokens_per_s:,.1f}", cb)
    console.print(t)
    console.print("[dim]one model in detail: llmrs roofline MODEL --gpu " + o.gpu + " (MODEL: a preset above, a model "
                  "directory or a .gguf)[/]")


def print_measured(console: Console, points: list[MeasuredPoint]) -> None:
    t = Table(title="measured points against the roofline")
    for col in ("label", "batch", "FLOP/byte", "achieved TFLOP/s", "ceiling TFLOP/s", "tok/s", "% of ceiling"):
        t.add_column(col, justify="left" if col == "label" else "right")
    for m in points:
        t.add_row(m.label, "-" if m.batch is None else str(m.batch), f"{m.intensity:,.1f}",
                  f"{m.achieved_flops / 1e12:,.2f}", f"{m.ceiling_flops / 1e12:,.2f}",
                  "-" if m.tokens_per_s is None else f"{m.tokens_per_s:,.1f}", f"{100 * m.fraction_of_ceiling:.0f}%")
    console.print(t)


def print_sass(console: Console, results: list[KernelResult]) -> None:
    """ptx-check --sass: each kernel's SASS size, its loops and the opcode mix of the longest one."""
    t = Table(title="ptx-check --sass: instructions per kernel (main loop = the longest backward-branch span; "
                    "loads before wait = global loads a path reaches before a griddepcontrol.wait, PDL kernels)")
    for col in ("kernel", "arch", "instructions", "loops", "main loop", "loads before wait",
                "main loop's opcodes (count)"):
        t.add_column(col, justify="left" if col in ("kernel", "main loop's opcodes (count)") else "right")
    for r in results:
        s = r.sass
        if s is None:
            continue
        mix = ", ".join(f"{op} {n}" for op, n in s.mix[:10])
        t.add_row(r.name, r.arch, str(s.instructions), str(len(s.loops)), str(s.main_loop or "-"),
                  str(s.pre_wait_loads) if s.pdl_waits else "-", mix or "-")
    console.print(t)


def print_ptx(console: Console, results: list[KernelResult], errors: list[FileError], title: str | None = None) -> None:
    t = Table(title=title or "ptx-check: local memory per kernel and architecture")
    for col in ("file", "kernel", "arch", "ld.local", "st.local", "local depot", "regs", "spill st", "spill ld",
                "stack", "smem", "status"):
        t.add_column(col, justify="left" if col in ("file", "kernel", "status") else "right")
    for r in results:
        status = {"ok": "[green]ok[/]", "allowed": "[yellow]allowed[/]"}.get(r.status, f"[red]{r.status}[/]")
        t.add_row(r.file.rsplit("/", 1)[-1], r.name, r.arch, str(r.ld_local), str(r.st_local),
                  f"{r.local_depot_bytes} B", str(r.registers), f"{r.spill_stores} B", f"{r.spill_loads} B",
                  f"{r.stack_frame} B", f"{r.shared_bytes} B", status)
    if results:
        console.print(t)
    for e in errors:
        console.print(f"[red]compile error[/] {e.file} ({e.arch}, {e.stage}):")
        console.print(e.log, markup=False, highlight=False)
