"""Put a model's costs under a GPU's roofs: step time = max(bytes / bandwidth, FLOPs / peak).

`analyze()` returns one `Roofline` with the decode floors (whole checkpoint vs the bytes a step really
streams), a `BatchPoint` per batch size (which roof binds, tokens/s ceiling), the batch size where decode
turns compute-bound, and the prefill floor of a prompt load. The CLI prints it, `--json` dumps it, the plot
draws it, and `llmrs profile` uses the same numbers as each kernel's ceiling.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

from llmrs.roofline.cost import ModelCost, StepCost
from llmrs.roofline.gpus import GpuSpec


@dataclass(slots=True)
class Roofs:
    """The two ceilings in use (datasheet or measured) and where they meet."""

    bandwidth: float  # bytes/s
    peak_flops: float  # FLOP/s of the compute datatype
    compute_dtype: str
    measured: bool

    @property
    def ridge(self) -> float:
        return self.peak_flops / self.bandwidth

    def time(self, cost: StepCost) -> tuple[float, float]:
        """(memory seconds, compute seconds) of a step."""
        return cost.bytes / self.bandwidth, cost.flops / self.peak_flops


@dataclass(slots=True)
class BatchPoint:
    """One decode step of `batch` sequences with `context` tokens each, under the roofs."""

    batch: int
    context: int
    weight_bytes: float
    kv_bytes: float
    bytes: float
    flops: float
    intensity: float
    memory_s: float
    compute_s: float
    bound: str
    step_s: float
    tokens_per_s: float
    memory_needed_gb: float
    fits: bool


@dataclass(slots=True)
class PrefillPoint:
    """A prompt load (prompts x prompt_len tokens) under the roofs."""

    prompts: int
    prompt_len: int
    tokens: int
    flops: float
    flops_all_logits: float
    bytes: float
    memory_s: float
    compute_s: float
    bound: str
    floor_s: float
    tokens_per_s: float


@dataclass(slots=True)
class Roofline:
    gpu: str
    gpu_name: str
    model: str
    weight_format: str
    lm_head_format: str
    kv_dtype_bytes: float
    roofs: Roofs
    num_parameters: int
    checkpoint_bytes: float
    streamed_bytes: float
    checkpoint_time_s: float  # whole checkpoint / bandwidth: the posts' back-of-envelope figure
    decode_floor_s: float  # bytes one batch-1 decode step must stream (embedding gathered, not streamed)
    kv_bytes_per_token: float
    flops_per_token: float  # projections + logits, no attention
    components: list[dict[str, Any]]
    points: list[BatchPoint]
    compute_bound_batch: float | None  # batch where decode at `context` turns compute-bound; None = never
    prefill: PrefillPoint
    context: int
    notes: list[str] = field(default_factory=list)

    @property
    def max_tokens_per_s(self) -> float:
        """Single-stream ceiling: one token per decode floor."""
        return 1.0 / self.decode_floor_s

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["ridge_flop_per_byte"] = self.roofs.ridge
        d["max_tokens_per_s_single_stream"] = self.max_tokens_per_s
        return d


def decode_point(cost: ModelCost, roofs: Roofs, batch: int, context: int, memory_bytes: float) -> BatchPoint:
    """One decode step under the roofs; `memory_bytes` is the GPU's memory, to say whether the batch fits."""
    step = cost.decode_step(batch, context)
    mem_s, comp_s = roofs.time(step)
    step_s = max(mem_s, comp_s)
    needed = cost.checkpoint_bytes + batch * context * cost.kv_bytes_per_token
    return BatchPoint(
        batch=batch, context=context, weight_bytes=step.weight_bytes,
        kv_bytes=step.kv_read_bytes + step.kv_write_bytes, bytes=step.bytes, flops=step.flops,
        intensity=step.intensity, memory_s=mem_s, compute_s=comp_s,
        bound="compute" if comp_s > mem_s else "memory", step_s=step_s, tokens_per_s=batch / step_s,
        memory_needed_gb=needed / 1e9, fits=needed <= memory_bytes,
    )


def compute_bound_batch(cost: ModelCost, roofs: Roofs, context: int) -> float | None:
    """Smallest batch B where FLOPs(B)/peak >= bytes(B)/bandwidth for decode at `context`.

    bytes(B) = W + B*b_seq and FLOPs(B) = B*f_tok, so B* = W / (f_tok/ridge - b_seq). When each sequence's own
    KV traffic already outweighs its FLOPs at the ridge (long contexts: attention's intensity is only the GQA
    group size), no batch is compute-bound: None.
    """
    one = cost.decode_step(1, context)
    per_seq_bytes = one.bytes - one.weight_bytes
    denom = one.flops / roofs.ridge - per_seq_bytes
    if denom <= 0:
        return None
    return one.weight_bytes / denom


