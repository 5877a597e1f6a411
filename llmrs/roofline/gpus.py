"""The GPU ceiling database: datasheet numbers (from `gpus.json`, each with its source) plus measured ones.

A `GpuSpec` is what the roofline needs from a GPU: DRAM bandwidth and the dense tensor throughput of each
datatype. `get_gpu("rtx-a5000")` looks one up by key or alias; `get_gpu("auto")` asks NVML which GPU this
machine has. Measured ceilings (`llmrs roofline --measure`) live in a user cache file and are attached as
`measured_*` fields, never silently replacing the datasheet: the table shows both.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources
from typing import Any

from llmrs.errors import UserError
from llmrs.roofline.measured import Measurement, import_cupy, load_measured, measure_bandwidth, measure_bf16_gemm

NUMERIC_FIELDS = (
    "bandwidth_gbs", "memory_gb", "bf16_tflops", "fp16_tflops", "fp8_tflops", "int8_tops", "fp32_tflops",
    "sm_count", "l2_mb", "compute_capability", "nvlink_gbs",
)
# compute datatype -> field holding its dense peak
PEAK_FIELDS = {"bf16": "bf16_tflops", "fp16": "fp16_tflops", "fp8": "fp8_tflops", "int8": "int8_tops",
               "fp32": "fp32_tflops"}


@dataclass(slots=True)
class GpuSpec:
    """One GPU's ceilings. TFLOP/s are dense tensor rates (FP32 accumulate for bf16/fp16)."""

    key: str
    name: str
    arch: str
    compute_capability: str
    sm_count: int
    l2_mb: float
    memory_gb: float
    memory_type: str
    bandwidth_gbs: float
    bf16_tflops: float | None
    fp16_tflops: float | None
    fp8_tflops: float | None
    int8_tops: float | None
    fp32_tflops: float | None
    nvlink_gbs: float | None = None  # NVLink GB/s per GPU, one direction (`llmrs roofline --tp`); None: no NVLink
    aliases: list[str] = field(default_factory=list)
    derived: dict[str, str] = field(default_factory=dict)
    sources: dict[str, str] = field(default_factory=dict)
    # filled from the measured cache (`llmrs roofline --measure`), None when never measured here
    measured_bandwidth_gbs: float | None = None
    measured_bf16_tflops: float | None = None
    measured_at: str | None = None

    def peak_flops(self, dtype: str = "bf16", measured: bool = False) -> float:
        """Dense peak in FLOP/s for a compute datatype; measured value when asked and available."""
        if measured and dtype == "bf16" and self.measured_bf16_tflops:
            return self.measured_bf16_tflops * 1e12
        value = getattr(self, PEAK_FIELDS[dtype])
        if value is None:
            raise UserError(f"{self.name} has no {dtype} tensor units (no datasheet figure); pick another --compute-dtype")
        return float(value) * 1e12

    def bandwidth(self, measured: bool = False) -> float:
        """DRAM bandwidth in bytes/s; measured value when asked and available."""
        if measured and self.measured_bandwidth_gbs:
            return self.measured_bandwidth_gbs * 1e9
        return self.bandwidth_gbs * 1e9

    def ridge(self, dtype: str = "bf16", measured: bool = False) -> float:
        """Arithmetic intensity (FLOP/byte) where the compute roof meets the bandwidth roof."""
        return self.peak_flops(dtype, measured) / self.bandwidth(measured)

    def to_dict(self) -> dict[str, Any]:
        return {f: getattr(self, f) for f in self.__slots__}  # type: ignore[attr-defined]


def _norm(name: str) -> str:
    """Lower-case, drop vendor words and punctuation: 'NVIDIA GeForce RTX 4090' -> 'rtx4090'."""
    s = name.lower().replace("nvidia", "").replace("geforce", "")
    return re.sub(r"[^a-z0-9]", "", s)


@lru_cache(maxsize=1)
def _database() -> tuple[GpuSpec, ...]:
    raw = json.loads(resources.files("llmrs.roofline").joinpath("gpus.json").read_text())
    specs = []
    for g in raw["gpus"]:
        specs.append(GpuSpec(**{k: v for k, v in g.items()}))
    return tuple(specs)


