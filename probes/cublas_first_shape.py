"""Probe: the host time of a GEMM shape's first cuBLAS call against the same call again.
Last result (H200): ~2.6 ms of host time on first sight of a token count, ~0.05 ms after (why prefill is graphed).

What a GEMM shape's first cuBLAS call costs: the 7B's four projections and its
lm_head as the eager prefill calls them (cupy's cublas.gemmEx, bf16 x bf16 -> f32, f32 compute, the default
algorithm), at token counts no call of this process has used before. Per T: the host time of the first call of
each shape and of the same call again, and the GPU time of one call (CUDA events), so a first-sight cost per new T
stands out against the GEMM's own time.

    python -m probes.cublas_first_shape [--tokens 200,201,257,300,333,384,500,512] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

SHAPES = {"qkv": (4608, 3584), "o": (3584, 3584), "gate_up": (37888, 3584), "down": (3584, 18944),
          "lm_head": (152064, 3584)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", default="200,201,257,300,333,384,500,512")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    import cupy as cp
    import numpy as np
    from cupy_backends.cuda.libs import cublas

    handle = cp.cuda.device.get_cublas_handle()
    one, zero = np.array(1.0, np.float32), np.array(0.0, np.float32)
    cublas.setPointerMode(handle, cublas.CUBLAS_POINTER_MODE_HOST)
    Tmax = max(int(t) for t in a.tokens.split(","))
    w = {n: cp.zeros((N, K), dtype=cp.uint16) for n, (N, K) in SHAPES.items()}
    x = cp.zeros((Tmax, max(K for _, K in SHAPES.values())), dtype=cp.uint16)
    out = cp.empty((Tmax, max(N for N, _ in SHAPES.values())), dtype=cp.float32)

    def call(name: str, T: int) -> None:
        N, K = SHAPES[name]
        # row-major out[T, N] = x[T, K] @ w[N, K]^T, as CUDABackend._linear: op(A) = W^T
        cublas.gemmEx(handle, cublas.CUBLAS_OP_T, cublas.CUBLAS_OP_N, N, T, K, one.ctypes.data, w[name].data.ptr,
                      14, K, x.data.ptr, 14, K, zero.ctypes.data, out.data.ptr, 0, N, 68, -1)

    call("o", 64)  # the library's own set-up, out of the first measured call
    cp.cuda.runtime.deviceSynchronize()
    rows = []
    print(f"{'T':>5} {'shape':8} {'first us':>10} {'again us':>10} {'GPU us':>9}")
    for T in (int(t) for t in a.tokens.split(",")):
        for name in SHAPES:
            times = []
            for _ in range(2):
                cp.cuda.runtime.deviceSynchronize()
                t0 = time.perf_counter()
                call(name, T)
                times.append((time.perf_counter() - t0) * 1e6)
            s, e = cp.cuda.Event(), cp.cuda.Event()
            cp.cuda.runtime.deviceSynchronize()
            s.record()
            call(name, T)
            e.record()
            e.synchronize()
            gpu = cp.cuda.get_elapsed_time(s, e) * 1e3
            rows.append({"T": T, "shape": name, "first_host_us": times[0], "again_host_us": times[1], "gpu_us": gpu})
            print(f"{T:5d} {name:8} {times[0]:10.1f} {times[1]:10.1f} {gpu:9.1f}")
    first = sum(r["first_host_us"] for r in rows) / len(rows)
    again = sum(r["again_host_us"] for r in rows) / len(rows)
    print(f"mean host time of a call: first sight of (T, shape) {first:.1f} us, again {again:.1f} us")
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
