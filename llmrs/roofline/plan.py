"""`llmrs plan`: capacity planning from the roofline cost model, optionally calibrated on a real bench run.

Per GPU, with N = --tp, bw and peak the roofs, I and O the prompt and output tokens of a request, C the requests in
flight:

    memory   weights/GPU = checkpoint / N;  KV/GPU(C) = C (I + O) kv_bytes_per_token / N
             budget = --gpu-memory-utilization x GPU memory;  max C = floor((budget - weights/GPU) / KV/GPU(1))
    step     mixed(B, j) = max((W + B b_seq + j b_pre) / (N bw), (B f_seq + j f_pre) / (N peak)) + k (B + j I)
             one engine step of B decoding sequences (each at context I + O/2: b_seq bytes of KV and embedding,
             f_seq FLOPs) and j prompts of prefill (b_pre bytes beyond the weights, f_pre FLOPs); W = the weights
             streamed once per step; k = tp.py's ring all-reduce time per token of the step (0 at N = 1)
    TPOT     steady state: a request lives O steps (its prefill step gives token 1), so C/O requests join each step
             and C (O-1)/O decode:  TPOT = mixed(C (O-1)/O, C/O)
    TTFT     the wait for the running step (half a step; none at C = 1), then the n = ceil(I / max_batched_tokens)
             steps that carry the prompt beside the other C-1 requests:
             TTFT = w + n mixed((C-1)(O-1)/O, 1/n + (C-1)/O)
    E2E      TTFT + (O-1) TPOT;  request rate = C / E2E (Little's law);  output tok/s = rate x O

These are floors: a perfect engine on the datasheet (or measured) roofs. `--calibrate RESULTS.json` fits the engine's
efficiency on a graded `llmrs bench` file (decode: the mean over runs of floor TPOT / measured mean TPOT; prefill:
floor TTFT / measured mean TTFT of the lowest-concurrency run) and divides the floors by it; with two runs or more
each run is predicted from the others (leave-one-out) to state the calibration's error.

NOTE: not modelled: activation and CUDA-graph memory, KV block rounding, an engine's cap on running sequences
(vLLM's max_num_seqs), per-step CPU time and NCCL latency (calibration absorbs the last two on average).
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from llmrs.errors import UserError
from llmrs.roofline.analysis import Roofs
from llmrs.roofline.cost import ModelCost
from llmrs.roofline.gpus import GpuSpec



@dataclass(slots=True)
class Steps:
    """The step model for one request shape (I prompt, O output tokens): per-sequence and per-prompt costs."""

    input_len: int
    output_len: int
    weight_bytes: float  # streamed once per step
    seq_bytes: float  # one decoding sequence at context I + O/2: KV read + write, embedding row
    seq_flops: float
    prompt_bytes: float  # one prompt's prefill beyond the weights: KV write and read, embedding rows
    prompt_flops: float
    chunks: int  # engine steps one prompt's prefill takes
    bandwidth: float  # bytes/s of all N GPUs
    peak: float  # FLOP/s of all N GPUs
    comm_per_token: float  # all-reduce seconds per token of a step

    def mixed(self, decode: float, prompts: float) -> float:
        """Floor of one step of `decode` decoding sequences and `prompts` prompts of prefill."""
        mem = (self.weight_bytes + decode * self.seq_bytes + prompts * self.prompt_bytes) / self.bandwidth
        comp = (decode * self.seq_flops + prompts * self.prompt_flops) / self.peak
        return max(mem, comp) + self.comm_per_token * (decode + prompts * self.input_len)

    def tpot(self, c: float) -> float:
        o = self.output_len
        return self.mixed(c * (o - 1) / o, c / o)

    def ttft(self, c: float) -> float:
        o, n = self.output_len, self.chunks
        wait = 0.5 * self.tpot(c) * min(1.0, max(c - 1.0, 0.0))  # no step is running when the request is alone
        return wait + n * self.mixed((c - 1) * (o - 1) / o, 1 / n + (c - 1) / o)


@dataclass(slots=True)
class Figures:
    """Predicted latencies (seconds) and throughput of a concurrency."""

    ttft_s: float
    tpot_s: float
    e2e_s: float
    request_rate: float
    output_tok_s: float

    @classmethod
    def of(cls, c: float, ttft: float, tpot: float, output_len: int) -> "Figures":
        e2e = ttft + (output_len - 1) * tpot
        rate = c / e2e
        return cls(ttft_s=ttft, tpot_s=tpot, e2e_s=e2e, request_rate=rate, output_tok_s=rate * output_len)

    def meets(self, slo: dict[str, float]) -> bool:
        ms = {"ttft": self.ttft_s * 1e3, "tpot": self.tpot_s * 1e3, "e2el": self.e2e_s * 1e3}
        return all(ms[k] <= v for k, v in slo.items())


class PlanModel:
    """The roofs, the format's costs and the TP split of one plan; `steps(I, O)` gives the step model of a shape."""

    def __init__(self, gpu: GpuSpec, cost: ModelCost, tp: int = 1, link_gbs: float | None = None,
                 use_measured: bool = False, max_batched_tokens: int = 2048) -> None:
        self.gpu, self.cost, self.tp, self.max_batched_tokens = gpu, cost, tp, max_batched_tokens
        self.roofs = Roofs(bandwidth=gpu.bandwidth(use_measured),
                           peak_flops=gpu.peak_flops(cost.compute_dtype, use_measured),
                           compute_dtype=cost.compute_dtype,
                           measured=use_measured and bool(gpu.measured_bandwidth_gbs or gpu.measured_bf16_tflops))
        self.comm_per_token, self.link_gbs, self.link_source = 0.0, None, None
        if tp > 1:
            from llmrs.roofline.tp import analyze_tp

            # tp.py's all-reduce time is linear in a step's tokens: its batch-1 figure is the time per token
            t = analyze_tp(gpu, cost, self.roofs, tp, [1], 0, link_gbs)
            self.comm_per_token, self.link_gbs, self.link_source = t.points[0].comm_s, t.link_gbs, t.link_source
        elif tp < 1:
            raise UserError(f"--tp must be at least 1 (got {tp})")

    def steps(self, input_len: int, output_len: int) -> Steps:
        cost = self.cost
        one = cost.decode_step(1, input_len + output_len / 2)
        pre = cost.prefill(1, input_len, self.max_batched_tokens)
        return Steps(
            input_len=input_len, output_len=output_len, weight_bytes=cost.streamed_bytes,
            seq_bytes=one.bytes - one.weight_bytes, seq_flops=one.flops,
            prompt_bytes=pre.bytes - pre.weight_bytes, prompt_flops=pre.flops,
            chunks=math.ceil(input_len / self.max_batched_tokens),
            bandwidth=self.tp * self.roofs.bandwidth, peak=self.tp * self.roofs.peak_flops,
            comm_per_token=self.comm_per_token,
        )


