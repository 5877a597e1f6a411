"""What watches a bench besides its own requests: the roofline it is graded against, the GPU telemetry sampler and
the server-metrics scraper. `Observers.start` sets them up once per bench; `run_sections` gives each run's
`roofline`, `telemetry` and `server_series` sections (and `lines`, what the console prints of them).

The grade's model, in order: `--model-config` (a Hugging Face directory or config.json, a .gguf, a preset or an
embedded model name); the served model's `root` or id where it is a local path or an embedded model name (llmrs and
vLLM list the checkpoint as `root`, llama-cpp-python the GGUF as its id); the served id matched to a preset
(`Qwen/Qwen2.5-7B-Instruct-AWQ` -> qwen2.5-7b, AWQ; `synthetic:qwen2.5-7b`). The GPU: `--gpu NAME`, else the GPU
NVML sees here (the server's, when the bench runs beside it). Whatever is missing, the run says it could not grade
and why.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from llmrs.bench import grading, scrape, series, telemetry
from llmrs.bench.records import RequestResult
from llmrs.errors import UserError

SCRAPE_BY_DEFAULT = ("llmrs", "vllm")  # engines whose /metrics the bench scrapes unless told otherwise


@dataclass(slots=True)
class GradeContext:
    """The cost model and GPU a bench's runs are graded against, or why there are none."""

    cost: object | None = None  # llmrs.roofline.cost.ModelCost
    gpu: object | None = None  # llmrs.roofline.gpus.GpuSpec
    measured: bool = False
    model_label: str = ""
    model_source: str = ""
    why: str = ""

    def to_dict(self) -> dict:
        if self.cost is None or self.gpu is None:
            return {"graded": False, "why": self.why}
        return {"graded": True, "gpu": self.gpu.key, "gpu_name": self.gpu.name, "model": self.model_label,
                "model_source": self.model_source, "weight_format": self.cost.weight_format,
                "ceilings": "measured" if self.measured and self.gpu.measured_bandwidth_gbs else "datasheet"}


def _model_spec(model_config: str | None, model: str, models: list[dict]) -> tuple[str, str | None, str] | None:
    """(spec for llmrs.roofline.model_source.resolve_model, weight format or None, where it came from)."""
    from llmrs.model.loader import EMBEDDED_MODELS, embedded_model_path

    def local(spec: str) -> str | None:
        if spec in EMBEDDED_MODELS:
            return str(embedded_model_path(spec))
        p = Path(spec).expanduser()
        return str(p) if p.suffix == ".gguf" and p.is_file() or p.is_dir() or p.name == "config.json" and p.is_file() \
            else None

    if model_config:
        return (local(model_config) or model_config), None, "--model-config"
    entry = next((m for m in models if m.get("id") == model), {})
    for spec in (entry.get("root"), model):
        if spec and (path := local(spec)):
            return path, None, f"the served model ({spec})"
    for spec in (entry.get("root"), model):
        if spec and (match := grading.match_preset(spec)):
            return match[0], match[1], f"preset {match[0]}, matched to the served name {spec}"
    return None


def _looks_like_a_path(spec: str) -> bool:
    """A path (a separator, or a checkpoint file's suffix), not a preset or embedded model name."""
    return "/" in spec or spec.startswith(("~", ".")) or Path(spec).suffix in (".gguf", ".json")


def check_model_config(spec: str) -> None:
    """A --model-config naming a path that is not there is the user's mistake (UserError)."""
    if _looks_like_a_path(spec) and not Path(spec).expanduser().exists():
        raise UserError(f"--model-config {spec}: no such file or directory")


def grade_context(model_config: str | None, gpu: str | None, use_measured: bool, model: str, models: list[dict],
                  gpus_here: list[dict]) -> GradeContext:
    """The grading context of a bench (never raises for what is merely missing: `why` says it)."""
    from llmrs.roofline.gpus import get_gpu, match_gpu_name
    from llmrs.roofline.model_source import build_cost, resolve_model

    ctx = GradeContext(measured=use_measured)
    if model_config:
        check_model_config(model_config)
    found = _model_spec(model_config, model, models)
    if found is None:
        ctx.why = (f"no cost model for {model!r}: not a local checkpoint, an embedded model or a preset "
                   "(`llmrs roofline` lists them); give --model-config")
        return ctx
    spec, fmt, source = found
    try:
        src = resolve_model(spec)
        ctx.cost = build_cost(src, fmt)
    except UserError as e:  # (a checkpoint the cost model cannot take: the runs are measured, not graded)
        ctx.why = f"no cost model from {'--model-config ' + model_config if model_config else repr(model)}: {e}"
        return ctx
    ctx.model_label, ctx.model_source = src.label, source
    if gpu:
        ctx.gpu = get_gpu(gpu)  # (an unknown name is the user's mistake: UserError)
    elif gpus_here:
        g = gpus_here[0]
        ctx.gpu = match_gpu_name(g["name"], memory_gb=g.get("memory_gib", 0) * 2**30 / 1e9)
        if ctx.gpu is None:
            ctx.why = f"{g['name']} is not in the GPU database (`llmrs gpus`); give --gpu NAME"
    else:
        ctx.why = "no GPU to grade against: NVML sees none here; give --gpu NAME (the server's GPU)"
    if ctx.gpu is None:
        ctx.cost = None
    return ctx


