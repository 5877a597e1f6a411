"""`llmrs profile`: where a real engine step spends its GPU time, kernel by kernel, against the roofline.

How it measures (needs CuPy and a GPU): the model's weights go on the GPU (a checkpoint, or a synthetic
preset drawn there), the KV cache is filled with random bf16 values, then for each batch size B a decode
step of B sequences, each with `context` tokens already cached, and one prefill of a `prefill_len`-token
prompt are run through `CUDABackend.forward` + `sample`, exactly as the engine runs them:
- wall time: the median of `steps` steps as the engine runs them (CUDA graphs included when enabled), host
  clock around forward + sample (sampling copies the tokens back, so the step is finished);
- kernel times: `steps` more steps with `backend.profiler` set to a `KernelTimer`, which brackets every
  launch (and every cuBLAS call) with a pair of CUDA events; per-kernel times are means over those steps.
  NOTE: each profiled step starts behind a spin kernel (`KernelTimer.hold`) that keeps the GPU busy while
  the host enqueues the whole step; otherwise a host-bound step would put the host's launch gap between
  each kernel's start event and the kernel, and every kernel would look slower than it is;
- GPU busy = sum of kernel times / wall time (what is left is the host: Python, launches, copies).

Each kernel's bytes and FLOPs come from its shapes (`kernel_cost`: the fewest bytes it must move, each input
read once and each output written once; attention reads each sequence's K/V once); achieved GB/s and TFLOP/s
are those over its time, and "% of roof" is the roofline time max(bytes / bandwidth, FLOPs / peak) over the
measured time, with the GPU's ceilings from `llmrs.roofline` (measured ones when present). Categories are the
posts' table: matrix multiply, decode attention, prefill attention, everything else.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from llmrs.errors import UserError

CATEGORIES = ("matrix multiply", "decode attention", "prefill attention", "communication", "everything else")
MATMUL_KINDS = ("matvec", "gemm", "gemm_q4", "matvec_q")
ATTENTION_KINDS = ("attention", "attn_merge", "attn_o")
COMM_KINDS = ("allreduce", "allgather")  # tensor parallel: NCCL on the step's stream (ceiling: the GPU link)


# ---------------------------------------------------------------------- cost of one launch
def kernel_cost(kind: str, dims: tuple) -> tuple[float, float]:
    """(bytes, FLOPs) of one launch from its shapes, as CUDABackend passes them to `_span`."""
    if kind == "matvec_q":  # a quantized weight's own packed bytes (codes + scales + zeros), f32 x
        T, N, K, acc, bias, w_bytes = dims
        nbytes = w_bytes + 4 * T * K + 4 * T * N * (2 if acc else 1) + (4 * N if bias else 0)
        return float(nbytes), 2.0 * T * N * K
    if kind in MATMUL_KINDS:  # (T, N, K, accumulate, bias[, bytes of an output element: 4, or 2 for bf16])
        T, N, K, acc, bias, *rest = dims
        out_b = rest[0] if rest else 4
        x_bytes = 4 if kind == "matvec" else 2  # the GEMM reads x as bf16 (cast separately, or by its producer)
        w_bytes = 4.25 / 8 if kind == "gemm_q4" else 2  # 4-bit codes + an fp16 scale and zero per 128 (AWQ)
        nbytes = w_bytes * N * K + x_bytes * T * K + out_b * T * N * (2 if acc else 1) + (4 * N if bias else 0)
        return float(nbytes), 2.0 * T * N * K
    if kind == "dequant":  # a quantized weight expanded to bf16 for cuBLAS (above the 4-bit GEMM's token limit)
        N, K, w_bytes = dims
        return float(w_bytes + 2 * N * K), float(N * K)
    if kind == "attention":
        T, Hq, Hkv, D, kv_tokens, qk_pairs, S = dims
        out_bytes = 4 * T * Hq * S * (D + 2) if S > 1 else 4 * T * Hq * D  # partials, or the output
        nbytes = 2 * 2 * kv_tokens * Hkv * D + 4 * T * Hq * D + out_bytes
        return float(nbytes), 4.0 * qk_pairs * Hq * D
    if kind == "attn_o":  # one token's attention + the o projection (attn_o_cluster): K / V, q, o's bf16 weights,
        # the heads' partial sums written and read, x read and written
        T, Hq, Hkv, D, kv_tokens, qk_pairs, S, N = dims
        nbytes = 2 * 2 * kv_tokens * Hkv * D + 4 * T * Hq * D + 2 * N * Hq * D + 2 * 4 * T * Hq * N + 2 * 4 * T * N
        return float(nbytes), 4.0 * qk_pairs * Hq * D + 2.0 * T * N * Hq * D
    if kind == "attn_merge":
        T, Hq, D, S = dims
        return float(4 * T * Hq * S * (D + 2) + 4 * T * Hq * D), 3.0 * T * Hq * S * D
    if kind == "rms_norm":  # (n, H) f32 out, or (n, H, 2): bf16 out (rms_norm_bf16, a GEMM's input)
        n, H, *out = dims
        return float((4 + (out[0] if out else 4)) * n * H + 4 * H), 4.0 * n * H
    if kind == "rope_kv":
        T, Hq, Hkv, D = dims
        nbytes = 4 * T * (Hq + 2 * Hkv) * D + 4 * T * (Hq + Hkv) * D + 2 * 2 * T * Hkv * D
        return float(nbytes), 6.0 * T * (Hq + Hkv) * D
    if kind == "silu_mul":  # (T, I) f32 in and out; (T, I, 2): bf16 out (silu_mul_bf16, down's GEMM input);
        # (T, I, 2, 2): bf16 in too (silu_mul_bf16_bf16, after a gate/up GEMM with a bf16 output)
        T, I, *rest = dims
        out_b, in_b = (*rest, 4, 4)[:2]
        return float((2 * in_b + out_b) * T * I), 5.0 * T * I
    if kind == "embedding":
        T, H = dims
        return float(6 * T * H), 0.0
    if kind == "cast":
        (n,) = dims
        return float(6 * n), 0.0
    if kind == "add_bias":
        T, N = dims
        return float(8 * T * N + 4 * N), float(T * N)
    if kind == "sample":  # (S, V[, rows that sample]): a greedy row reads its logits once (the argmax); a sampled
        # row reads them again at least once for its draw (each top-k / top-p radix pass once more; no weights stored)
        S, V, *rest = dims
        sampled = rest[0] if rest else S
        return float(4 * S * V + 4 * sampled * V), float(S * V + 4 * sampled * V)
    if kind == "add":
        (n,) = dims
        return float(12 * n), float(n)
    if kind == "copy":
        (n,) = dims
        return float(8 * n), 0.0
    if kind == "allreduce":  # bytes each GPU sends over its link in a ring all-reduce: 2 (N - 1) / N x payload
        payload, n = dims
        return 2.0 * (n - 1) / n * payload, float(payload // 4 * (n - 1))
    if kind == "allgather":  # each GPU receives the other N - 1 slices
        payload, n = dims
        return float(payload * (n - 1)), 0.0
    return 0.0, 0.0


def category(kind: str, phase: str) -> str:
    if kind in MATMUL_KINDS:
        return "matrix multiply"
    if kind in ATTENTION_KINDS:
        return "prefill attention" if phase == "prefill" else "decode attention"
    if kind in COMM_KINDS:
        return "communication"
    return "everything else"


# ---------------------------------------------------------------------- aggregation (pure)
@dataclass(slots=True)
class KernelRecord:
    """One timed launch."""

    kind: str
    name: str
    ms: float
    nbytes: float
    flops: float


@dataclass(slots=True)
class KernelStat:
    """One kernel (kind + name, e.g. matvec 'qkv') summed over a step's launches, per step."""

    kernel: str
    category: str
    calls: float
    ms: float
    nbytes: float
    flops: float
    gbs: float
    tflops: float
    roof_ms: float
    fraction_of_roof: float
    bound: str


