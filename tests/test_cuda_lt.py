"""cuda_lt.LtGemm (the bf16 GEMMs through cuBLASLt, LLMRS_CUBLASLT=1) against a recording stand-in for libcublasLt:
the descriptors it sets (W transposed, x not, fp32 compute and scale), the layouts (W's stored K x N, x's K x T, the
output's N x T, each with its leading dimension), one heuristic query per (N, T, K, output type) and the argument
order of cublasLtMatmul; the least recently used plans go, with the layouts nothing else uses. On a GPU:
tests/test_cuda_lt_gpu.py."""

from __future__ import annotations

import ctypes

import pytest

from llmrs.backends import cuda_lt
from llmrs.backends.cuda_lt import CUDA_R_16BF, CUDA_R_32F, LtGemm


class FakeLt:
    """Records the calls; hands out handles 1, 2, 3, ... through the out-pointers; one algorithm per query."""

    def __init__(self, algos: int = 1):
        self.calls: list[tuple] = []
        self.next = 100
        self.algos = algos
        self.layouts: dict[int, tuple] = {}
        self.destroyed: list[tuple] = []

    def _new(self, ref) -> int:
        self.next += 1
        ref._obj.value = self.next
        return self.next

    def cublasLtCreate(self, ref):
        self._new(ref)
        return 0

    def cublasLtMatmulDescCreate(self, ref, compute, scale):
        self.calls.append(("desc", compute, scale))
        self._new(ref)
        return 0

    def cublasLtMatmulDescSetAttribute(self, desc, attr, ref, size):
        self.calls.append(("desc_attr", attr, ref._obj.value, size))
        return 0

    def cublasLtMatmulPreferenceCreate(self, ref):
        self._new(ref)
        return 0

    def cublasLtMatmulPreferenceSetAttribute(self, pref, attr, ref, size):
        self.calls.append(("pref_attr", attr, ref._obj.value, size))
        return 0

    def cublasLtMatrixLayoutCreate(self, ref, dtype, rows, cols, ld):
        self.layouts[self._new(ref)] = (dtype, rows, cols, ld)
        return 0

    def cublasLtMatrixLayoutDestroy(self, lay):
        self.destroyed.append(self.layouts.pop(lay.value))
        return 0

    def cublasLtMatmulAlgoGetHeuristic(self, handle, desc, a, b, c, d, pref, want, res_ref, n_ref):
        self.calls.append(("heuristic", self.layouts[a.value], self.layouts[b.value], self.layouts[c.value],
                           d.value == c.value, want))
        res_ref._obj.algo[0] = 7
        n_ref._obj.value = self.algos
        return 0

    def cublasLtMatmul(self, handle, desc, alpha, A, a, B, b, beta, C, c, D, d, algo_ref, ws, ws_bytes, stream):
        self.calls.append(("matmul", alpha, A, self.layouts[a.value], B, self.layouts[b.value], beta, C,
                           self.layouts[c.value], D, d.value == c.value, algo_ref._obj.algo[0], ws, ws_bytes, stream))
        return 0


def test_descriptors_layouts_and_one_heuristic_query_per_shape():
    lib = FakeLt()
    lt = LtGemm(0xABC000, 32 << 20, lib=lib)
    assert ("desc", cuda_lt.CUBLAS_COMPUTE_32F, CUDA_R_32F) in lib.calls
    assert ("desc_attr", cuda_lt.DESC_TRANSA, cuda_lt.CUBLAS_OP_T, 4) in lib.calls
    assert ("desc_attr", cuda_lt.DESC_TRANSB, cuda_lt.CUBLAS_OP_N, 4) in lib.calls
    assert ("pref_attr", cuda_lt.PREF_MAX_WORKSPACE_BYTES, 32 << 20, 8) in lib.calls
    N, T, K = 4608, 256, 3584
    for _ in range(3):
        lt.matmul(N, T, K, 11, 0x1000, 0x2000, 12, 0x3000, CUDA_R_32F, 0x77)
    heur = [c for c in lib.calls if c[0] == "heuristic"]
    assert heur == [("heuristic", (CUDA_R_16BF, K, N, K), (CUDA_R_16BF, K, T, K), (CUDA_R_32F, N, T, N), True, 1)]
    mm = [c for c in lib.calls if c[0] == "matmul"]
    assert len(mm) == 3 and lt.heuristic_calls == 1
    assert mm[0] == ("matmul", 11, 0x1000, (CUDA_R_16BF, K, N, K), 0x2000, (CUDA_R_16BF, K, T, K), 12, 0x3000,
                     (CUDA_R_32F, N, T, N), 0x3000, True, 7, 0xABC000, 32 << 20, 0x77)
    # another output type or token count: its own plan; W's layout is shared
    lt.matmul(N, T, K, 11, 0x1000, 0x2000, 12, 0x3000, CUDA_R_16BF, 0x77)
    lt.matmul(N, 17, K, 11, 0x1000, 0x2000, 12, 0x3000, CUDA_R_32F, 0x77)
    assert lt.heuristic_calls == 3 and len(lt.plans) == 3
    assert sum(1 for v in lib.layouts.values() if v == (CUDA_R_16BF, K, N, K)) == 1


def test_least_recently_used_plans_go_with_their_own_layouts(monkeypatch):
    monkeypatch.setattr(cuda_lt, "PLANS_MAX", 2)
    lib = FakeLt()
    lt = LtGemm(1, 1 << 20, lib=lib)
    N, K = 64, 128
    lt.plan(N, 10, K, CUDA_R_32F)
    lt.plan(N, 20, K, CUDA_R_32F)
    lt.plan(N, 10, K, CUDA_R_32F)  # used again: T 20 is now the oldest
    lt.plan(N, 30, K, CUDA_R_32F)
    assert list(lt.plans) == [(N, 10, K, CUDA_R_32F), (N, 30, K, CUDA_R_32F)]
    assert sorted(lib.destroyed) == [(CUDA_R_32F, N, 20, N), (CUDA_R_16BF, K, 20, K)]
    assert (CUDA_R_16BF, K, N, K) in lib.layouts.values()  # W's layout stays


def test_no_algorithm_or_a_failed_call_is_an_error():
    lt = LtGemm(1, 1 << 20, lib=FakeLt(algos=0))
    with pytest.raises(RuntimeError, match="no algorithm"):
        lt.plan(64, 8, 128, CUDA_R_32F)
    bad = FakeLt()
    bad.cublasLtMatmul = lambda *a: 13  # CUBLAS_STATUS_EXECUTION_FAILED
    lt = LtGemm(1, 1 << 20, lib=bad)
    with pytest.raises(RuntimeError, match="cublasLtMatmul failed: cublasStatus 13"):
        lt.matmul(64, 8, 128, 1, 2, 3, 4, 5, CUDA_R_32F, 0)


def test_heuristic_result_is_the_headers_layout():
    """cublasLtMatmulHeuristicResult_t: a 64-byte algorithm, size_t, status, float, int[4] (96 bytes, the algorithm
    first: cublasLtMatmul takes a pointer to it)."""
    assert ctypes.sizeof(cuda_lt.HeuristicResult) == 96 and cuda_lt.HeuristicResult.algo.offset == 0