# ---------------------------------------------------------------------------------------------------- calibration
@dataclass(slots=True)
class CalibrationRun:
    """One graded bench run: what was measured, the floors of its shape, and (2+ runs) its leave-one-out forecast."""

    tag: str
    concurrency: float  # the closed-loop cap, else the run's mean decode batch (Little's law)
    input_len: int
    output_len: int
    measured_ttft_s: float
    measured_tpot_s: float
    measured_output_tok_s: float
    floor_ttft_s: float
    floor_tpot_s: float
    decode_efficiency: float  # floor TPOT / measured TPOT
    prefill_efficiency: float  # floor TTFT / measured TTFT
    loo_tpot_s: float | None = None  # predicted from the other runs' efficiencies
    loo_output_tok_s: float | None = None
    loo_tpot_error: float | None = None  # predicted / measured - 1
    loo_output_tok_s_error: float | None = None


@dataclass(slots=True)
class Calibration:
    source: str
    decode_efficiency: float  # mean over the runs of floor TPOT / measured TPOT
    prefill_efficiency: float  # floor TTFT / measured TTFT of the lowest-concurrency run
    prefill_from: str  # that run's tag
    runs: list[CalibrationRun]
    # mean and max |leave-one-out error| of TPOT and of output tok/s; None with one run (unknown)
    tpot_error_mean: float | None = None
    tpot_error_max: float | None = None
    output_tok_s_error_mean: float | None = None
    output_tok_s_error_max: float | None = None
    skipped: list[str] = field(default_factory=list)  # runs left out and why

    def apply(self, c: float, steps: Steps) -> Figures:
        return Figures.of(c, steps.ttft(c) / self.prefill_efficiency, steps.tpot(c) / self.decode_efficiency,
                          steps.output_len)