@dataclass(slots=True)
class Observers:
    grade: GradeContext = field(default_factory=GradeContext)
    sampler: telemetry.Sampler | None = None
    scraper: scrape.Scraper | None = None
    scrape_why: str = ""

    @classmethod
    def start(cls, grade: GradeContext, out_dir: Path, name: str, base_url: str, engine: str | None,
              want_telemetry: bool, want_scrape: bool | None, api_key: str | None,
              nvml_module: str = "pynvml") -> Observers:
        obs = cls(grade=grade)
        if want_telemetry:
            obs.sampler = telemetry.Sampler(out_dir / f"{name}.telemetry.csv", nvml_module=nvml_module).start()
        if want_scrape is None:
            want_scrape = engine in SCRAPE_BY_DEFAULT
            if not want_scrape:
                obs.scrape_why = f"off for engine {engine or 'unknown'} (--scrape-metrics turns it on)"
        if want_scrape:
            obs.scraper = scrape.Scraper(base_url, out_dir / f"{name}.metrics.csv", api_key=api_key).start()
        elif not obs.scrape_why:
            obs.scrape_why = "off (--no-scrape-metrics)"
        return obs

    def stop(self) -> None:
        if self.sampler is not None:
            self.sampler.stop()
        if self.scraper is not None:
            self.scraper.stop()

    def doc(self) -> dict:
        """The results file's top-level account of what watched the bench and where its series are."""
        tel = self.sampler
        return {
            "roofline": self.grade.to_dict(),
            "telemetry": {"csv": tel.path.name if tel and tel.active else None,
                          "why": "" if tel and tel.active else (tel.why if tel else "off (--no-telemetry)"),
                          "interval_s": tel.interval_s if tel else None},
            "server_series": {"csv": self.scraper.path.name if self.scraper else None,
                              "why": self.scraper.why if self.scraper else self.scrape_why,
                              "interval_s": self.scraper.interval_s if self.scraper else None},
        }

    def run_sections(self, results: list[RequestResult], t0: float, duration_s: float, output_tokens: int) -> dict:
        """`roofline`, `telemetry` and `server_series` of one run whose requests ran in [t0, t0 + duration_s]."""
        t1 = t0 + duration_s
        g = self.grade
        if g.cost is not None and g.gpu is not None:
            roof = grading.grade(grading.run_shape(results, duration_s), g.cost, g.gpu, g.measured, g.model_label,
                                 g.model_source)
        else:
            roof = {"schema": grading.SCHEMA, "graded": False, "why": g.why}
        tel = None
        if self.sampler is not None and self.sampler.active:
            tel = telemetry.summarize(series.read_rows(self.sampler.path), t0, t1, output_tokens)
        ser = None
        if self.scraper is not None:
            self.scraper.poll_now()
            ser = scrape.summarize(series.read_rows(self.scraper.path), t0, t1)
        return {"window": {"t0": t0, "t1": t1}, "roofline": roof, "telemetry": tel, "server_series": ser}


def pct(x: float | None) -> str:
    """A fraction as a percentage with at least two significant digits (0.042%, 3.1%, 61%)."""
    if x is None:
        return "-"
    v = 100 * x
    return f"{v:.2g}%" if 0 < abs(v) < 1 else f"{v:.1f}%" if abs(v) < 10 else f"{v:.0f}%"


def lines(sections: dict) -> list[str]:
    """What the console prints of a run's sections, one line each (a run not graded says nothing: the bench said
    why once, before its first run)."""
    out = []
    r = sections.get("roofline") or {}
    if r.get("graded"):
        out.append(
            f"roofline ({r['gpu']}, {r['ceilings']} {r['bandwidth_gbs']:,.0f} GB/s, {r['model']} "
            f"{r['weight_format']}): {r['output_tok_s']:,.1f} output tok/s = {pct(r['fraction_of_ideal'])} of the "
            f"ideal {r['ideal_output_tok_s']:,.0f} at mean batch {r['mean_decode_batch']:.1f} and context "
            f"{r['mean_context']:,.0f} (decode floor {r['decode_floor_ms']:.3f} ms, {r['decode_bound']}-bound); "
            f"MBU {pct(r.get('mbu'))}, MFU {pct(r['mfu'])} (prefill {pct(r['mfu_prefill'])})")
    t = sections.get("telemetry")
    if t:
        def f(v, fmt):
            return "-" if v is None else format(v, fmt)
        thr = ", ".join(t["throttle_reasons"]) or "none"
        out.append(f"GPU telemetry ({t['gpus']} GPU(s), {t['samples']} samples): power {f(t['mean_power_w'], ',.0f')} W "
                   f"mean, {f(t['peak_power_w'], ',.0f')} W peak; energy {f(t['energy_j'], ',.0f')} J; "
                   f"{f(t['output_tokens_per_joule'], ',.2f')} output tok/J; SM {f(t['mean_sm_mhz'], ',.0f')} MHz "
                   f"mean; slowdowns: {thr}")
    s = sections.get("server_series")
    if s:
        def g(k, fmt=",.1f"):
            return "-" if s.get(k) is None else format(s[k], fmt)
        out.append(f"server /metrics ({s['polls']} polls): running {g('mean_running')} mean, {g('peak_running', ',.0f')} "
                   f"peak; waiting {g('peak_waiting', ',.0f')} peak; KV cache {g('peak_kv_usage', '.0%')} peak; "
                   f"preemptions {g('preemptions_delta', ',.0f')}")
    return out
