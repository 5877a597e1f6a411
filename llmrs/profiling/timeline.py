"""`llmrs profile --timeline`: a graphed decode step as the GPU runs it, every kernel's start and end.

`llmrs profile` times kernels in eager steps with a pair of CUDA events around each launch. That gives each
kernel's own time, but not what it costs inside the step the engine really runs: a CUDA graph whose kernels
start early under programmatic dependent launch (PDL), load their weights, and wait at griddepcontrol.wait for
the kernel before them. There a kernel's cost is the time it adds to the step, not its duration.

How it measures (needs CuPy, a GPU, and PyTorch, whose profiler reads CUPTI's kernel records):
- one eager step with `backend.profiler` set to a `SpanMarker`: before each of the backend's spans (a launch, or
  the few launches of one operation, as `llmrs profile` times them) an empty `llmrs_mark` kernel whose grid size
  is the span's number; so the trace says which kernels each span launched, with the span's shapes (bytes);
- then `steps` graphed steps, each after an empty separator kernel (a one-block grid of 2 threads);
- the graphed steps' kernels are matched to the eager step's by name and order (difflib), which names each
  graphed kernel's span.
Per graphed kernel, in start order: `exposed` = how much later the step's last end is once it has run
(end - max(start, the latest end before it), at least 0), `gap` = idle GPU time before it, `duration` = end -
start (with PDL that includes its wait). The exposed times and gaps add up to the step's span on the GPU, so
`exposed` is where the step's time goes. Each span's floor = its bytes / bandwidth (`llmrs.profiling.profile.kernel_cost`):
exposed - floor is what the kernel costs above its bytes (latency, hand-offs, launch).
"""

from __future__ import annotations

import difflib
import json
import os
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from llmrs import envs
from llmrs.errors import UserError

MARK_SRC = 'extern "C" __global__ void llmrs_mark() {}'
MARK_NAME = "llmrs_mark"
SEPARATOR_BLOCK = 2  # a separator launches (1,) x (2,); a span marker (i + 1,) x (1,)


# ---------------------------------------------------------------------- the markers (GPU)
class SpanMarker:
    """Set as `backend.profiler` for one eager step: an `llmrs_mark` launch with grid (i + 1) opens span i."""

    def __init__(self, cp: Any):
        self._mark = cp.RawKernel(MARK_SRC, MARK_NAME)
        self.spans: list[tuple[str, str, tuple]] = []

    def span(self, kind: str, name: str, dims: tuple) -> _Mark:
        return _Mark(self, kind, name, dims)

    def separator(self) -> None:
        self._mark((1,), (SEPARATOR_BLOCK,), ())


class _Mark:
    __slots__ = ("t", "key")

    def __init__(self, t: SpanMarker, kind: str, name: str, dims: tuple):
        self.t, self.key = t, (kind, name, tuple(dims))

    def __enter__(self) -> _Mark:
        self.t.spans.append(self.key)
        self.t._mark((len(self.t.spans),), (1,), ())
        return self

    def __exit__(self, *exc: Any) -> None:
        pass


# ---------------------------------------------------------------------- the trace (pure)
@dataclass(slots=True)
class Kernel:
    name: str
    start_us: float
    end_us: float
    grid: tuple = ()
    block: tuple = ()


def kernels_from_trace(doc: dict[str, Any]) -> list[Kernel]:
    """The kernel records of a Chrome trace (torch.profiler's export_chrome_trace), in start order."""
    out = []
    for ev in doc.get("traceEvents", []):
        if not isinstance(ev, dict) or str(ev.get("cat", "")).lower() != "kernel" or ev.get("ph") != "X":
            continue
        args = ev.get("args") or {}
        ts, dur = float(ev["ts"]), float(ev.get("dur", 0.0))
        out.append(Kernel(str(ev.get("name", "")), ts, ts + dur, tuple(args.get("grid") or ()),
                          tuple(args.get("block") or ())))
    out.sort(key=lambda k: (k.start_us, k.end_us))
    return out


def _is_mark(k: Kernel) -> bool:
    return k.name == MARK_NAME or k.name.endswith(MARK_NAME)


def _is_separator(k: Kernel) -> bool:
    return _is_mark(k) and tuple(k.block[:1]) == (SEPARATOR_BLOCK,)