def analyze(gpu: GpuSpec, cost: ModelCost, model_label: str, batches: list[int], context: int,
            prompts: int = 256, prompt_len: int = 256, max_batched_tokens: int = 2048,
            use_measured: bool = False) -> Roofline:
    """Everything `llmrs roofline` prints, for one GPU and one model/format."""
    roofs = Roofs(bandwidth=gpu.bandwidth(use_measured), peak_flops=gpu.peak_flops(cost.compute_dtype, use_measured),
                  compute_dtype=cost.compute_dtype,
                  measured=use_measured and bool(gpu.measured_bandwidth_gbs or gpu.measured_bf16_tflops))
    floor = cost.decode_step(1, 0)
    floor_bytes = floor.weight_bytes + floor.gather_bytes
    pre = cost.prefill(prompts, prompt_len, max_batched_tokens)
    pre_all = cost.prefill(prompts, prompt_len, max_batched_tokens, logits_all=True)
    p_mem, p_comp = roofs.time(pre)
    p_floor = max(p_mem, p_comp)
    notes = []
    if cost.weight_format in ("awq", "gptq", "q4_0", "q4_1", "q4_f32", "q6_k", "q8_0"):
        notes.append("compute time ignores the cost of unpacking quantized weights (free only when memory-bound)")
    return Roofline(
        gpu=gpu.key, gpu_name=gpu.name, model=model_label, weight_format=cost.weight_format,
        lm_head_format=cost.lm_head_format, kv_dtype_bytes=cost.kv_dtype_bytes, roofs=roofs,
        num_parameters=cost.num_parameters, checkpoint_bytes=cost.checkpoint_bytes,
        streamed_bytes=cost.streamed_bytes, checkpoint_time_s=cost.checkpoint_bytes / roofs.bandwidth,
        decode_floor_s=floor_bytes / roofs.bandwidth, kv_bytes_per_token=cost.kv_bytes_per_token,
        flops_per_token=cost.flops_per_token(0),
        components=[{"name": c.name, "params": c.params, "bits": c.bits, "bytes": c.bytes, "role": c.role}
                    for c in cost.components],
        points=[decode_point(cost, roofs, b, context, gpu.memory_gb * 1e9) for b in batches],
        compute_bound_batch=compute_bound_batch(cost, roofs, context),
        prefill=PrefillPoint(
            prompts=prompts, prompt_len=prompt_len, tokens=prompts * prompt_len, flops=pre.flops,
            flops_all_logits=pre_all.flops, bytes=pre.bytes, memory_s=p_mem, compute_s=p_comp,
            bound="compute" if p_comp > p_mem else "memory", floor_s=p_floor,
            tokens_per_s=prompts * prompt_len / p_floor if p_floor else math.inf,
        ),
        context=context, notes=notes,
    )


@dataclass(slots=True)
class PresetFloor:
    """One preset on one GPU: the batch-1 decode floor and where batching turns compute-bound."""

    preset: str
    parameters: int
    weight_format: str
    checkpoint_bytes: float
    streamed_bytes: float
    decode_floor_s: float  # streamed bytes of a batch-1 step / bandwidth
    max_tokens_per_s: float
    compute_bound_batch: float | None  # at `context`; None: never
    fits: bool  # the checkpoint fits the GPU's memory


@dataclass(slots=True)
class GpuOverview:
    """`llmrs roofline --gpu G` without a model: the GPU's roofs and every preset's decode floor on it."""

    gpu: str
    gpu_name: str
    memory_gb: float
    bandwidth: float  # bytes/s, the one in use (datasheet or measured)
    measured: bool
    peaks: dict[str, float | None]  # compute dtype -> dense FLOP/s (None: no tensor units for it)
    weight_format: str
    kv_dtype_bytes: float
    context: int
    presets: list[PresetFloor]

    def ridge(self, dtype: str) -> float | None:
        peak = self.peaks.get(dtype)
        return peak / self.bandwidth if peak else None

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["ridge_flop_per_byte"] = {k: self.ridge(k) for k in self.peaks}
        return d


def gpu_overview(gpu: GpuSpec, fmt: str | None = None, head_fmt: str | None = None, kv_dtype_bytes: float = 2.0,
                 compute_dtype: str | None = None, context: int = 512, use_measured: bool = False) -> GpuOverview:
    """The GPU's roofs per datatype and, for each model preset in `fmt` (default bf16), the decode floor at
    batch 1 (streamed weight bytes / bandwidth) and the batch where decode at `context` turns compute-bound."""
    from llmrs.model.presets import preset_config, preset_names
    from llmrs.roofline.formats import get_format, lm_head_format
    from llmrs.roofline.gpus import PEAK_FIELDS

    weights = get_format(fmt or "bf16")
    head = lm_head_format(weights, head_fmt)
    measured = use_measured and bool(gpu.measured_bandwidth_gbs or gpu.measured_bf16_tflops)
    peaks = {dt: (gpu.peak_flops(dt, use_measured) if getattr(gpu, field_) is not None else None)
             for dt, field_ in PEAK_FIELDS.items()}
    rows = []
    for name in preset_names():
        cost = ModelCost.build(preset_config(name), weights, head, kv_dtype_bytes=kv_dtype_bytes,
                               compute_dtype=compute_dtype)
        r = analyze(gpu, cost, name, [1], context, use_measured=use_measured)
        rows.append(PresetFloor(
            preset=name, parameters=r.num_parameters, weight_format=r.weight_format,
            checkpoint_bytes=r.checkpoint_bytes, streamed_bytes=r.streamed_bytes, decode_floor_s=r.decode_floor_s,
            max_tokens_per_s=r.max_tokens_per_s, compute_bound_batch=r.compute_bound_batch,
            fits=r.checkpoint_bytes <= gpu.memory_gb * 1e9,
        ))
    return GpuOverview(gpu=gpu.key, gpu_name=gpu.name, memory_gb=gpu.memory_gb, bandwidth=gpu.bandwidth(use_measured),
                       measured=measured, peaks=peaks, weight_format=weights.name, kv_dtype_bytes=kv_dtype_bytes,
                       context=context, presets=rows)