def _same_model(graded: str, asked: str) -> bool:
    """A graded model label names the asked model: equal, or both the same preset (a served id, a repo name)."""
    from llmrs.bench.grading import match_preset

    def norm(s: str) -> str:
        return Path(str(s)).name.lower().removesuffix(".gguf")

    if norm(graded) == norm(asked):
        return True
    a, b = match_preset(norm(graded)), match_preset(norm(asked))
    return a is not None and b is not None and a[0] == b[0]


def _run_shape(run: dict, params: dict) -> tuple[int, int]:
    """(input, output) tokens per request of a run: the file's params, else the run's own means."""
    s = run.get("summary") or {}
    done = s.get("completed") or 0
    i = params.get("input_len") or (round(s.get("total_input_tokens", 0) / done) if done else 0)
    o = params.get("output_len") or (round(s.get("total_output_tokens", 0) / done) if done else 0)
    return int(i), int(o)


def _mean_ms(summary: dict, key: str) -> float | None:
    d = summary.get(key)
    v = d.get("mean") if isinstance(d, dict) else None
    return float(v) / 1e3 if isinstance(v, (int, float)) and v > 0 else None


def calibrate(model: PlanModel, path: Path, model_label: str) -> Calibration:
    """Fit the engine's decode and prefill efficiency on a `llmrs bench` results file (see the module docstring).

    UserError: unreadable file, no graded runs, or runs graded for another GPU, model or weight format."""
    try:
        doc = json.loads(Path(path).read_text())
    except OSError as e:
        raise UserError(f"--calibrate {path}: {e.strerror or e}") from None
    except ValueError as e:
        raise UserError(f"--calibrate {path}: not JSON ({e})") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("runs"), list):
        raise UserError(f"--calibrate {path}: not a `llmrs bench` results file (no \"runs\" list)")
    params = doc.get("params") if isinstance(doc.get("params"), dict) else {}
    gpu, cost = model.gpu, model.cost
    runs: list[CalibrationRun] = []
    skipped: list[str] = []
    for k, run in enumerate(doc["runs"]):
        tag = str(run.get("tag") or f"run {k + 1}") if isinstance(run, dict) else f"run {k + 1}"
        rf = run.get("roofline") if isinstance(run, dict) else None
        if not isinstance(rf, dict) or not rf.get("graded"):
            why = rf.get("why") if isinstance(rf, dict) else None
            skipped.append(f"{tag}: not graded" + (f" ({why})" if why else ""))
            continue
        if rf.get("gpu") != gpu.key:
            raise UserError(f"--calibrate {path}: run {tag} was graded on GPU {rf.get('gpu')!r}, not {gpu.key!r} "
                            f"(--gpu); calibrate on a run of the GPU you plan for")
        if not _same_model(str(rf.get("model", "")), model_label):
            raise UserError(f"--calibrate {path}: run {tag} was graded for model {rf.get('model')!r}, not "
                            f"{model_label!r} (--model)")
        if rf.get("weight_format") != cost.weight_format:
            raise UserError(f"--calibrate {path}: run {tag} was graded with {rf.get('weight_format')} weights, not "
                            f"{cost.weight_format} (pass --format {rf.get('weight_format')})")
        s = run.get("summary") or {}
        ttft, tpot, tput = _mean_ms(s, "ttft_ms"), _mean_ms(s, "tpot_ms"), s.get("output_throughput")
        i, o = _run_shape(run, params)
        if ttft is None or tpot is None or not tput or i < 1 or o < 2:
            skipped.append(f"{tag}: no mean TTFT, TPOT, output throughput or request shape")
            continue
        cap, rate = run.get("concurrency"), run.get("request_rate")
        closed = isinstance(cap, (int, float)) and cap >= 1 and rate in (None, "inf")
        c = float(cap) if closed else max(float(rf.get("mean_decode_batch") or 0.0), 1.0)
        st = model.steps(i, o)
        f_ttft, f_tpot = st.ttft(c), st.tpot(c)
        runs.append(CalibrationRun(
            tag=tag, concurrency=c, input_len=i, output_len=o, measured_ttft_s=ttft, measured_tpot_s=tpot,
            measured_output_tok_s=float(tput), floor_ttft_s=f_ttft, floor_tpot_s=f_tpot,
            decode_efficiency=f_tpot / tpot, prefill_efficiency=f_ttft / ttft,
        ))
    if not runs:
        why = "; ".join(skipped) if skipped else "the file has no runs"
        raise UserError(f"--calibrate {path}: no graded runs to calibrate on ({why}); bench with --gpu and "
                        "--model-config so each run is graded")
    eta_d, eta_p, p_from = _fit(runs)
    cal = Calibration(source=str(path), decode_efficiency=eta_d, prefill_efficiency=eta_p, prefill_from=p_from.tag,
                      runs=runs, skipped=skipped)
    if len(runs) >= 2:
        for r in runs:
            d, p, _ = _fit([x for x in runs if x is not r])
            r.loo_tpot_s = r.floor_tpot_s / d
            e2e = r.floor_ttft_s / p + (r.output_len - 1) * r.loo_tpot_s
            r.loo_output_tok_s = r.concurrency / e2e * r.output_len
            r.loo_tpot_error = r.loo_tpot_s / r.measured_tpot_s - 1
            r.loo_output_tok_s_error = r.loo_output_tok_s / r.measured_output_tok_s - 1
        te = [abs(r.loo_tpot_error) for r in runs]
        oe = [abs(r.loo_output_tok_s_error) for r in runs]
        cal.tpot_error_mean, cal.tpot_error_max = sum(te) / len(te), max(te)
        cal.output_tok_s_error_mean, cal.output_tok_s_error_max = sum(oe) / len(oe), max(oe)
    return cal