def split_trace(kernels: list[Kernel]) -> tuple[list[tuple[Kernel, int | None]], list[list[Kernel]]]:
    """(the eager step's kernels, each with its span's index (None before the first marker)), [each graphed
    step's kernels]): the eager step runs up to the first separator, each graphed step after one."""
    eager: list[tuple[Kernel, int | None]] = []
    steps: list[list[Kernel]] = []
    span: int | None = None
    for k in kernels:
        if _is_separator(k):
            steps.append([])
        elif _is_mark(k):
            span = int(k.grid[0]) - 1 if k.grid else None
        elif steps:
            steps[-1].append(k)
        else:
            eager.append((k, span))
    return eager, [s for s in steps if s]


def match_spans(eager: list[tuple[Kernel, int | None]], step: list[Kernel]) -> list[int | None]:
    """Each graphed kernel's span index, from the eager kernel of the same name in the same place (difflib's
    matching blocks over the two name sequences); None where the graph has a kernel the eager step has not."""
    a = [k.name for k, _ in eager]
    b = [k.name for k in step]
    out: list[int | None] = [None] * len(step)
    for blk in difflib.SequenceMatcher(None, a, b, autojunk=False).get_matching_blocks():
        for i in range(blk.size):
            out[blk.b + i] = eager[blk.a + i][1]
    return out


@dataclass(slots=True)
class Row:
    """One kernel of the graphed step (means over the steps)."""

    index: int
    name: str
    span: int | None
    role: str
    exposed_us: float
    gap_us: float
    duration_us: float


def step_rows(step: list[Kernel]) -> list[tuple[float, float, float]]:
    """(exposed, gap, duration) per kernel of one step, in start order (see the module's docstring)."""
    out = []
    last = None
    for k in step:
        if last is None:
            gap, exposed = 0.0, k.end_us - k.start_us
            last = k.end_us
        else:
            gap = max(0.0, k.start_us - last)
            exposed = max(0.0, k.end_us - max(k.start_us, last))
            last = max(last, k.end_us)
        out.append((exposed, gap, k.end_us - k.start_us))
    return out


@dataclass(slots=True)
class RoleStat:
    """One operation (kind + name, e.g. matvec 'qkv') summed over a step's layers."""

    role: str
    calls: int
    exposed_us: float
    duration_us: float
    floor_us: float

    @property
    def above_floor_us(self) -> float:
        return self.exposed_us - self.floor_us


@dataclass(slots=True)
class Timeline:
    label: str
    batch: int
    steps: int
    wall_ms: float  # the engine's step (host clock, graphs), median
    span_us: float  # first kernel's start to last kernel's end on the GPU, mean
    gap_us: float  # GPU idle inside that span, mean
    floor_us: float  # the step's bytes / bandwidth
    roles: list[RoleStat] = field(default_factory=list)
    rows: list[Row] = field(default_factory=list)
    unmatched: int = 0  # graphed kernels with no eager twin (no span: no floor)


def role_of(span: tuple | None, kernel: str = "") -> str:
    """A span's operation as `llmrs profile` names it; a graphed kernel with no eager twin by its own name (a graph
    captured for a longer context than the eager step's may split its attention differently: attn_merge)."""
    if span is None:
        return f"(graph only) {kernel}"
    kind, name = span[0], span[1]
    return kind if kind == name else f"{kind} {name}"


def analyze(eager: list[tuple[Kernel, int | None]], steps: list[list[Kernel]], spans: list[tuple],
            bandwidth: float, label: str = "decode", batch: int = 1, wall_ms: float = 0.0) -> Timeline:
    """The graphed steps' kernels as a Timeline: per kernel (mean over the steps that launched the usual number of
    kernels) and per role, against each span's bytes at `bandwidth` (B/s)."""
    from llmrs.profiling.profile import kernel_cost

    if not steps:
        raise UserError("the trace holds no graphed step's kernels (did the profiler see the GPU's kernels?)")
    counts = [len(s) for s in steps]
    n = max(set(counts), key=counts.count)
    use = [s for s in steps if len(s) == n]
    per = [step_rows(s) for s in use]
    idx = match_spans(eager, use[0])
    rows = []
    for j in range(n):
        span = spans[idx[j]] if idx[j] is not None and 0 <= idx[j] < len(spans) else None
        rows.append(Row(j, use[0][j].name, idx[j], role_of(span, use[0][j].name), sum(p[j][0] for p in per) / len(per),
                        sum(p[j][1] for p in per) / len(per), sum(p[j][2] for p in per) / len(per)))
    # each span's floor once (a span of several kernels: under its first kernel's role)
    by_span: dict[int, list[Row]] = {}
    for r in rows:
        if r.span is not None:
            by_span.setdefault(r.span, []).append(r)
    floors: dict[int, float] = {}
    for si, rs in by_span.items():
        nbytes, _ = kernel_cost(spans[si][0], spans[si][2]) if si < len(spans) else (0.0, 0.0)
        floors[si] = nbytes / bandwidth * 1e6
    roles: dict[str, RoleStat] = {}
    for r in rows:
        st = roles.setdefault(r.role, RoleStat(r.role, 0, 0.0, 0.0, 0.0))
        st.calls += 1
        st.exposed_us += r.exposed_us
        st.duration_us += r.duration_us
    for si, f in floors.items():
        roles[by_span[si][0].role].floor_us += f
    span_us = sum(max(k.end_us for k in s) - s[0].start_us for s in use) / len(use)
    return Timeline(label=label, batch=batch, steps=len(use), wall_ms=wall_ms, span_us=span_us,
                    gap_us=sum(r.gap_us for r in rows), floor_us=sum(floors.values()),
                    roles=sorted(roles.values(), key=lambda s: -s.exposed_us), rows=rows,
                    unmatched=sum(1 for i in idx if i is None))