def load_gpus(with_measured: bool = True) -> list[GpuSpec]:
    """All GPUs of the database (fresh copies), with measured ceilings attached where this machine has them."""
    specs = [GpuSpec(**{f: getattr(s, f) for f in s.__slots__}) for s in _database()]  # type: ignore[attr-defined]
    if with_measured:
        cache = load_measured()
        for s in specs:
            m = cache.get(s.key)
            if m:
                s.measured_bandwidth_gbs = m.get("bandwidth_gbs")
                s.measured_bf16_tflops = m.get("bf16_tflops")
                s.measured_at = m.get("measured_at")
    return specs


def get_gpu(name: str, with_measured: bool = True) -> GpuSpec:
    """Look a GPU up by key ('rtx-a5000'), alias or marketing name; 'auto' asks NVML. Unknown -> UserError."""
    if name == "auto":
        name = detect_local_gpu_name()
    specs = load_gpus(with_measured)
    match = match_gpu_name(name, specs)
    if match is None:
        keys = ", ".join(s.key for s in specs)
        raise UserError(f"unknown GPU {name!r}; known: {keys} (see `llmrs gpus`)")
    return match


def match_gpu_name(name: str, specs: list[GpuSpec] | None = None, memory_gb: float | None = None) -> GpuSpec | None:
    """Best database entry for a name as NVML or a user writes it; None when nothing fits.

    Exact key/alias matches win; otherwise an alias contained in the name (longest alias first, so
    'A100-SXM4-80GB' beats 'A100'); ties broken by the closest memory size when NVML gave one.
    """
    specs = specs if specs is not None else load_gpus()
    n = _norm(name)
    if not n:
        return None
    for s in specs:
        if n == _norm(s.key) or any(n == _norm(a) for a in s.aliases):
            return s
    best: list[tuple[int, GpuSpec]] = []
    for s in specs:
        for a in [s.key, *s.aliases]:
            na = _norm(a)
            if len(na) >= 3 and na in n:  # NOTE: "l4" alone would match "l40"
                best.append((len(na), s))
    if not best:
        return None
    top = max(length for length, _ in best)
    cands = [s for length, s in best if length == top]
    if memory_gb is not None and len(cands) > 1:
        cands.sort(key=lambda s: abs(s.memory_gb - memory_gb))
    return cands[0]


def detect_local_gpu_name(index: int = 0) -> str:
    """The local GPU's name from NVML (package nvidia-ml-py); UserError when there is none."""
    try:
        import pynvml
    except ImportError:
        raise UserError("--gpu auto needs NVML: in the llmrs checkout, pip install -e '.[roofline]' "
                        "(nvidia-ml-py)") from None
    try:
        pynvml.nvmlInit()
    except Exception as e:  # NVMLError_LibraryNotFound, DriverNotLoaded, ...
        raise UserError(f"--gpu auto: no NVIDIA driver/GPU found ({e}); pass --gpu NAME (see `llmrs gpus`)") from None
    try:
        if pynvml.nvmlDeviceGetCount() <= index:
            raise UserError("--gpu auto: NVML sees no GPU; pass --gpu NAME (see `llmrs gpus`)")
        h = pynvml.nvmlDeviceGetHandleByIndex(index)
        name = pynvml.nvmlDeviceGetName(h)
        return name.decode() if isinstance(name, bytes) else str(name)
    finally:
        pynvml.nvmlShutdown()


def measure_local_gpu(copy_bytes: int = 1 << 30, gemm_n: int = 8192) -> Measurement:
    """Measure this machine's GPU 0 and match it to the database (UserError without CuPy or a GPU)."""
    cp = import_cupy()  # the UserError without CuPy or a GPU, before the backend is imported
    from llmrs.backends.cuda import gpu_name_memory

    name, memory = gpu_name_memory(cp)
    spec = match_gpu_name(name, memory_gb=memory / 1e9)
    key = spec.key if spec else _slug(name)
    bw = measure_bandwidth(cp, copy_bytes)
    tflops, dtype = measure_bf16_gemm(cp, gemm_n)
    return Measurement(
        gpu_key=key, device_name=name, bandwidth_gbs=round(bw, 1), bf16_tflops=round(tflops, 1),
        copy_bytes=copy_bytes, gemm_shape=(gemm_n, gemm_n, gemm_n), gemm_dtype=dtype,
        measured_at=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    )


def _slug(name: str) -> str:
    return "-".join(name.lower().replace("nvidia", "").split())
