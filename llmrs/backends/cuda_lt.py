"""The bf16 GEMMs through cuBLASLt with each shape's algorithm chosen once (opt-in: LLMRS_CUBLASLT=1).

Why: an eager prefill's host time. The sixteenth session (reports/h200-qwen2.5/session16/call9,
scripts/prefill_host_profile.py) found the host enqueueing a 7B's 256-token prefill in 7.05-7.40 ms, as long as the
GPU's work, so a slower host delays the first token; cuBLAS's `cublasGemmEx` (through CuPy) took ~26 us of it a call,
112 calls a prefill (~2.9 ms). cublasGemmEx runs cuBLAS's heuristic on every call; cublasLtMatmul with an algorithm
chosen once per (N, T, K, output type) and descriptors built once skips that. Written without a GPU: until
`tests/test_cuda_lt_gpu.py` and the host profile have run on one, it stays off.

The product is `_linear`'s: out[T, N] (= or +=) x[T, K] @ W[N, K]^T, W and x bf16, fp32 accumulation, out fp32 or
bf16; in cuBLAS's column-major terms D[N, T] = op_T(A)[N, K] B[K, T] (+ C = D), A the stored K x N matrix of W
(leading dimension K), B the K x T matrix of x (K), C = D the N x T output (N). alpha / beta are host float32
pointers (the default pointer mode, as the backend's gemmEx calls). The workspace is the backend's fixed cuBLAS one,
so nothing is allocated inside a graph capture, and the stream is passed on each call (no set-stream to refuse).
"""

from __future__ import annotations

import ctypes
import os
from collections import OrderedDict
from typing import Any

CUBLAS_OP_N, CUBLAS_OP_T = 0, 1
CUDA_R_32F, CUDA_R_16BF = 0, 14
CUBLAS_COMPUTE_32F = 68
# cublasLtMatmulDescAttributes_t / cublasLtMatmulPreferenceAttributes_t (cublasLt.h)
DESC_TRANSA, DESC_TRANSB = 3, 4
PREF_MAX_WORKSPACE_BYTES = 1
PLANS_MAX = 1024  # (N, T, K, out type) plans kept; the least recently used go first (a prefill's T varies)


class HeuristicResult(ctypes.Structure):
    """cublasLtMatmulHeuristicResult_t: the algorithm (cublasLtMatmulAlgo_t, 8 x uint64) and what cuBLASLt says of
    it."""

    _fields_ = [("algo", ctypes.c_uint64 * 8), ("workspace_size", ctypes.c_size_t), ("state", ctypes.c_int),
                ("waves_count", ctypes.c_float), ("reserved", ctypes.c_int * 4)]


def load_lib() -> Any:
    """libcublasLt as this process has it loaded (CuPy's cuBLAS loads it), else by its soname."""
    path = "libcublasLt.so"
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                parts = line.split()
                if len(parts) >= 6 and os.path.basename(parts[-1]).startswith("libcublasLt.so"):
                    path = parts[-1]
                    break
    except OSError:
        pass
    lib = ctypes.CDLL(path)
    vp, sz, i32, u64, i64 = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_uint64, ctypes.c_int64
    lib.cublasLtCreate.argtypes = [ctypes.POINTER(vp)]
    lib.cublasLtMatmulDescCreate.argtypes = [ctypes.POINTER(vp), i32, i32]
    lib.cublasLtMatmulDescSetAttribute.argtypes = [vp, i32, vp, sz]
    lib.cublasLtMatrixLayoutCreate.argtypes = [ctypes.POINTER(vp), i32, u64, u64, i64]
    lib.cublasLtMatrixLayoutDestroy.argtypes = [vp]
    lib.cublasLtMatmulPreferenceCreate.argtypes = [ctypes.POINTER(vp)]
    lib.cublasLtMatmulPreferenceSetAttribute.argtypes = [vp, i32, vp, sz]
    lib.cublasLtMatmulAlgoGetHeuristic.argtypes = [vp, vp, vp, vp, vp, vp, vp, i32, ctypes.POINTER(HeuristicResult),
                                                   ctypes.POINTER(i32)]
    lib.cublasLtMatmul.argtypes = [vp, vp, vp, vp, vp, vp, vp, vp, vp, vp, vp, vp, ctypes.POINTER(HeuristicResult),
                                   vp, sz, vp]
    for name in ("cublasLtCreate", "cublasLtMatmulDescCreate", "cublasLtMatmulDescSetAttribute",
                 "cublasLtMatrixLayoutCreate", "cublasLtMatrixLayoutDestroy", "cublasLtMatmulPreferenceCreate",
                 "cublasLtMatmulPreferenceSetAttribute", "cublasLtMatmulAlgoGetHeuristic", "cublasLtMatmul"):
        getattr(lib, name).restype = i32
    return lib


def _check(status: int, what: str) -> None:
    if status:
        raise RuntimeError(f"{what} failed: cublasStatus {status}")


