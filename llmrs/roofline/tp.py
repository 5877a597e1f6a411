"""`llmrs roofline --tp N`: the per-GPU floors of a tensor-parallel decode step and its communication share.

Megatron-style sharding (llmrs/engine/tp.py) gives every GPU 1/N of the weights, of the KV cache (split by KV
heads) and of the FLOPs; the price is two all-reduces of the hidden state per layer (after o_proj and after
down). Per decode step of `batch` tokens:

    all-reduce payload  = 2 per layer x layers x tokens x hidden x comm bytes (2: bf16)
    bytes through a GPU = payload x 2(N-1)/N           (ring all-reduce: reduce-scatter + all-gather)
    communication time  = those bytes / link bandwidth  (NVLink, one direction; nccl-tests' "busbw")
    step floor          = max(per-GPU memory floor, per-GPU compute floor) + communication time

NOTE: the all-reduces sit between a layer's matmuls, so the step adds them rather than overlapping them. Not
counted: each all-reduce's latency (2 x layers + 1 NCCL calls per step, a few microseconds each: at batch 1
this, not bandwidth, dominates), the embedding all-reduce and logits all-gather (one each per step, small),
and replicated norms (counted as split). llmrs's own NCCL path all-reduces f32 today (comm bytes 4).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from llmrs.errors import UserError
from llmrs.roofline.analysis import Roofs
from llmrs.roofline.cost import ModelCost
from llmrs.roofline.gpus import GpuSpec


@dataclass(slots=True)
class TPPoint:
    batch: int
    weight_bytes_per_gpu: float
    kv_bytes_per_gpu: float
    memory_s: float
    compute_s: float
    allreduce_bytes: float  # payload of one step's all-reduces (what each rank contributes)
    ring_bytes_per_gpu: float  # what a ring all-reduce moves through each GPU's link
    comm_s: float
    step_s: float
    comm_share: float
    tokens_per_s: float
    memory_needed_gb_per_gpu: float
    fits: bool


@dataclass(slots=True)
class TensorParallel:
    tp: int
    link_gbs: float
    link_source: str
    comm_dtype_bytes: float
    allreduces_per_step: int
    checkpoint_bytes_per_gpu: float
    decode_floor_s: float  # batch 1, no context: per-GPU streamed bytes / bandwidth + communication
    decode_floor_comm_s: float
    points: list[TPPoint] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def analyze_tp(gpu: GpuSpec, cost: ModelCost, roofs: Roofs, tp: int, batches: list[int], context: int,
               link_gbs: float | None = None, comm_dtype_bytes: float = 2.0) -> TensorParallel:
    if tp < 1:
        raise UserError(f"--tp must be at least 1 (got {tp})")
    c = cost.config
    if c.num_key_value_heads % tp:
        raise UserError(f"--tp {tp} does not divide the model's {c.num_key_value_heads} KV heads")
    if link_gbs is None:
        if not gpu.nvlink_gbs:
            raise UserError(f"{gpu.name} has no NVLink figure in the GPU database; pass --tp-link-gbs (e.g. the "
                            "busbw nccl-tests all_reduce_perf measures)")
        link_gbs, source = float(gpu.nvlink_gbs), f"datasheet: {gpu.sources.get('nvlink_gbs', '')}"
    else:
        source = "--tp-link-gbs"
    link = link_gbs * 1e9
    ring = 2 * (tp - 1) / tp

    def comm(tokens: int) -> tuple[float, float, float]:
        payload = 2 * c.num_hidden_layers * tokens * c.hidden_size * comm_dtype_bytes
        moved = payload * ring
        return payload, moved, moved / link

    points = []
    for b in batches:
        step = cost.decode_step(b, context)
        mem_s, comp_s = step.bytes / tp / roofs.bandwidth, step.flops / tp / roofs.peak_flops
        payload, moved, comm_s = comm(b)
        step_s = max(mem_s, comp_s) + comm_s
        needed = (cost.checkpoint_bytes + b * context * cost.kv_bytes_per_token) / tp
        points.append(TPPoint(
            batch=b, weight_bytes_per_gpu=step.weight_bytes / tp,
            kv_bytes_per_gpu=(step.kv_read_bytes + step.kv_write_bytes) / tp, memory_s=mem_s, compute_s=comp_s,
            allreduce_bytes=payload, ring_bytes_per_gpu=moved, comm_s=comm_s, step_s=step_s,
            comm_share=comm_s / step_s if step_s else 0.0, tokens_per_s=b / step_s if step_s else 0.0,
            memory_needed_gb_per_gpu=needed / 1e9, fits=needed <= gpu.memory_gb * 1e9,
        ))
    floor = cost.decode_step(1, 0)
    floor_comm = comm(1)[2]
    return TensorParallel(
        tp=tp, link_gbs=link_gbs, link_source=source, comm_dtype_bytes=comm_dtype_bytes,
        allreduces_per_step=2 * c.num_hidden_layers, checkpoint_bytes_per_gpu=cost.checkpoint_bytes / tp,
        decode_floor_s=(floor.weight_bytes + floor.gather_bytes) / tp / roofs.bandwidth + floor_comm,
        decode_floor_comm_s=floor_comm, points=points,
    )


def print_tp(console: Any, t: TensorParallel, context: int) -> None:
    from rich.table import Table

    from llmrs.roofline.render import gb, secs

    console.print(f"[bold]tensor parallel x{t.tp}[/]: {gb(t.checkpoint_bytes_per_gpu)} of weights per GPU; "
                  f"{t.allreduces_per_step} all-reduces per step over {t.link_gbs:,.0f} GB/s per direction "
                  f"({t.link_source}); ring moves 2(N-1)/N = {2 * (t.tp - 1) / t.tp:.2f}x the payload; "
                  f"batch-1 floor [bold]{secs(t.decode_floor_s)}[/] per token "
                  f"({secs(t.decode_floor_comm_s)} of it communication)")
    tab = Table(title=f"per-GPU decode step at TP={t.tp} (context {context}; all-reduce in "
                      f"{t.comm_dtype_bytes:g}-byte values)")
    for col in ("batch", "weights/GPU", "KV/GPU", "memory", "compute", "all-reduce payload", "ring bytes/GPU",
                "comm", "step", "comm share", "tok/s ceiling", "memory/GPU"):
        tab.add_column(col, justify="right")
    for p in t.points:
        need = gb(p.memory_needed_gb_per_gpu * 1e9) + ("" if p.fits else " [red](> GPU)[/]")
        tab.add_row(str(p.batch), gb(p.weight_bytes_per_gpu), gb(p.kv_bytes_per_gpu), secs(p.memory_s),
                    secs(p.compute_s), gb(p.allreduce_bytes), gb(p.ring_bytes_per_gpu), secs(p.comm_s),
                    secs(p.step_s), f"{100 * p.comm_share:.1f}%", f"{p.tokens_per_s:,.0f}", need)
    console.print(tab)
    console.print("[dim]note: bandwidth only; each of the per-step all-reduces also costs NCCL latency (a few us), "
                  "which dominates at small batches[/]")