@dataclass(slots=True)
class StepProfile:
    label: str
    phase: str  # "decode" | "prefill"
    batch: int
    tokens: int
    wall_ms: float
    kernel_ms: float
    busy: float
    categories: dict[str, float]  # ms per step
    kernels: list[KernelStat] = field(default_factory=list)

    def share(self, cat: str) -> float:
        return self.categories.get(cat, 0.0) / self.kernel_ms if self.kernel_ms else 0.0


def aggregate(records: list[KernelRecord], steps: int, phase: str, bandwidth: float, peak_flops: float,
              label: str, batch: int, tokens: int, wall_ms: float, link_bandwidth: float | None = None) -> StepProfile:
    """Per-step kernel table and category times from `steps` steps' records; bandwidth in B/s, peak in FLOP/s;
    collectives are set against `link_bandwidth` (B/s per direction between GPUs), not the memory's."""
    assert steps >= 1
    groups: dict[tuple[str, str], list[KernelRecord]] = {}
    for r in records:
        groups.setdefault((r.kind, r.name), []).append(r)
    stats = []
    for (kind, name), rs in groups.items():
        ms = sum(r.ms for r in rs) / steps
        nbytes = sum(r.nbytes for r in rs) / steps
        flops = sum(r.flops for r in rs) / steps
        comm = kind in COMM_KINDS
        mem_ms = nbytes / ((link_bandwidth or bandwidth) if comm else bandwidth) * 1e3
        math_ms = 0.0 if comm else flops / peak_flops * 1e3
        roof = max(mem_ms, math_ms)
        label_k = kind if kind == name else f"{kind} {name}"
        stats.append(KernelStat(
            kernel=label_k, category=category(kind, phase), calls=len(rs) / steps, ms=ms, nbytes=nbytes, flops=flops,
            gbs=nbytes / (ms * 1e-3) / 1e9 if ms > 0 else 0.0, tflops=flops / (ms * 1e-3) / 1e12 if ms > 0 else 0.0,
            roof_ms=roof, fraction_of_roof=roof / ms if ms > 0 else 0.0,
            bound="link" if comm else "memory" if mem_ms >= math_ms else "compute"))
    stats.sort(key=lambda s: -s.ms)
    cats = {c: 0.0 for c in CATEGORIES}
    for s in stats:
        cats[s.category] += s.ms
    kernel_ms = sum(s.ms for s in stats)
    busy = min(1.0, kernel_ms / wall_ms) if wall_ms > 0 else 0.0
    return StepProfile(label=label, phase=phase, batch=batch, tokens=tokens, wall_ms=wall_ms, kernel_ms=kernel_ms,
                       busy=busy, categories=cats, kernels=stats)