class LtGemm:
    """`_linear`'s bf16 GEMM through cublasLtMatmul: one matmul descriptor, a layout per matrix shape and an algorithm
    per (N, T, K, output type), made on first use and kept (PLANS_MAX plans, least recently used out first)."""

    def __init__(self, workspace_ptr: int, workspace_bytes: int, lib: Any = None):
        self.lib = lib if lib is not None else load_lib()
        self.ws_ptr, self.ws_bytes = int(workspace_ptr), int(workspace_bytes)
        self.handle = ctypes.c_void_p()
        _check(self.lib.cublasLtCreate(ctypes.byref(self.handle)), "cublasLtCreate")
        self.desc = ctypes.c_void_p()
        _check(self.lib.cublasLtMatmulDescCreate(ctypes.byref(self.desc), CUBLAS_COMPUTE_32F, CUDA_R_32F),
               "cublasLtMatmulDescCreate")
        for attr, op in ((DESC_TRANSA, CUBLAS_OP_T), (DESC_TRANSB, CUBLAS_OP_N)):
            v = ctypes.c_int32(op)
            _check(self.lib.cublasLtMatmulDescSetAttribute(self.desc, attr, ctypes.byref(v), ctypes.sizeof(v)),
                   "cublasLtMatmulDescSetAttribute")
        self.pref = ctypes.c_void_p()
        _check(self.lib.cublasLtMatmulPreferenceCreate(ctypes.byref(self.pref)), "cublasLtMatmulPreferenceCreate")
        ws = ctypes.c_uint64(self.ws_bytes)
        _check(self.lib.cublasLtMatmulPreferenceSetAttribute(self.pref, PREF_MAX_WORKSPACE_BYTES, ctypes.byref(ws),
                                                             ctypes.sizeof(ws)), "cublasLtMatmulPreferenceSetAttribute")
        self.layouts: dict[tuple[int, int, int, int], ctypes.c_void_p] = {}  # (type, rows, cols, ld) -> layout
        self.plans: OrderedDict[tuple[int, int, int, int], tuple] = OrderedDict()
        self.heuristic_calls = 0

    def _layout(self, dtype: int, rows: int, cols: int, ld: int) -> ctypes.c_void_p:
        key = (dtype, rows, cols, ld)
        lay = self.layouts.get(key)
        if lay is None:
            lay = ctypes.c_void_p()
            _check(self.lib.cublasLtMatrixLayoutCreate(ctypes.byref(lay), dtype, rows, cols, ld),
                   "cublasLtMatrixLayoutCreate")
            self.layouts[key] = lay
        return lay

    def plan(self, N: int, T: int, K: int, out_type: int) -> tuple:
        """(A, B, C layouts, the chosen algorithm) for out[T, N] of type out_type (CUDA_R_32F / CUDA_R_16BF)."""
        key = (N, T, K, out_type)
        p = self.plans.get(key)
        if p is not None:
            self.plans.move_to_end(key)
            return p
        a = self._layout(CUDA_R_16BF, K, N, K)
        b = self._layout(CUDA_R_16BF, K, T, K)
        c = self._layout(out_type, N, T, N)
        res = HeuristicResult()
        n = ctypes.c_int(0)
        self.heuristic_calls += 1
        _check(self.lib.cublasLtMatmulAlgoGetHeuristic(self.handle, self.desc, a, b, c, c, self.pref, 1,
                                                       ctypes.byref(res), ctypes.byref(n)),
               "cublasLtMatmulAlgoGetHeuristic")
        if n.value < 1:
            raise RuntimeError(f"cuBLASLt has no algorithm for a bf16 GEMM N {N} T {T} K {K}")
        p = (a, b, c, res)
        self.plans[key] = p
        if len(self.plans) > PLANS_MAX:
            (n0, t0, k0, o0), _ = self.plans.popitem(last=False)
            self._drop_unused({(CUDA_R_16BF, k0, t0, k0), (o0, n0, t0, n0)})
        return p

    def _drop_unused(self, keys: set) -> None:
        """Destroy the layouts among `keys` that no kept plan uses (a prefill's varying T makes new ones)."""
        used = {id(x) for p in self.plans.values() for x in p[:3]}
        for key in keys:
            lay = self.layouts.get(key)
            if lay is not None and id(lay) not in used:
                self.lib.cublasLtMatrixLayoutDestroy(lay)
                del self.layouts[key]

    def matmul(self, N: int, T: int, K: int, alpha_ptr: int, w_ptr: int, x_ptr: int, beta_ptr: int, out_ptr: int,
               out_type: int, stream_ptr: int) -> None:
        """out (col-major N x T, ld N) = alpha W^T-view x + beta out: `_linear`'s gemmEx call, through cuBLASLt."""
        a, b, c, res = self.plan(N, T, K, out_type)
        _check(self.lib.cublasLtMatmul(self.handle, self.desc, alpha_ptr, w_ptr, a, x_ptr, b, beta_ptr, out_ptr, c,
                                       out_ptr, c, ctypes.byref(res), self.ws_ptr, self.ws_bytes, stream_ptr),
               "cublasLtMatmul")
