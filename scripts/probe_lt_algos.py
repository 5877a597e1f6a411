#!/usr/bin/env python3
"""Whether another cuBLASLt algorithm beats the one the backend's GEMMs get, for the 7B's linears at batched-decode
token counts: for each (linear, T) every algorithm cublasLtMatmulAlgoGetHeuristic offers (up to --algos) is timed
on the backend's own operands (bf16 W [N, K] and x [T, K]; f32 out accumulated for o / down, bf16 out for gate_up,
f32 for qkv), each call on the next of --copies weight copies so the weights come from DRAM as in a step (one copy
of qkv would sit in the 50 MB L2), against cublasGemmEx (CuPy's cuBLAS, what `_linear` calls) and the heuristic's
first choice (what LLMRS_CUBLASLT=1 takes). A probe for the notes, run on the GPU machine:

    python3 scripts/probe_lt_algos.py [--tokens 64,128,256] [--workspace-mib 32] [--json out.json]

Prints per (linear, T): us for gemmEx / heuristic #0 / the best algorithm (its index, workspace bytes), the best's
TFLOP/s, and per T the 28-layer sum of each column.
"""

from __future__ import annotations

import argparse
import ctypes
import json

import numpy as np

LINEARS = {  # name: (N, K, out type, accumulate) as the 7B's 256-token decode step runs them
    "qkv": (4608, 3584, "f32", False), "o": (3584, 3584, "f32", True),
    "gate_up": (37888, 3584, "bf16", False), "down": (3584, 18944, "f32", True)}