def to_json(profiles: list[StepProfile], meta: dict[str, Any]) -> dict[str, Any]:
    return {**meta, "steps": [asdict(p) for p in profiles]}


def from_json(doc: dict[str, Any]) -> tuple[list[StepProfile], dict[str, Any]]:
    """to_json's inverse: a saved profile (`--out`, `--json`) back as steps and meta (`llmrs profile --from`)."""
    try:
        steps = [StepProfile(**{**st, "kernels": [KernelStat(**k) for k in st["kernels"]]}) for st in doc["steps"]]
    except (KeyError, TypeError) as e:
        raise UserError(f"not an llmrs profile (its JSON from --out or --json): {e}") from None
    return steps, {k: v for k, v in doc.items() if k != "steps"}


def read_json(path: Path) -> dict[str, Any]:
    """A saved profile's JSON (`--out`, `--json`; a --timeline's too) as a dict, or a UserError."""
    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        raise UserError(f"cannot read profile {path}: {e}") from None
    if not isinstance(doc, dict):
        raise UserError(f"{path}: not an llmrs profile (its JSON from --out or --json)")
    return doc


def render(console: Any, profiles: list[StepProfile], meta: dict[str, Any], top: int = 12) -> None:
    """The posts' table (category shares + GPU busy, one column per step), then each step's kernels."""
    from rich.table import Table

    t = Table(title=f"What the GPU was doing: {meta.get('model')} on {meta.get('gpu_name')} "
                    f"(context {meta.get('context')})")
    t.add_column("")
    for p in profiles:
        t.add_column(p.label, justify="right")
    for c in CATEGORIES:
        t.add_row(c, *(f"{100 * p.share(c):.1f}%" for p in profiles))
    t.add_row("GPU busy", *(f"{100 * p.busy:.1f}%" for p in profiles))
    t.add_row("step wall ms", *(f"{p.wall_ms:.3f}" for p in profiles))
    t.add_row("kernel ms", *(f"{p.kernel_ms:.3f}" for p in profiles))
    t.add_row("tokens / s", *(f"{p.tokens / p.wall_ms * 1e3:,.0f}" if p.wall_ms else "-" for p in profiles))
    console.print(t)
    bw, pk = meta.get("bandwidth_gbs"), meta.get("peak_tflops")
    for p in profiles:
        k = Table(title=f"{p.label}: kernels per step (ceilings {bw:,.0f} GB/s, {pk:,.0f} TFLOP/s bf16)")
        for col in ("kernel", "calls", "ms", "share", "GB/s", "TFLOP/s", "% of roof", "bound"):
            k.add_column(col, justify="left" if col == "kernel" else "right")
        for s in p.kernels[:top]:
            k.add_row(s.kernel, f"{s.calls:g}", f"{s.ms:.3f}", f"{100 * s.ms / p.kernel_ms:.1f}%",
                      f"{s.gbs:,.0f}", f"{s.tflops:,.1f}", f"{100 * s.fraction_of_roof:.0f}%", s.bound)
        rest = p.kernels[top:]
        if rest:
            k.add_row(f"({len(rest)} more)", "", f"{sum(s.ms for s in rest):.3f}",
                      f"{100 * sum(s.ms for s in rest) / p.kernel_ms:.1f}%", "", "", "", "")
        console.print(k)


