"""`llmrs profile`: real engine steps on the GPU, every kernel timed and set against its roofline ceiling."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console

from llmrs.cli.options import model_argument, model_option, one_model
from llmrs.errors import UserError


def parse_batches(text: str) -> list[int]:
    from llmrs.cli.roofline import parse_ints

    return parse_ints(text, "--batch")


def profile(
    model_arg: Optional[str] = model_argument("Model directory, .gguf, embedded name, or synthetic:PRESET."),
    model: Optional[str] = model_option(),
    synthetic: Optional[str] = typer.Option(None, "--synthetic",
                                            help="A preset's exact shapes (e.g. qwen2.5-7b) with random bf16 "
                                                 "weights drawn on the GPU: no files needed."),
    batch: str = typer.Option("1,64,256", "--batch", help="Decode batch sizes (sequences per step)."),
    context: int = typer.Option(512, "--context", help="Tokens already cached per sequence in the decode steps."),
    prefill_len: Optional[int] = typer.Option(None, "--prefill-len",
                                              help="Prompt tokens of the profiled prefill step (default: --context)."),
    prefill_seqs: int = typer.Option(1, "--prefill-seqs",
                                     help="Prompts in the profiled prefill step, each --prefill-len tokens."),
    steps: int = typer.Option(10, "--steps", help="Timed steps per case (and as many profiled ones)."),
    gpu: str = typer.Option("auto", "--gpu", help="GPU key or name for the ceilings (`llmrs gpus`); 'auto' asks NVML."),
    measure: bool = typer.Option(False, "--measure",
                                 help="Measure the ceilings now (a 1 GiB copy, an 8192^3 bf16 GEMM) instead of "
                                      "using the stored measured ones or the datasheet."),
    graphs: bool = typer.Option(True, "--graphs/--no-graphs", help="CUDA graphs for decode steps (wall times)."),
    tensor_parallel_size: int = typer.Option(1, "--tensor-parallel-size",
                                             help="Run the model on this many GPUs (tensor parallelism over NCCL): "
                                                  "rank 0's kernels and collectives are timed, per GPU."),
    tp_link_gbs: Optional[float] = typer.Option(None, "--tp-link-gbs", show_default="the GPU's NVLink, one direction",
                                                help="GPU-to-GPU GB/s the collectives are set against."),
    top: int = typer.Option(12, "--top", help="Kernels shown per step."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of tables."),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="Also save the JSON here."),
    plot_path: Optional[Path] = typer.Option(None, "--plot",
                                             help="Kernels as points on the roofline (.png/.svg/.pdf)."),
    timeline: bool = typer.Option(False, "--timeline",
                                  help="The graphed decode step as the GPU runs it (CUPTI through PyTorch's profiler): "
                                       "the time each kernel adds to the step against its bytes' floor."),
    from_path: Optional[Path] = typer.Option(None, "--from",
                                             help="Show a saved profile (from --out or --json) again: its tables, "
                                                  "--json or --plot, without a GPU or a model."),
) -> None:
    """Where a decode step (at each --batch) and a prefill spend their GPU time: matrix multiply, decode and
    prefill attention, everything else; GPU busy; each kernel's GB/s or TFLOP/s as a % of its roof."""
    from llmrs.profiling import profile as prof
    from llmrs.profiling import timeline as tl
    from llmrs.model.loader import SYNTHETIC_PREFIX, resolve

    named = one_model(model_arg, model)
    given = [x for x in (named, synthetic) if x]
    err = Console(stderr=True)
    if top < 1:
        raise UserError(f"--top {top}: expected at least 1 kernel per step")
    if tp_link_gbs is not None and not tp_link_gbs > 0:
        raise UserError(f"--tp-link-gbs {tp_link_gbs:g}: expected a positive GB/s")
    if plot_path is not None:
        from llmrs.roofline.plot import plot_path as chart_path

        plot_path = chart_path(plot_path)
    for path, flag in ((out, "--out"), (plot_path, "--plot")):
        if path is not None:
            prof.writable_file(path, flag)  # before the profile: a long run never ends unable to save
    doc = None
    if from_path is not None:
        if given:
            raise UserError("--from shows a saved profile: give no MODEL, --model or --synthetic with it")
        doc = prof.read_json(from_path)
        timeline = doc.get("kind") == "timeline"
    mod = tl if timeline else prof  # the same save_json / to_json / from_json / render in both
    if timeline and plot_path is not None:
        raise UserError("--plot places eager kernels on the roofline: a timeline (--timeline) has none to place")
    if doc is not None:
        results, meta = mod.from_json(doc)
    else:
        if len(given) != 1:
            raise UserError("give exactly one of MODEL, --model M or --synthetic PRESET (or --from a saved profile)")
        if timeline:
            if tensor_parallel_size != 1:
                raise UserError("--timeline looks at one GPU's graphed step: leave --tensor-parallel-size at 1")
            if not graphs:
                raise UserError("--timeline looks at the graphed decode step: leave out --no-graphs")
            if prefill_len is not None or prefill_seqs != 1:
                raise UserError("--timeline covers decode steps (--batch, --context): leave out --prefill-len and "
                                "--prefill-seqs")
        spec = SYNTHETIC_PREFIX + synthetic if synthetic else given[0]
        resolve(spec)  # a mistyped model or preset is named before a missing GPU
        batches = parse_batches(batch)
        if tensor_parallel_size != 1:
            from llmrs.engine.tp_nccl import check_tp_size

            check_tp_size(tensor_parallel_size, "cuda")
        with err.status("profiling ...") as status:
            if timeline:
                results, meta = tl.run_timeline(spec, batches, context, steps=steps, gpu=gpu, measure=measure,
                                                progress=lambda m: status.update(m))
            else:
                results, meta = prof.run_profile(spec, batches, context, prefill_len=prefill_len, steps=steps,
                                                 gpu=gpu, prefill_seqs=prefill_seqs, measure=measure, graphs=graphs,
                                                 progress=lambda m: status.update(m), tp=tensor_parallel_size,
                                                 link_gbs=tp_link_gbs)
    if out:
        mod.save_json(out, results, meta)
    if plot_path:
        prof.plot(results, meta, plot_path)
    if as_json:
        typer.echo(json.dumps(mod.to_json(results, meta), indent=1))
    else:
        mod.render(Console(width=max(Console().width, 140)), results, meta, top=top)
        err.print(f"[dim]ceilings: {meta.get('ceilings')}; {meta.get('note')}[/dim]")


def register(app: typer.Typer) -> None:
    app.command("profile")(profile)