# ---------------------------------------------------------------------- output (pure)
def to_json(timelines: list[Timeline], meta: dict[str, Any]) -> dict[str, Any]:
    return {**meta, "kind": "timeline", "timelines": [asdict(t) for t in timelines]}


def from_json(doc: dict[str, Any]) -> tuple[list[Timeline], dict[str, Any]]:
    try:
        tls = [Timeline(**{**t, "roles": [RoleStat(**r) for r in t["roles"]], "rows": [Row(**r) for r in t["rows"]]})
               for t in doc["timelines"]]
    except (KeyError, TypeError) as e:
        raise UserError(f"not an llmrs timeline (its JSON from --timeline --out): {e}") from None
    return tls, {k: v for k, v in doc.items() if k != "timelines"}


def render(console: Any, timelines: list[Timeline], meta: dict[str, Any], top: int = 12) -> None:
    from rich.table import Table

    bw = meta.get("bandwidth_gbs")
    for tl in timelines:
        t = Table(title=f"{meta.get('model')}, {tl.label}: the graphed step on the GPU ({tl.steps} steps, "
                        f"{bw:,.0f} GB/s): span {tl.span_us:,.1f} us, idle {tl.gap_us:,.1f} us, bytes' floor "
                        f"{tl.floor_us:,.1f} us ({100 * tl.floor_us / tl.span_us:.1f}% of the span), wall "
                        f"{tl.wall_ms:.3f} ms")
        for col in ("operation", "calls", "exposed us", "share", "floor us", "above floor us", "% of roof",
                    "kernel us"):
            t.add_column(col, justify="left" if col == "operation" else "right")
        for s in tl.roles[:top]:
            t.add_row(s.role, f"{s.calls}", f"{s.exposed_us:,.1f}", f"{100 * s.exposed_us / tl.span_us:.1f}%",
                      f"{s.floor_us:,.1f}", f"{s.above_floor_us:,.1f}",
                      f"{100 * s.floor_us / s.exposed_us:.0f}%" if s.exposed_us > 0 else "-", f"{s.duration_us:,.1f}")
        rest = tl.roles[top:]
        if rest:
            t.add_row(f"({len(rest)} more)", f"{sum(s.calls for s in rest)}", f"{sum(s.exposed_us for s in rest):,.1f}",
                      "", f"{sum(s.floor_us for s in rest):,.1f}", "", "", "")
        t.add_row("idle (gaps)", "", f"{tl.gap_us:,.1f}", f"{100 * tl.gap_us / tl.span_us:.1f}%", "", "", "", "")
        console.print(t)
        layer = one_layer(tl)
        if layer:
            k = Table(title=f"{tl.label}: one layer (the middle one), kernel by kernel: exposed + overlap = duration "
                            f"(with PDL a kernel starts during the one before it)")
            for col in ("kernel", "operation", "exposed us", "overlap us", "duration us", "idle before us"):
                k.add_column(col, justify="left" if col in ("kernel", "operation") else "right")
            for r in layer:
                k.add_row(r.name, r.role, f"{r.exposed_us:.2f}", f"{r.duration_us - r.exposed_us:.2f}",
                          f"{r.duration_us:.2f}", f"{r.gap_us:.2f}")
            console.print(k)
        if tl.unmatched:
            console.print(f"[yellow]{tl.unmatched} graphed kernels had no eager twin (no span, no floor): "
                          f"'(graph only)' rows[/yellow]")