def _fit(runs: list[CalibrationRun]) -> tuple[float, float, CalibrationRun]:
    """(decode efficiency: mean of the runs', prefill efficiency and the lowest-concurrency run it comes from)."""
    low = min(runs, key=lambda r: r.concurrency)
    return sum(r.decode_efficiency for r in runs) / len(runs), low.prefill_efficiency, low


# ---------------------------------------------------------------------------------------------------------- plan
@dataclass(slots=True)
class Memory:
    gpu_memory_bytes: float
    utilization: float
    budget_bytes: float  # per GPU
    weight_bytes: float  # per GPU
    kv_bytes_per_token: float  # whole model; a GPU holds 1/N of it
    kv_bytes_per_request: float  # per GPU: (I + O) tokens
    max_concurrency: int  # the most requests whose KV fits beside the weights


@dataclass(slots=True)
class Point:
    """One concurrency: its memory, its floor figures, its calibrated ones, and the SLO verdict."""

    concurrency: int
    kv_bytes: float  # per GPU
    memory_bytes: float  # per GPU: weights + KV
    fits: bool
    floor: Figures
    calibrated: Figures | None
    meets_slo: bool | None  # on the calibrated figures when there are some, else the floor; None without --slo

    @property
    def best(self) -> Figures:
        return self.calibrated or self.floor


@dataclass(slots=True)
class SloAnswer:
    slo: dict[str, float]  # ms
    basis: str  # "calibrated" or "floor"
    max_concurrency: int | None  # the largest that fits and meets the SLO; None: not even one request
    max_rate_concurrency: int | None  # where the request rate meeting the SLO peaks
    max_request_rate: float | None
    max_output_tok_s: float | None


@dataclass(slots=True)
class RateAnswer:
    rate: float
    met: bool
    concurrency: int | None  # the smallest that serves `rate` (Little: C = rate x E2E); None: none that fits
    why: str


@dataclass(slots=True)
class TargetAnswer:
    target_rate: float
    rate_per_replica: float | None  # what one replica of `tp` GPUs serves (within the SLO when given)
    concurrency_per_replica: int | None
    replicas: int | None  # None: unreachable (the SLO is missed even by one request)
    gpus: int | None