def plot(profiles: list[StepProfile], meta: dict[str, Any], path: Path) -> Path:
    """Every kernel of every step as a point on the roofline chart (log-log FLOP/s against FLOP/byte)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise UserError("--plot needs matplotlib: in the llmrs checkout, pip install -e '.[roofline]'") from None
    bw, peak = meta["bandwidth_gbs"] * 1e9, meta["peak_tflops"] * 1e12
    pts = [(s.flops / s.nbytes, s.flops / (s.ms * 1e-3), s, p) for p in profiles for s in p.kernels
           if s.flops > 0 and s.nbytes > 0 and s.ms > 0]
    if not pts:
        raise UserError("--plot: no kernel with FLOPs to place")
    xs = [x for x, *_ in pts]
    x = np.logspace(np.log10(min(0.1, min(xs) / 2)), np.log10(max(4 * peak / bw, max(xs) * 2)), 200)
    fig, ax = plt.subplots(figsize=(9, 6))
    ax.plot(x, np.minimum(peak, bw * x) / 1e12, "k-", lw=2, label=f"{bw / 1e9:,.0f} GB/s, {peak / 1e12:,.0f} TFLOP/s")
    colors = {c: f"C{i}" for i, c in enumerate(CATEGORIES)}
    markers = "osD^v<>px*h"
    for xi, y, s, p in pts:
        ax.plot(xi, y / 1e12, markers[profiles.index(p) % len(markers)], color=colors[s.category], ms=6, alpha=0.8)
    for c in CATEGORIES:
        ax.plot([], [], "o", color=colors[c], label=c)
    for i, p in enumerate(profiles):
        ax.plot([], [], markers[i % len(markers)], color="grey", label=p.label)
    from llmrs.roofline.plot import save_roofline_axes

    return save_roofline_axes(fig, ax, path, f"llmrs profile: {meta.get('model')} on {meta.get('gpu_name')}",
                              "achieved TFLOP/s")


# ---------------------------------------------------------------------- the timer (GPU)
SPIN_SRC = r"""
extern "C" __global__ void llmrs_spin(long long ns) {
    unsigned long long t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    do {
        __nanosleep(1000);
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    } while (t - t0 < (unsigned long long)ns);
}
"""


class KernelTimer:
    """Set as `backend.profiler`: brackets each launch with two CUDA events from a reused pool."""

    def __init__(self, cp: Any):
        self.cp = cp
        self._spin = cp.RawKernel(SPIN_SRC, "llmrs_spin")
        self.pool: list[Any] = []
        self.used = 0
        self.pending: list[tuple[str, tuple, Any, Any]] = []
        self.records: list[KernelRecord] = []

    def _event(self) -> Any:
        if self.used == len(self.pool):
            self.pool.append(self.cp.cuda.Event())
        e = self.pool[self.used]
        self.used += 1
        return e

    def hold(self, ms: float) -> None:
        """Keep the GPU busy for `ms` (one thread spinning on the global timer) while the host enqueues a step."""
        self._spin((1,), (1,), (np.int64(ms * 1e6),))

    def span(self, kind: str, name: str, dims: tuple) -> _Span:
        return _Span(self, kind, name, dims)

    def collect(self) -> None:
        """Wait for the GPU, turn pending event pairs into records, recycle the events."""
        self.cp.cuda.Device().synchronize()
        get = self.cp.cuda.get_elapsed_time
        for (kind, name), dims, e0, e1 in self.pending:
            nbytes, flops = kernel_cost(kind, dims)
            self.records.append(KernelRecord(kind, name, float(get(e0, e1)), nbytes, flops))
        self.pending.clear()
        self.used = 0


class _Span:
    __slots__ = ("t", "key", "dims", "e0")

    def __init__(self, t: KernelTimer, kind: str, name: str, dims: tuple):
        self.t, self.key, self.dims = t, (kind, name), dims

    def __enter__(self) -> _Span:
        self.e0 = self.t._event()
        self.e0.record()
        return self

    def __exit__(self, *exc: Any) -> None:
        e1 = self.t._event()
        e1.record()
        self.t.pending.append((self.key, self.dims, self.e0, e1))


# ---------------------------------------------------------------------- running real steps (GPU)
@dataclass(slots=True)
class Ceilings:
    gpu_name: str
    bandwidth_gbs: float
    peak_tflops: float
    source: str  # "measured now" | "measured (cache)" | "datasheet"


def ceilings(gpu: str, measure: bool) -> Ceilings:
    from llmrs.roofline.gpus import get_gpu

    spec = get_gpu(gpu)
    if measure:
        from llmrs.roofline.measured import import_cupy, measure_bandwidth, measure_bf16_gemm

        cp = import_cupy()
        bw = measure_bandwidth(cp, 1 << 30)
        tf, _ = measure_bf16_gemm(cp)
        return Ceilings(spec.name, bw, tf, "measured now")
    if spec.measured_bandwidth_gbs and spec.measured_bf16_tflops:
        return Ceilings(spec.name, spec.measured_bandwidth_gbs, spec.measured_bf16_tflops, "measured (cache)")
    return Ceilings(spec.name, spec.bandwidth_gbs, float(spec.bf16_tflops or 0) or 1.0, "datasheet")


def _load(model: str, num_blocks: int, block_size: int, graphs: bool) -> tuple[Any, Any, Any]:
    from llmrs.backends.cuda import CUDABackend, CUDAModel
    from llmrs.model.loader import load
    from llmrs.model.decoder import build_weights

    loaded = load(model)
    backend = CUDABackend(loaded.config, num_blocks=num_blocks, block_size=block_size, cuda_graphs=graphs)
    if loaded.tensors is None:
        from llmrs.model.synthetic import synthetic_weights

        weights = synthetic_weights(loaded, backend)  # "synthetic:PRESET-awq": packed 4-bit linears
    else:
        weights = build_weights(loaded.config, loaded.tensors, backend)
    return loaded.config, backend, CUDAModel(loaded.config, weights, backend)


def _fill_kv(backend: Any, seed: int = 0) -> None:
    """Random bf16 values of both signs, magnitudes 2^-7..1, in every cache block (never time on zeros)."""
    cp = backend.cp
    rs = cp.random.RandomState(seed)
    for cache in backend.k_cache + backend.v_cache:
        flat = cache.reshape(-1)
        step = 1 << 26
        for i in range(0, flat.size, step):
            n = min(step, flat.size - i)
            v = rs.randint(0x3C00, 0x3F80, size=n, dtype=cp.int32) | (rs.randint(0, 2, size=n, dtype=cp.int32) << 15)
            flat[i:i + n] = v.astype(cp.uint16)


def run_profile(model: str, batches: list[int], context: int, prefill_len: int | None = None, steps: int = 10,
                warmup: int = 3, gpu: str = "auto", measure: bool = False, graphs: bool = True,
                progress: Any = None, tp: int = 1, link_gbs: float | None = None, prefill_seqs: int = 1,
                ) -> tuple[list[StepProfile], dict[str, Any]]:
    """Profile decode at each batch size (every sequence at `context` cached tokens) and one prefill step of
    `prefill_seqs` prompts of `prefill_len` tokens each (several: a loaded server's chunked step, e.g. 32 x 256 =
    the default 8192-token budget; the label then reads "prefill 32x256").

    With `tp` > 1 the model runs tensor-parallel (llmrs.engine.tp_nccl: rank 0 here, one worker process per
    other GPU, every step broadcast as the engine does); rank 0's launches and NCCL calls are timed, its
    figures are per GPU (its shard), and the collectives are set against `link_gbs` (default: the GPU's NVLink
    figure in the database, one direction)."""
    from llmrs.backends.cuda import cuda_available

    if context < 1 or steps < 1 or prefill_seqs < 1 or (prefill_len is not None and prefill_len < 1):
        raise UserError("--context, --steps, --prefill-len and --prefill-seqs must be at least 1")
    ok, why = cuda_available()
    if not ok:
        raise UserError(f"llmrs profile times kernels on a GPU and needs CuPy and an NVIDIA GPU: {why}")
    prefill_len = prefill_len or context
    ceil = ceilings(gpu, measure)
    bs = 16
    per_seq = -(-(context + 1) // bs)
    num_blocks = max(max(batches) * per_seq, prefill_seqs * -(-prefill_len // bs))
    say = progress or (lambda msg: None)
    say(f"loading {model} ({num_blocks} KV blocks{f', tensor parallel x{tp}' if tp > 1 else ''})")
    runner = None
    if tp > 1:
        from llmrs.model.loader import load
        from llmrs.engine.tp_nccl import NcclTPRunner
        from llmrs.roofline.gpus import get_gpu

        if link_gbs is None:
            link_gbs = get_gpu(gpu).nvlink_gbs
            if not link_gbs:
                raise UserError(f"{ceil.gpu_name} has no NVLink figure in the GPU database; pass --tp-link-gbs")
        runner = NcclTPRunner(load(model), model, tp, block_size=bs, num_blocks=num_blocks,
                              cuda_graphs=None if graphs else False)
        backend = runner.backend
        config = backend.config  # rank 0's shard (its vocabulary slice, heads, MLP columns)
        forward_device = runner.forward_device
    else:
        config, backend, m = _load(model, num_blocks, bs, graphs)
        forward_device = m.forward_device
    try:
        return _profile_steps(model, backend, config, forward_device, batches, context, prefill_len, steps, warmup,
                              ceil, per_seq, bs, say, tp, link_gbs, prefill_seqs)
    finally:
        if runner is not None:
            runner.shutdown()


def greedy_state() -> Any:
    """A profiled sequence's sampling state: greedy, one token of history."""
    from llmrs.engine.sampling import SamplingParams, SamplingState, make_generator

    return SamplingState(SamplingParams(temperature=0.0), make_generator(0), [1], [], [])


