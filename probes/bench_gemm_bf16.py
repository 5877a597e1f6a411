"""Probe: the backend's cublasGemmEx bf16 GEMMs against the other ways cuBLAS could run the same shapes.
Last result (H200): split-K slower; gemmEx as fast as torch's matmul at the 7B's shapes: the default stays.

The bf16 GEMMs of a prefill / large-batch step (x bf16 [T, K] @ W bf16 [N, K]^T -> f32 [T, N], what
CUDABackend._linear runs through cublasGemmEx) timed against the ways cuBLAS could run them:

  gemmEx      the backend's call (bf16 x bf16 -> f32 out, f32 accumulate, CUBLAS_GEMM_DEFAULT)
  gemmEx-bf16 the same with a bf16 output (does cuBLAS pick a faster kernel when C is bf16?)
  splitS      K cut into S slices run as one cublasGemmStridedBatchedEx into an f32 workspace [S, T, N], then one
              kernel summing the slices in a fixed order (what a split-K linear would do); S from --splits
  torch       torch.nn.functional.linear in bf16 (cuBLASLt's heuristics), for reference

    python -m probes.bench_gemm_bf16 [--preset qwen2.5-7b] [--tokens 64,128,256,512] [--splits 2,3,4]

Each launch reads its own copy of W (copies spanning --span-mb) so that weights come from DRAM, as in a step.
Prints us a launch, TFLOP/s and % of --roof-tflops, and the f32 result's largest difference from gemmEx's.
--json writes the rows.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

SHAPES = {
    "qwen2.5-7b": {"qkv": (4608, 3584), "o": (3584, 3584), "gate_up": (37888, 3584), "down": (3584, 18944)},
    "qwen2.5-3b": {"qkv": (2560, 2048), "o": (2048, 2048), "gate_up": (22016, 2048), "down": (2048, 11008)},
}

REDUCE = r"""
extern "C" __global__ void reduce_slices(const float* __restrict__ ws, float* __restrict__ out, long long n, int S) {
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
        float v = ws[i];
        for (int s = 1; s < S; ++s) v += ws[s * n + i];
        out[i] = v;
    }
}
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="qwen2.5-7b", choices=sorted(SHAPES))
    ap.add_argument("--tokens", default="64,128,256,512")
    ap.add_argument("--splits", default="2,3,4")
    ap.add_argument("--span-mb", type=float, default=256.0)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--roof-tflops", type=float, default=792.0, help="the H200's measured bf16 GEMM (issue 8)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()

    import cupy as cp
    import numpy as np
    from cupy_backends.cuda.libs import cublas

    handle = cublas.create()
    cublas.setStream(handle, cp.cuda.get_current_stream().ptr)
    from llmrs.backends.cuda.graphs import RawCublas

    lib = RawCublas.lib()
    vp, i32, i64 = ctypes.c_void_p, ctypes.c_int, ctypes.c_longlong
    lib.cublasGemmStridedBatchedEx.argtypes = [vp, i32, i32, i32, i32, i32, vp, vp, i32, i32, i64, vp, i32, i32,
                                               i64, vp, vp, i32, i32, i64, i32, i32, i32]
    lib.cublasGemmEx.argtypes = [vp, i32, i32, i32, i32, i32, vp, vp, i32, i32, vp, i32, i32, vp, vp, i32, i32,
                                 i32, i32]
    one, zero = ctypes.c_float(1.0), ctypes.c_float(0.0)
    p1, p0 = ctypes.cast(ctypes.pointer(one), vp), ctypes.cast(ctypes.pointer(zero), vp)
    R32F, R16BF, C32F, DEFAULT, OP_N, OP_T = 0, 14, 68, -1, 0, 1
    reduce_k = cp.RawKernel(REDUCE, "reduce_slices")

    try:
        import torch
    except ImportError:
        torch = None

    def timed(fn, copies) -> float:
        for c in range(2):
            fn(copies[c % len(copies)])
        cp.cuda.get_current_stream().synchronize()
        e0, e1 = cp.cuda.Event(), cp.cuda.Event()
        e0.record()
        for r in range(args.reps):
            fn(copies[r % len(copies)])
        e1.record()
        e1.synchronize()
        return cp.cuda.get_elapsed_time(e0, e1) * 1000.0 / args.reps

    rows = []
    toks = [int(t) for t in args.tokens.split(",")]
    splits = [int(s) for s in args.splits.split(",") if s]
    rng = np.random.default_rng(0)
    for name, (N, K) in SHAPES[args.preset].items():
        n_copies = max(2, int(args.span_mb * 2**20 // (N * K * 2)))
        w0 = cp.asarray((rng.standard_normal((N, K), dtype=np.float32) * 0.02)).astype(cp.bfloat16) \
            if hasattr(cp, "bfloat16") else None
        if w0 is None:  # CuPy without bfloat16: the top half of f32 words
            f = cp.asarray(rng.standard_normal((N, K), dtype=np.float32) * 0.02)
            w0 = (f.view(cp.uint32) >> 16).astype(cp.uint16)
        copies = [w0] + [w0.copy() for _ in range(n_copies - 1)]
        for T in toks:
            f = cp.asarray(rng.standard_normal((T, K), dtype=np.float32))
            x = (f.view(cp.uint32) >> 16).astype(cp.uint16)
            out = cp.empty((T, N), dtype=cp.float32)
            out16 = cp.empty((T, N), dtype=cp.uint16)
            flops = 2.0 * T * N * K
            res = {}

            def gemm_ex(w, o=out, otype=R32F):
                st = lib.cublasGemmEx(handle, OP_T, OP_N, N, T, K, p1, w.data.ptr, R16BF, K, x.data.ptr, R16BF, K,
                                      p0, o.data.ptr, otype, N, C32F, DEFAULT)
                assert st == 0, st

            res["gemmEx"] = timed(gemm_ex, copies)
            gemm_ex(copies[0])
            ref = out.copy()
            res["gemmEx-bf16"] = timed(lambda w: gemm_ex(w, out16, R16BF), copies)
            errs = {}
            for S in splits:
                if K % (S * 64):
                    continue
                Ks = K // S
                ws = cp.empty((S, T, N), dtype=cp.float32)
                n = T * N

                def split_k(w, S=S, Ks=Ks, ws=ws, n=n):
                    st = lib.cublasGemmStridedBatchedEx(
                        handle, OP_T, OP_N, N, T, Ks, p1, w.data.ptr, R16BF, K, Ks, x.data.ptr, R16BF, K, Ks,
                        p0, ws.data.ptr, R32F, N, n, S, C32F, DEFAULT)
                    assert st == 0, st
                    reduce_k((min(4096, -(-n // 256)),), (256,), (ws, out, np.int64(n), np.int32(S)))

                res[f"split{S}"] = timed(split_k, copies)
                split_k(copies[0])
                errs[f"split{S}"] = float(cp.abs(out - ref).max() / (cp.abs(ref).max() + 1e-30))
            if torch is not None:
                tw = [torch.as_tensor(c.view(cp.int16), device="cuda").view(torch.bfloat16) for c in copies]
                tx = torch.as_tensor(x.view(cp.int16), device="cuda").view(torch.bfloat16)
                res["torch"] = timed(lambda w: torch.nn.functional.linear(tx, w), tw)
            best = min(res, key=res.get)
            for k, us in res.items():
                tf = flops / us / 1e6
                row = {"shape": name, "N": N, "K": K, "T": T, "form": k, "us": round(us, 2), "tflops": round(tf, 1),
                       "roof": round(tf / args.roof_tflops, 3), "rel_err": errs.get(k)}
                rows.append(row)
                mark = " <- best" if k == best else ""
                err = f"  err {errs[k]:.1e}" if k in errs else ""
                print(f"  {name:8s} T={T:4d} {k:12s} {us:8.2f} us {tf:7.1f} TFLOP/s {100 * tf / args.roof_tflops:5.1f}%"
                      f"{err}{mark}")
        del copies
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
