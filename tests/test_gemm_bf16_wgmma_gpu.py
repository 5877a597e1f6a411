"""The bf16 wgmma GEMM (gemm_q4.cu's gemm_bf16wg_s{S} via cuda_wgmma.gemm_bf16wg: sm_90a, K split over a
thread-block cluster) on the GPU: `python3 -m pytest -q -m gpu tests/test_gemm_bf16_wgmma_gpu.py` on the GPU machine;
skips cleanly without CuPy or a GPU, and on GPUs without sm_90a.

- against numpy: bf16 x @ bf16 W in float64, every tile edge (T from 1 to 300 tokens: one token of a 128-token tile
  to two and a part; N 576 = 4.5 column tiles), every cluster size, bias and accumulate, outputs poisoned with NaN;
- against the backend's cuBLAS GEMM on the same bf16 operands (equal up to f32 summation order) and bit-identical
  from run to run (the cluster sums its partials in a fixed order);
- the backend's `_linear` takes it where `bf16_wgmma_takes` says (LLMRS_BF16_WGMMA=1's switch set here).
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.cuda_helpers import bf16_words, rel_err, report, require_gpu, tiny_backend

cp = require_gpu()
pytestmark = pytest.mark.gpu

from llmrs.backends.cuda import round_bf16  # noqa: E402
from llmrs.backends.cuda_kernels import WG_SPLITS  # noqa: E402
from llmrs.backends.cuda_wgmma import bf16_wgmma_takes, gemm_bf16wg  # noqa: E402

TOL = 1e-5  # f32 sums of exact bf16 products against float64: ~1e-7; a wrong tile, row or slice is O(1)


@pytest.fixture(scope="module")
def backend():
    be = tiny_backend()
    if not be.k.wgmma_arch:
        pytest.skip(f"wgmma needs compute capability 9.0 (this GPU: {be.k.cc})")
    return be


@pytest.mark.parametrize("N,K", [(576, 1536), (4608, 3584)])
def test_matches_numpy_at_every_tile_edge_and_cluster_size(backend, N, K):
    rng = np.random.default_rng(N + K)
    w = rng.standard_normal((N, K)).astype(np.float32) * 0.05
    wb, wref = bf16_words(backend, w), round_bf16(w).astype(np.float64)
    worst = 0.0
    for idx, T in enumerate([1, 64, 100, 128, 200, 256, 300]):
        accumulate, with_bias = idx % 2 == 1, idx % 3 != 1
        x = rng.standard_normal((T, K)).astype(np.float32)
        bias = rng.standard_normal(N).astype(np.float32) if with_bias else None
        y0 = rng.standard_normal((T, N)).astype(np.float32)
        ref = round_bf16(x).astype(np.float64) @ wref.T + (0 if bias is None else bias) + (y0 if accumulate else 0)
        xb = bf16_words(backend, x)
        b = None if bias is None else cp.asarray(bias)
        for S in (*WG_SPLITS, None):
            out = cp.asarray(y0) if accumulate else cp.full((T, N), np.nan, dtype=cp.float32)
            gemm_bf16wg(backend, xb, wb, b, out, accumulate, splits=S)
            got = cp.asnumpy(out)
            err = rel_err(got, ref)
            row = max(rel_err(got[t], ref[t]) for t in range(T))  # a wrong tail row or tile shows here
            assert err < TOL and row < TOL, (N, K, T, S, accumulate, with_bias, err, row)
            worst = max(worst, err)
    report(f"gemm_bf16wg N{N} K{K}", {"rel": worst})


def test_equals_cublas_and_repeats_bit_for_bit(backend, monkeypatch):
    N, K, T = 3584, 18944, 256  # a 7B's down at a 256-sequence step
    rng = np.random.default_rng(3)
    wb = bf16_words(backend, rng.standard_normal((N, K)).astype(np.float32) * 0.02)
    xb = bf16_words(backend, rng.standard_normal((T, K)).astype(np.float32))
    ref = cp.zeros((T, N), dtype=cp.float32)
    monkeypatch.setattr(backend.k, "bf16_wgmma", False)  # _linear: cuBLAS
    backend._linear(xb, wb, None, ref)
    a, b = cp.full((T, N), np.nan, dtype=cp.float32), cp.full((T, N), np.nan, dtype=cp.float32)
    gemm_bf16wg(backend, xb, wb, None, a)
    gemm_bf16wg(backend, xb, wb, None, b)
    np.testing.assert_array_equal(cp.asnumpy(a), cp.asnumpy(b))
    assert rel_err(cp.asnumpy(a), cp.asnumpy(ref)) < TOL


def test_backend_linear_takes_it_where_the_rule_says(backend, monkeypatch):
    backend.k.wgmma_fns()
    monkeypatch.setattr(backend.k, "bf16_wgmma", True)  # LLMRS_BF16_WGMMA=1's switch
    rng = np.random.default_rng(5)
    for N, K, T in [(4608, 3584, 256), (3584, 3584, 128)]:
        assert bf16_wgmma_takes(backend, T, N, K)
        wb = bf16_words(backend, rng.standard_normal((N, K)).astype(np.float32) * 0.02)
        x = rng.standard_normal((T, K)).astype(np.float32)
        bias = cp.asarray(rng.standard_normal(N).astype(np.float32))
        y0 = cp.asarray(rng.standard_normal((T, N)).astype(np.float32))
        out = y0.copy()
        backend._linear(cp.asarray(x), wb, bias, out, accumulate=True)  # f32 x: cast to bf16 first, as for cuBLAS
        ref = round_bf16(x).astype(np.float64) @ cp.asnumpy(bf16_as_f32(wb)).astype(np.float64).T
        assert rel_err(cp.asnumpy(out), ref + cp.asnumpy(bias) + cp.asnumpy(y0)) < TOL
    assert not bf16_wgmma_takes(backend, 256, 37888, 3584)  # gate_up's 592 tiles fill the GPU: cuBLAS


def bf16_as_f32(wb):
    """bf16 words as float32 (exact)."""
    return (wb.astype(cp.uint32) << 16).view(cp.float32)