def one_layer(tl: Timeline) -> list[Row]:
    """The rows of one decoder layer, the middle one: after a down projection up to the next (every model has one a
    layer); [] when the step has fewer than two."""
    downs = [i for i, r in enumerate(tl.rows) if r.role.endswith(" down") or r.role.endswith(" down+norm")]
    if len(downs) < 2:
        return []
    k = (len(downs) - 1) // 2
    return tl.rows[downs[k] + 1:downs[k + 1] + 1]


def save_json(path: Path, timelines: list[Timeline], meta: dict[str, Any]) -> None:
    try:
        Path(path).write_text(json.dumps(to_json(timelines, meta), indent=1))
    except OSError as e:
        raise UserError(f"--out {path}: cannot write there ({e.strerror or e})") from None


# ---------------------------------------------------------------------- capture (GPU)
def _torch_profiler() -> Any:
    try:
        from torch.profiler import ProfilerActivity, profile
    except ImportError:
        raise UserError("--timeline reads CUPTI's kernel records through PyTorch's profiler: pip install torch "
                        "(a CUDA build, on the GPU machine)") from None
    return profile, ProfilerActivity


def capture(backend: Any, forward_device: Any, batch: Any, states: list, steps: int) -> tuple[list, list, list]:
    """One marked eager step and `steps` graphed ones under the profiler: (eager kernels with span indices, graphed
    steps' kernels, the spans)."""
    profile, activity = _torch_profiler()
    marker = SpanMarker(backend.cp)
    with tempfile.TemporaryDirectory() as td:
        path = os.path.join(td, "trace.json")
        with profile(activities=[activity.CUDA]) as prof:
            backend.profiler = marker
            try:
                backend.sample(forward_device(batch), states)
            finally:
                backend.profiler = None
            backend.synchronize()
            for _ in range(steps):
                marker.separator()
                backend.sample(forward_device(batch), states)
            backend.synchronize()
        prof.export_chrome_trace(path)
        keep = envs.LLMRS_TIMELINE_TRACE  # a copy of the raw trace (chrome://tracing, Perfetto)
        if keep:
            Path(keep).write_bytes(Path(path).read_bytes())
        doc = json.loads(Path(path).read_text())
    eager, graphed = split_trace(kernels_from_trace(doc))
    return eager, graphed, marker.spans


def run_timeline(model: str, batches: list[int], context: int, steps: int = 20, warmup: int = 5,
                 gpu: str = "auto", measure: bool = False, progress: Any = None) -> tuple[list[Timeline], dict]:
    """For each decode batch size (every sequence at `context` cached tokens), the graphed step's timeline."""
    import time

    import numpy as np

    from llmrs.backends.cuda import cuda_available
    from llmrs.profiling.profile import _fill_kv, _load, ceilings, decode_batch, greedy_state

    if context < 1 or steps < 1:
        raise UserError("--context and --steps must be at least 1")
    ok, why = cuda_available()
    if not ok:
        raise UserError(f"llmrs profile --timeline needs CuPy and an NVIDIA GPU: {why}")
    _torch_profiler()
    ceil = ceilings(gpu, measure)
    bs = 16
    per_seq = -(-(context + 1) // bs)
    say = progress or (lambda msg: None)
    say(f"loading {model}")
    config, backend, m = _load(model, max(batches) * per_seq, bs, True)
    if backend.graphs is None:
        raise UserError("--timeline looks at the graphed decode step: CUDA graphs are off (LLMRS_CUDA_GRAPHS=0?)")
    _fill_kv(backend)
    backend.synchronize()
    rng = np.random.default_rng(0)
    out = []
    for B in batches:
        say(f"decode B={B}: {warmup} warm-up, {steps} timed, 1 marked eager + {steps} traced steps")
        batch = decode_batch(rng, config.vocab_size, B, context, per_seq, bs)
        states = [greedy_state() for _ in range(B)]
        for _ in range(warmup):
            backend.sample(m.forward_device(batch), states)
        times = []
        for _ in range(steps):
            t = time.perf_counter()
            backend.sample(m.forward_device(batch), states)
            times.append(time.perf_counter() - t)
        eager, graphed, spans = capture(backend, m.forward_device, batch, states, steps)
        out.append(analyze(eager, graphed, spans, ceil.bandwidth_gbs * 1e9, f"decode B={B}", B,
                           1e3 * float(np.median(times))))
    meta = {"model": model, "gpu_name": ceil.gpu_name, "bandwidth_gbs": round(ceil.bandwidth_gbs, 1),
            "ceilings": ceil.source, "context": context,
            "note": "exposed = the time each kernel adds to the graphed step (CUPTI's start and end through "
                    "torch.profiler); floor = its bytes / bandwidth"}
    return out, meta