def decode_batch(rng: np.random.Generator, vocab: int, B: int, context: int, per_seq: int, bs: int) -> Any:
    """A decode step of B sequences, each one random token after `context` cached ones in its own per_seq blocks."""
    from llmrs.engine.batch import build_step_batch

    seqs = [(rng.integers(0, vocab, 1).tolist(), context, list(range(b * per_seq, (b + 1) * per_seq)), True)
            for b in range(B)]
    return build_step_batch(seqs, bs)


def _profile_steps(model: str, backend: Any, config: Any, forward_device: Any, batches: list[int], context: int,
                   prefill_len: int, steps: int, warmup: int, ceil: Ceilings, per_seq: int, bs: int, say: Any,
                   tp: int, link_gbs: float | None, prefill_seqs: int = 1) -> tuple[list[StepProfile], dict[str, Any]]:
    from llmrs.engine.batch import build_step_batch

    _fill_kv(backend)  # NOTE: tensor parallel: rank 0's cache only (the workers' caches stay zeros)
    backend.synchronize()
    rng = np.random.default_rng(0)
    V = config.vocab_size if tp == 1 else backend.tp.vocab_size

    def run_steps(batch: Any, states: list, n: int, timer: KernelTimer | None, hold_ms: float = 0.0) -> float:
        backend.profiler = timer
        times = []
        for _ in range(n):
            if timer is not None:
                timer.hold(hold_ms)
            t = time.perf_counter()
            backend.sample(forward_device(batch), states)
            times.append(time.perf_counter() - t)
            if timer is not None:
                timer.collect()
        backend.profiler = None
        return 1e3 * float(np.median(times))

    plans = []
    for B in batches:
        plans.append((f"decode B={B}", "decode", B, B, decode_batch(rng, V, B, context, per_seq, bs)))
    nb = -(-prefill_len // bs)  # each prompt its own blocks
    prompts = [(rng.integers(0, V, prefill_len).tolist(), 0, list(range(i * nb, (i + 1) * nb)), True)
               for i in range(prefill_seqs)]
    label = f"prefill {prefill_len}" if prefill_seqs == 1 else f"prefill {prefill_seqs}x{prefill_len}"
    plans.append((label, "prefill", prefill_seqs, prefill_seqs * prefill_len, build_step_batch(prompts, bs)))
    profiles = []
    for label, phase, B, tokens, batch in plans:
        say(f"{label}: {warmup} warm-up + {steps} timed + {steps} profiled steps")
        states = [greedy_state() for _ in range(B)]
        run_steps(batch, states, warmup, None)
        wall = run_steps(batch, states, steps, None)
        saved, backend.graphs = backend.graphs, None
        eager_ms = run_steps(batch, states, 2, None)  # how long the host takes to enqueue an eager step, at most
        backend.graphs = saved
        timer = KernelTimer(backend.cp)
        run_steps(batch, states, 1, timer, 50.0)  # warm the event pool and the spin kernel
        timer.records.clear()
        run_steps(batch, states, steps, timer, min(500.0, 2.0 + 4.0 * eager_ms))
        profiles.append(aggregate(timer.records, steps, phase, ceil.bandwidth_gbs * 1e9, ceil.peak_tflops * 1e12,
                                  label, B, tokens, wall, link_bandwidth=link_gbs * 1e9 if link_gbs else None))
    meta = {"model": model, "gpu_name": ceil.gpu_name, "bandwidth_gbs": round(ceil.bandwidth_gbs, 1),
            "peak_tflops": round(ceil.peak_tflops, 1), "ceilings": ceil.source, "context": context,
            "prefill_len": prefill_len, "prefill_seqs": prefill_seqs, "steps": steps,
            "cuda_graphs": backend.graphs is not None,
            "tensor_parallel": tp, "link_gbs": link_gbs,
            "note": "wall = median step with the engine's path (graphs when on); kernel times from eager "
                    "steps with CUDA events around every launch"}
    return profiles, meta


def writable_file(path: Path, flag: str) -> None:
    """Make `path`'s folder if needed; a place that cannot be written (a file in the way, no such place, no
    permission) is a UserError naming `flag`. Checked before a profile runs, so a long run never ends unable to save."""
    d = Path(path).parent
    try:
        d.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UserError(f"{flag} {path}: cannot write there ({e.strerror or e})") from None
    if Path(path).is_dir():
        raise UserError(f"{flag} {path}: cannot write there (a directory)")
    if not os.access(d, os.W_OK):
        raise UserError(f"{flag} {path}: cannot write there (no permission)")


def save_json(path: Path, profiles: list[StepProfile], meta: dict[str, Any]) -> None:
    """(`llmrs profile` checks the place with writable_file before it runs; a write that fails anyway says so.)"""
    try:
        Path(path).write_text(json.dumps(to_json(profiles, meta), indent=1))
    except OSError as e:
        raise UserError(f"--out {path}: cannot write there ({e.strerror or e})") from None