@dataclass(slots=True)
class Plan:
    gpu: str
    gpu_name: str
    ceilings: str  # datasheet or measured
    bandwidth_gbs: float
    peak_tflops: float
    compute_dtype: str
    model: str
    weight_format: str
    kv_dtype_bytes: float
    tp: int
    link_gbs: float | None
    input_len: int
    output_len: int
    max_batched_tokens: int
    memory: Memory
    points: list[Point]
    basis: str  # which figures the answers use: "calibrated" or "floor"
    slo: SloAnswer | None = None
    rate: RateAnswer | None = None
    target: TargetAnswer | None = None
    calibration: Calibration | None = None
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def parse_slo(text: str | None) -> dict[str, float]:
    """'ttft=200,tpot=50' -> {'ttft': 200.0, 'tpot': 50.0} (ms; keys ttft, tpot, e2el as `llmrs bench --slo`)."""
    from llmrs.bench.metrics import parse_slo as bench_parse_slo

    try:
        return bench_parse_slo(text)
    except ValueError as e:
        raise UserError(f"--slo: {e}") from None


def memory(model: PlanModel, input_len: int, output_len: int, utilization: float) -> Memory:
    cost, tp = model.cost, model.tp
    total = model.gpu.memory_gb * 1e9
    budget = utilization * total
    weights = cost.checkpoint_bytes / tp
    per_req = (input_len + output_len) * cost.kv_bytes_per_token / tp
    return Memory(gpu_memory_bytes=total, utilization=utilization, budget_bytes=budget, weight_bytes=weights,
                  kv_bytes_per_token=cost.kv_bytes_per_token, kv_bytes_per_request=per_req,
                  max_concurrency=max(0, math.floor((budget - weights) / per_req)))


def make_plan(model: PlanModel, model_label: str, input_len: int, output_len: int, utilization: float = 0.9,
              slo: dict[str, float] | None = None, concurrency: int | None = None, rate: float | None = None,
              target_rate: float | None = None, calibration: Calibration | None = None) -> Plan:
    """Everything `llmrs plan` prints. UserError when the weights (or one request's KV) leave no room."""
    if input_len < 1 or output_len < 2:
        raise UserError(f"need at least 1 prompt token and 2 output tokens (got {input_len} and {output_len})")
    if not 0 < utilization <= 1:
        raise UserError(f"--gpu-memory-utilization {utilization:g}: expected a fraction in (0, 1]")
    if concurrency is not None and rate is not None:
        raise UserError("give --rate or --concurrency, not both")
    cost = model.cost
    mem = memory(model, input_len, output_len, utilization)
    if mem.max_concurrency < 1:
        from llmrs.roofline.render import gb

        raise UserError(
            f"{model_label} {cost.weight_format}: {gb(mem.weight_bytes)} of weights per GPU + "
            f"{gb(mem.kv_bytes_per_request)} of KV for one request exceed the budget of {gb(mem.budget_bytes)} "
            f"({utilization:g} x {model.gpu.memory_gb:g} GB); raise --tp or pick a smaller --format")
    steps = model.steps(input_len, output_len)
    basis = "calibrated" if calibration else "floor"

    def point(c: int) -> Point:
        kv = c * mem.kv_bytes_per_request
        fl = Figures.of(c, steps.ttft(c), steps.tpot(c), output_len)
        cal = calibration.apply(c, steps) if calibration else None
        return Point(concurrency=c, kv_bytes=kv, memory_bytes=mem.weight_bytes + kv,
                     fits=c <= mem.max_concurrency, floor=fl, calibrated=cal,
                     meets_slo=(cal or fl).meets(slo) if slo else None)

    # every concurrency that fits, once: the SLO, rate and target answers read this scan
    scan = [point(c) for c in range(1, mem.max_concurrency + 1)]
    plan = Plan(
        gpu=model.gpu.key, gpu_name=model.gpu.name, ceilings="measured" if model.roofs.measured else "datasheet",
        bandwidth_gbs=model.roofs.bandwidth / 1e9, peak_tflops=model.roofs.peak_flops / 1e12,
        compute_dtype=cost.compute_dtype, model=model_label, weight_format=cost.weight_format,
        kv_dtype_bytes=cost.kv_dtype_bytes, tp=model.tp, link_gbs=model.link_gbs, input_len=input_len,
        output_len=output_len, max_batched_tokens=model.max_batched_tokens, memory=mem, points=[], basis=basis,
        calibration=calibration,
    )
    if slo:
        ok = [p for p in scan if p.meets_slo]
        top = max(ok, key=lambda p: p.best.request_rate) if ok else None
        plan.slo = SloAnswer(slo=dict(slo), basis=basis, max_concurrency=ok[-1].concurrency if ok else None,
                             max_rate_concurrency=top.concurrency if top else None,
                             max_request_rate=top.best.request_rate if top else None,
                             max_output_tok_s=top.best.output_tok_s if top else None)
    if rate is not None:
        plan.rate = _serve_rate(scan, rate, slo, basis)
    if target_rate is not None:
        plan.target = _target(scan, target_rate, slo, model.tp)
    if concurrency is not None:
        plan.points = [scan[concurrency - 1] if concurrency <= len(scan) else point(concurrency)]
    elif plan.rate is not None and plan.rate.concurrency is not None:
        plan.points = [scan[plan.rate.concurrency - 1]]
    else:
        wanted = {c for c in _powers_of_two(mem.max_concurrency)} | {mem.max_concurrency}
        if plan.slo and plan.slo.max_concurrency:
            wanted.add(plan.slo.max_concurrency)
        plan.points = [scan[c - 1] for c in sorted(wanted)]
    if concurrency is not None and concurrency > mem.max_concurrency:
        plan.notes.append(f"concurrency {concurrency:,} does not fit: at most {mem.max_concurrency:,} requests' KV fit "
                          "the budget (an engine would queue or preempt the rest)")
    if cost.weight_format in ("awq", "gptq", "q4_0", "q4_1", "q4_f32", "q6_k", "q8_0"):
        plan.notes.append("compute time ignores the cost of unpacking quantized weights")
    return plan