LAYERS = 28


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", default="64,128,256")
    ap.add_argument("--algos", type=int, default=64)
    ap.add_argument("--copies", type=int, default=8)
    ap.add_argument("--reps", type=int, default=40)
    ap.add_argument("--workspace-mib", type=int, default=32)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    import cupy as cp

    from llmrs.backends.cuda_lt import (CUBLAS_COMPUTE_32F, CUBLAS_OP_N, CUBLAS_OP_T, CUDA_R_16BF, CUDA_R_32F,
                                               DESC_TRANSA, DESC_TRANSB, PREF_MAX_WORKSPACE_BYTES, HeuristicResult,
                                               _check, load_lib)

    lib = load_lib()
    cublas = cp.cuda.cublas
    handle = cp.cuda.device.get_cublas_handle()
    ws_bytes = a.workspace_mib << 20
    ws = cp.empty(ws_bytes, dtype=cp.uint8)
    lt = ctypes.c_void_p()
    _check(lib.cublasLtCreate(ctypes.byref(lt)), "create")
    desc = ctypes.c_void_p()
    _check(lib.cublasLtMatmulDescCreate(ctypes.byref(desc), CUBLAS_COMPUTE_32F, CUDA_R_32F), "desc")
    for attr, op in ((DESC_TRANSA, CUBLAS_OP_T), (DESC_TRANSB, CUBLAS_OP_N)):
        v = ctypes.c_int32(op)
        _check(lib.cublasLtMatmulDescSetAttribute(desc, attr, ctypes.byref(v), ctypes.sizeof(v)), "desc attr")
    pref = ctypes.c_void_p()
    _check(lib.cublasLtMatmulPreferenceCreate(ctypes.byref(pref)), "pref")
    wsv = ctypes.c_uint64(ws_bytes)
    _check(lib.cublasLtMatmulPreferenceSetAttribute(pref, PREF_MAX_WORKSPACE_BYTES, ctypes.byref(wsv),
                                                    ctypes.sizeof(wsv)), "pref attr")
    one, zero = np.ones(1, np.float32), np.zeros(1, np.float32)
    stream = cp.cuda.get_current_stream()

    def layout(dtype: int, rows: int, cols: int, ld: int) -> ctypes.c_void_p:
        lay = ctypes.c_void_p()
        _check(lib.cublasLtMatrixLayoutCreate(ctypes.byref(lay), dtype, rows, cols, ld), "layout")
        return lay

    def timed(call, n_w: int) -> float:
        for i in range(3):
            call(i % n_w)
        s, e = cp.cuda.Event(), cp.cuda.Event()
        s.record()
        for i in range(a.reps):
            call(i % n_w)
        e.record()
        e.synchronize()
        return cp.cuda.get_elapsed_time(s, e) * 1e3 / a.reps

    def bf16(f32):  # bf16 words (truncated f32): operands for timing
        return (f32.view(cp.uint32) >> 16).astype(cp.uint16)

    rows, sums = [], {}
    rng = cp.random.default_rng(0)
    for name, (N, K, otype, acc) in LINEARS.items():
        w0 = bf16(rng.standard_normal((N, K), dtype=cp.float32) * 0.02)
        w = [w0] + [w0.copy() for _ in range(a.copies - 1)]  # the same values, distinct memory
        for T in [int(t) for t in a.tokens.split(",")]:
            x = bf16(rng.standard_normal((T, K), dtype=cp.float32))
            out = cp.zeros((T, N), dtype=cp.float32 if otype == "f32" else cp.uint16)
            ct = CUDA_R_32F if otype == "f32" else CUDA_R_16BF
            beta = one if acc else zero
            al, be = one.ctypes.data, beta.ctypes.data

            def gemm_ex(i: int) -> None:
                cublas.gemmEx(handle, CUBLAS_OP_T, CUBLAS_OP_N, N, T, K, al, w[i].data.ptr, CUDA_R_16BF, K,
                              x.data.ptr, CUDA_R_16BF, K, be, out.data.ptr, ct, N, CUBLAS_COMPUTE_32F, -1)

            base = timed(gemm_ex, len(w))
            la, lb, lc = layout(CUDA_R_16BF, K, N, K), layout(CUDA_R_16BF, K, T, K), layout(ct, N, T, N)
            res = (HeuristicResult * a.algos)()
            n = ctypes.c_int(0)
            _check(lib.cublasLtMatmulAlgoGetHeuristic(lt, desc, la, lb, lc, lc, pref, a.algos, res, ctypes.byref(n)),
                   "heuristic")
            times = []
            for j in range(n.value):
                r = res[j]

                def lt_call(i: int, r=r) -> None:
                    _check(lib.cublasLtMatmul(lt, desc, al, w[i].data.ptr, la, x.data.ptr, lb, be, out.data.ptr, lc,
                                              out.data.ptr, lc, ctypes.byref(r), ws.data.ptr, ws_bytes, stream.ptr),
                           "matmul")
                try:
                    times.append((timed(lt_call, len(w)), j, int(r.workspace_size)))
                except RuntimeError as err:
                    times.append((float("inf"), j, int(r.workspace_size)))
                    print(f"  {name} T {T} algo {j}: {err}")
            best = min(times)
            flop = 2.0 * N * K * T
            row = {"linear": name, "T": T, "gemm_ex_us": base, "lt0_us": times[0][0], "best_us": best[0],
                   "best_index": best[1], "best_workspace": best[2], "algos": n.value,
                   "best_tflops": flop / best[0] / 1e6, "all_us": [t[0] for t in times]}
            rows.append(row)
            for k in ("gemm_ex_us", "lt0_us", "best_us"):
                sums.setdefault(T, {}).setdefault(k, 0.0)
                sums[T][k] += LAYERS * row[k] / 1e3
            print(f"{name:8s} T {T:4d}: gemmEx {base:7.1f}  lt#0 {times[0][0]:7.1f}  best {best[0]:7.1f} us (#{best[1]}"
                  f" of {n.value}, ws {best[2] >> 10} KiB, {row['best_tflops']:.0f} TFLOP/s, gemmEx "
                  f"{flop / base / 1e6:.0f})", flush=True)
            for lay in (la, lb, lc):
                lib.cublasLtMatrixLayoutDestroy(lay)
    for T, s in sums.items():
        print(f"T {T}: 28 layers of the four linears, ms: gemmEx {s['gemm_ex_us']:.3f}  lt#0 {s['lt0_us']:.3f}  "
              f"best {s['best_us']:.3f}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"rows": rows, "sums": sums}, f, indent=1)


if __name__ == "__main__":
    main()
