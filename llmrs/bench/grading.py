"""A bench run graded against the hardware: how far its throughput is from what the GPU allows for its shape.

The run's shape comes from its requests (Little's law over their decode intervals):
- mean decode batch B = the summed decode time of the completed requests (E2E - TTFT) / the run's duration;
- mean context C = each request's context halfway through its decode (prompt + output / 2), weighted by its decode
  time.
The model's costs come from the roofline cost model (llmrs.roofline.cost), the ceilings from the GPU database
(datasheet, or `llmrs roofline --measure`'s stored figures). Then:
- decode floor: one step of B sequences at context C = max(bytes / bandwidth, FLOPs / peak); ideal output tok/s at
  that batch = B / floor, and the run's fraction of it;
- MBU (model bandwidth utilization, Databricks' definition): the bytes a step of B sequences must read (weights
  streamed once, each sequence's KV at context C) per mean TPOT, over the bandwidth;
- MFU: the FLOPs the run's tokens needed (each prompt's prefill with causal attention and one logits row, each
  output token at its context) per second of the run, over the peak; `mfu_prefill` is the prompts' share.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from llmrs.bench.metrics import output_tokens
from llmrs.bench.records import RequestResult
from llmrs.roofline.cost import ModelCost
from llmrs.roofline.gpus import GpuSpec

SCHEMA = "llmrs.roofline-grade/1"


@dataclass(slots=True)
class RunShape:
    """What grading needs to know of a run."""

    duration_s: float
    completed: int
    input_tokens: int
    output_tokens: int
    decode_s: float  # summed E2E - TTFT of the completed requests
    mean_decode_batch: float
    mean_context: float
    mean_tpot_s: float | None  # mean of each request's (E2E - TTFT) / (output tokens - 1)
    prompt_lens: list[int]
    output_lens: list[int]


def run_shape(results: list[RequestResult], duration_s: float) -> RunShape:
    """The shape of a run from its requests (completed ones only: failures and cut-offs did no known work)."""
    ok = [r for r in results if r.success]
    ins = [r.prompt_tokens if r.prompt_tokens is not None else r.input_len for r in ok]
    outs = [output_tokens(r) for r in ok]
    dec = [max(r.latency - r.ttft, 0.0) for r in ok]
    decode_s = sum(dec)
    ctx = sum(d * (i + o / 2) for d, i, o in zip(dec, ins, outs)) / decode_s if decode_s > 0 else \
        (sum(i + o / 2 for i, o in zip(ins, outs)) / len(ok) if ok else 0.0)
    tpots = [d / (o - 1) for d, o in zip(dec, outs) if o > 1]
    return RunShape(
        duration_s=duration_s, completed=len(ok), input_tokens=sum(ins), output_tokens=sum(outs), decode_s=decode_s,
        mean_decode_batch=decode_s / duration_s if duration_s > 0 else 0.0, mean_context=ctx,
        mean_tpot_s=sum(tpots) / len(tpots) if tpots else None, prompt_lens=ins, output_lens=outs,
    )


def grade(shape: RunShape, cost: ModelCost, gpu: GpuSpec, measured: bool = False, model_label: str = "",
          model_source: str = "") -> dict:
    """The run's place under the roofline (a JSON-ready dict; figures in SI units, fractions 0..1)."""
    bw = gpu.bandwidth(measured)
    peak = gpu.peak_flops(cost.compute_dtype, measured=measured)
    used_measured = measured and bool(gpu.measured_bandwidth_gbs)
    out: dict = {
        "schema": SCHEMA,
        "gpu": gpu.key, "gpu_name": gpu.name, "ceilings": "measured" if used_measured else "datasheet",
        "bandwidth_gbs": bw / 1e9, "peak_tflops": peak / 1e12, "compute_dtype": cost.compute_dtype,
        "model": model_label, "model_source": model_source, "weight_format": cost.weight_format,
        "mean_decode_batch": shape.mean_decode_batch, "mean_context": shape.mean_context,
    }
    if shape.completed == 0 or shape.duration_s <= 0:
        return {**out, "graded": False, "why": "no request completed"}
    B = max(shape.mean_decode_batch, 1e-9)
    C = max(int(round(shape.mean_context)), 1)
    step = cost.decode_step(1, C)
    # a step of B sequences: weights once, per-sequence bytes and FLOPs B times (B need not be whole)
    per_seq_bytes = step.bytes - step.weight_bytes
    step_bytes = step.weight_bytes + B * per_seq_bytes
    step_flops = B * step.flops
    floor_s = max(step_bytes / bw, step_flops / peak)
    ideal_tok_s = B / floor_s
    output_tok_s = shape.output_tokens / shape.duration_s
    prefill_flops = sum(cost.prefill(1, n).flops for n in shape.prompt_lens if n > 0)
    decode_flops = sum(o * cost.flops_per_token(i + o // 2) for i, o in zip(shape.prompt_lens, shape.output_lens))
    out.update({
        "graded": True,
        "decode_step_bytes": step_bytes,
        "decode_step_flops": step_flops,
        "decode_bound": "compute" if step_flops / peak > step_bytes / bw else "memory",
        "decode_floor_ms": floor_s * 1e3,
        "ideal_output_tok_s": ideal_tok_s,
        "output_tok_s": output_tok_s,
        "fraction_of_ideal": output_tok_s / ideal_tok_s,
        "mbu": step_bytes / shape.mean_tpot_s / bw if shape.mean_tpot_s else None,
        "prefill_flops": prefill_flops,
        "mfu_prefill": prefill_flops / shape.duration_s / peak,
        "mfu": (prefill_flops + decode_flops) / shape.duration_s / peak,
    })
    return out


def match_preset(model_id: str) -> tuple[str, str | None] | None:
    """(preset, weight format or None) for a served model id such as 'Qwen/Qwen2.5-7B-Instruct-AWQ',
    'synthetic:qwen2.5-7b' or 'qwen2.5-7b'; None when no preset is that model. The longest matching name wins,
    so 'qwen2.5-1.5b' is never taken for 'qwen2.5-1'."""
    from llmrs.model.presets import PRESETS

    s = model_id.strip().lower()
    s = s.removeprefix("synthetic:")
    fmt = "awq" if re.search(r"(^|[-_.])awq($|[-_.])", s) else None
    base = s.rsplit("/", 1)[-1]
    best: tuple[int, str] | None = None
    for name, (repo, _) in PRESETS.items():
        for cand in {name, repo.lower().rsplit("/", 1)[-1]}:
            stem = cand.removesuffix("-instruct")
            if base == cand or base == stem or base.startswith(stem + "-"):
                if best is None or len(stem) > best[0]:
                    best = (len(stem), name)
    return (best[1], fmt) if best else None