def _powers_of_two(n: int) -> list[int]:
    return [1 << k for k in range(n.bit_length()) if 1 << k <= n]


def _serve_rate(scan: list[Point], rate: float, slo: dict[str, float] | None, basis: str) -> RateAnswer:
    """The smallest concurrency whose request rate reaches `rate`, and whether it keeps the SLO."""
    if not rate > 0:
        raise UserError(f"--rate {rate:g}: expected a positive number of requests per second")
    at = next((p for p in scan if p.best.request_rate >= rate), None)
    if at is None:
        best = max(p.best.request_rate for p in scan)
        return RateAnswer(rate=rate, met=False, concurrency=None,
                          why=f"above the {best:,.2f} req/s ({basis}) of the largest concurrency that fits "
                              f"({scan[-1].concurrency})")
    if slo and not at.meets_slo:
        return RateAnswer(rate=rate, met=False, concurrency=at.concurrency,
                          why=f"concurrency {at.concurrency} serves it but misses the SLO ({_slo_miss(at, slo)})")
    return RateAnswer(rate=rate, met=True, concurrency=at.concurrency,
                      why=f"served by {at.concurrency} requests in flight ({basis}: C = rate x E2E "
                          f"{at.best.e2e_s:,.2f} s)" + (", within the SLO" if slo else ""))


def _slo_miss(p: Point, slo: dict[str, float]) -> str:
    f = p.best
    ms = {"ttft": f.ttft_s * 1e3, "tpot": f.tpot_s * 1e3, "e2el": f.e2e_s * 1e3}
    return ", ".join(f"{k} {ms[k]:,.1f} > {v:g} ms" for k, v in slo.items() if ms[k] > v)


def _target(scan: list[Point], target: float, slo: dict[str, float] | None, tp: int) -> TargetAnswer:
    """Replicas of `tp` GPUs for `target` req/s: each at its best request rate (within the SLO when given)."""
    if not target > 0:
        raise UserError(f"--target-rate {target:g}: expected a positive number of requests per second")
    ok = [p for p in scan if p.meets_slo] if slo else scan
    if not ok:
        return TargetAnswer(target_rate=target, rate_per_replica=None, concurrency_per_replica=None, replicas=None,
                            gpus=None)
    top = max(ok, key=lambda p: p.best.request_rate)
    replicas = math.ceil(target / top.best.request_rate)
    return TargetAnswer(target_rate=target, rate_per_replica=top.best.request_rate,
                        concurrency_per_replica=top.concurrency, replicas=replicas, gpus=replicas * tp)
