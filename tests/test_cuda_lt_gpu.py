"""The bf16 GEMMs through cuBLASLt (cuda_lt.LtGemm, LLMRS_CUBLASLT=1) on the GPU: `python3 -m pytest -q -m gpu
tests/test_cuda_lt_gpu.py` on the GPU machine; skips cleanly without CuPy or a GPU. Written without a GPU (sixteenth
session): it says whether the ctypes bindings are right before the switch is measured
(scripts/prefill_host_profile.py with and without it).

- `_linear` through cuBLASLt against the same call through cublasGemmEx, on the same bf16 operands: equal up to f32
  summation order (the two may pick different algorithms), f32 and bf16 outputs, accumulate, a bias, token counts
  from one to past a 256-token tile, the 7B's shapes;
- a plan is made once per shape (one heuristic query), and the result is the same bits from call to call.
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.cuda_helpers import bf16_words, rel_err, report, require_gpu, tiny_backend

cp = require_gpu()
pytestmark = pytest.mark.gpu

from llmrs.backends.cuda import CUBLAS_WORKSPACE_BYTES, _cublas_workspaces  # noqa: E402
from llmrs.backends.cuda_lt import LtGemm  # noqa: E402

TOL = 1e-5  # f32 sums of the same bf16 products in another order: ~1e-7 relative; a wrong layout is O(1)


@pytest.fixture(scope="module")
def backend():
    be = tiny_backend()
    be._lt = None
    return be


@pytest.fixture(scope="module")
def lt(backend):
    return LtGemm(_cublas_workspaces[cp.cuda.Device().id].data.ptr, CUBLAS_WORKSPACE_BYTES)


def _both(backend, lt, x, w, bias=None, out0=None, accumulate=False, out_bf16=False):
    T, N = x.shape[0], w.shape[0]
    outs = []
    for use in (None, lt):
        backend._lt = use
        if out_bf16:
            out = cp.zeros((T, N), dtype=cp.uint16)
        else:
            out = out0.copy() if out0 is not None else cp.full((T, N), np.nan, dtype=cp.float32)
        try:
            backend._linear(x, w, bias, out, accumulate=accumulate, out_bf16=out_bf16)
        finally:
            backend._lt = None
        outs.append(out)
    return outs


@pytest.mark.parametrize("N,K", [(576, 1536), (4608, 3584), (3584, 18944)])
@pytest.mark.parametrize("T", [2, 17, 64, 256, 300])
def test_lt_equals_gemm_ex(backend, lt, N, K, T):
    rng = np.random.default_rng(N + K + T)
    w = bf16_words(backend, rng.standard_normal((N, K)).astype(np.float32) * 0.05)
    x = bf16_words(backend, rng.standard_normal((T, K)).astype(np.float32))
    ref, got = _both(backend, lt, x, w)
    err = rel_err(cp.asnumpy(got), cp.asnumpy(ref))
    report(f"cublasLt vs gemmEx N{N} K{K} T{T}", {"rel": err})
    assert err < TOL, err
    # accumulate into a residual, with a bias
    bias = cp.asarray(rng.standard_normal(N).astype(np.float32))
    y0 = cp.asarray(rng.standard_normal((T, N)).astype(np.float32))
    ref, got = _both(backend, lt, x, w, bias=bias, out0=y0, accumulate=True)
    assert rel_err(cp.asnumpy(got), cp.asnumpy(ref)) < TOL


def test_bf16_output_and_one_plan_a_shape(backend, lt):
    N, K, T = 4608, 3584, 256
    rng = np.random.default_rng(5)
    w = bf16_words(backend, rng.standard_normal((N, K)).astype(np.float32) * 0.05)
    x = bf16_words(backend, rng.standard_normal((T, K)).astype(np.float32))
    ref, got = _both(backend, lt, x, w, out_bf16=True)
    as_f32 = lambda a: (cp.asnumpy(a).astype(np.uint32) << 16).view(np.float32)  # noqa: E731
    assert rel_err(as_f32(got), as_f32(ref)) < 1e-2  # one bf16 rounding of sums that may differ in the last f32 bit
    outs = [_both(backend, lt, x, w)[1]]
    before = lt.heuristic_calls
    outs += [_both(backend, lt, x, w)[1] for _ in range(2)]
    assert lt.heuristic_calls == before  # the plan made once
    for o in outs[1:]:
        np.testing.assert_array_equal(cp.asnumpy(o), cp.asnumpy(outs[0]))
