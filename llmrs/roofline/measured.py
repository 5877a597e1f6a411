"""Measured ceilings of the local GPU: `llmrs roofline --measure`.

Datasheet peaks are upper bounds no kernel reaches; the useful yardstick is what this GPU really does on a
large device-to-device copy (bandwidth) and a large bf16 GEMM through cuBLAS (tensor throughput). They are
stored per GPU key in `$LLMRS_CACHE_DIR/measured_gpus.json` (default `~/.cache/llmrs/`), beside (never
instead of) the datasheet numbers, so `llmrs gpus` and `llmrs roofline --use-measured` can show both.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from llmrs import envs
from llmrs.errors import UserError


def cache_path() -> Path:
    """Where measured ceilings live: $LLMRS_CACHE_DIR, else $XDG_CACHE_HOME/llmrs, else ~/.cache/llmrs."""
    base = envs.LLMRS_CACHE_DIR
    if base:
        return Path(base) / "measured_gpus.json"
    xdg = envs.external("XDG_CACHE_HOME")
    root = Path(xdg) if xdg else Path.home() / ".cache"
    return root / "llmrs" / "measured_gpus.json"


def load_measured() -> dict[str, dict[str, Any]]:
    """GPU key -> measured record; empty when nothing was measured (or the file is unreadable)."""
    p = cache_path()
    if not p.is_file():
        return {}
    try:
        data = json.loads(p.read_text())
    except (OSError, json.JSONDecodeError):
        return {}
    return data if isinstance(data, dict) else {}


@dataclass(slots=True)
class Measurement:
    """One --measure run: what was timed and what it achieved."""

    gpu_key: str
    device_name: str
    bandwidth_gbs: float  # (read + write bytes) / time of a large device-to-device copy
    bf16_tflops: float  # 2*M*N*K / time of a large bf16 GEMM (fp32 accumulate) through cuBLAS
    copy_bytes: int
    gemm_shape: tuple[int, int, int]
    gemm_dtype: str
    measured_at: str


def save_measurement(m: Measurement) -> Path:
    """Merge one measurement into the cache file, keyed by GPU key; returns the file's path."""
    p = cache_path()
    p.parent.mkdir(parents=True, exist_ok=True)
    data = load_measured()
    rec = asdict(m)
    rec["gemm_shape"] = list(m.gemm_shape)
    data[m.gpu_key] = rec
    p.write_text(json.dumps(data, indent=2) + "\n")
    return p


def import_cupy() -> Any:
    """CuPy, with a GPU it can see; UserError (naming --measure) otherwise."""
    try:
        import cupy
    except ImportError:
        raise UserError("--measure needs CuPy and an NVIDIA GPU: in the llmrs checkout, pip install -e '.[cuda13]' "
                        "(or cuda12)") from None
    try:
        if cupy.cuda.runtime.getDeviceCount() < 1:
            raise UserError("--measure: no CUDA GPU visible")
    except cupy.cuda.runtime.CUDARuntimeError as e:
        raise UserError(f"--measure: no usable CUDA GPU ({e})") from None
    return cupy


def _time_ms(cp: Any, fn: Any, iters: int) -> float:
    """Best-of-iters milliseconds of fn() on the current stream, after one warm-up call."""
    fn()
    cp.cuda.Device().synchronize()
    best = float("inf")
    for _ in range(iters):
        start, end = cp.cuda.Event(), cp.cuda.Event()
        start.record()
        fn()
        end.record()
        end.synchronize()
        best = min(best, cp.cuda.get_elapsed_time(start, end))
    return best


def measure_bandwidth(cp: Any, nbytes: int = 1 << 30, iters: int = 10) -> float:
    """GB/s of a device-to-device copy of nbytes (counted as read + write, as a kernel's traffic is)."""
    src = cp.ones(nbytes // 4, dtype=cp.float32)
    dst = cp.empty_like(src)
    ms = _time_ms(cp, lambda: cp.copyto(dst, src), iters)
    return 2 * src.nbytes / (ms * 1e-3) / 1e9


def measure_bf16_gemm(cp: Any, n: int = 8192, iters: int = 10) -> tuple[float, str]:
    """TFLOP/s of an n x n x n GEMM, bf16 in / fp32 accumulate through cublasGemmEx; fp16 matmul as fallback.

    NOTE: numpy/CuPy have no bfloat16 dtype, so the bf16 operands are raw uint16 buffers handed to cuBLAS
    with CUDA_R_16BF; the values are irrelevant to the timing.
    """
    from cupy_backends.cuda.libs import cublas  # type: ignore[import-not-found]
    import numpy as np

    flops = 2.0 * n * n * n
    try:
        a = cp.full((n, n), 0x3F80, dtype=cp.uint16)  # 1.0 in bf16
        b = cp.full((n, n), 0x3F80, dtype=cp.uint16)
        c = cp.empty((n, n), dtype=cp.uint16)
        alpha, beta = np.array(1.0, dtype=np.float32), np.array(0.0, dtype=np.float32)
        handle = cp.cuda.device.get_cublas_handle()
        cuda_r_16bf, compute_32f, algo_default = 14, 68, -1

        def gemm() -> None:
            cublas.gemmEx(handle, 0, 0, n, n, n, alpha.ctypes.data, a.data.ptr, cuda_r_16bf, n,
                          b.data.ptr, cuda_r_16bf, n, beta.ctypes.data, c.data.ptr, cuda_r_16bf, n,
                          compute_32f, algo_default)

        ms = _time_ms(cp, gemm, iters)
        return flops / (ms * 1e-3) / 1e12, "bf16"
    except Exception:  # an older CuPy without gemmEx: fp16 in, fp32 compute runs at the same tensor rate
        a16 = cp.ones((n, n), dtype=cp.float16)
        b16 = cp.ones((n, n), dtype=cp.float16)
        ms = _time_ms(cp, lambda: a16 @ b16, iters)
        return flops / (ms * 1e-3) / 1e12, "fp16 (fallback)"
