"""The Marlin-style 4-bit GEMM (llmrs/kernels_cu/gemm_q4.cu via QuantLinearOps.gemm_q4) on the GPU: run on the GPU
machine with `python3 -m pytest -q -m gpu tests/gpu/test_gemm_q4_gpu.py`; skips cleanly without CuPy or a GPU.

- against numpy: x rounded to bf16 @ the dequantized weight rounded to bf16 (what dequant_q4_bf16 gives), float64
  accumulation; fresh random inputs, T from 9 (one m16 tile, mostly padding) to 256, N with a half block
  (576 = 4.5 x 128), G 128 and 32, zero (AWQ, Q4_0) and min (Q4_1) modes, accumulate and bias, one slice of K
  and the automatic split-K; outputs poisoned with NaN first; the same for the wgmma form (sm_90a GPUs), which
  the backend takes by default there (kernels.wgmma), and for its 256-token form (kernels.wgmma_t256;
  on by default); the backend's path through each against dequantize + cuBLAS;
- against the existing dequantize + cuBLAS path (the same bf16 weights: equal up to f32 summation order);
- the GPU reorder equals the numpy one; shapes outside the kernel come back None / False (fall back);
- timing beside dequantize + cuBLAS, reported (TFLOP/s), not asserted.
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.cuda_helpers import bf16_words, rel_err, report, require_gpu, tiny_backend

cp = require_gpu()
pytestmark = pytest.mark.gpu

from llmrs.model import quant as Q  # noqa: E402
from llmrs.backends.cuda import NULL  # noqa: E402
from llmrs.model.weights import round_bf16  # noqa: E402
from tests.model.test_quant_marlin import make_weight  # noqa: E402

TOL = 2e-3  # measured errors are ~1e-6 (same bf16 inputs, f32 vs f64 sums); a wrong tile or group is >> TOL
SHAPES = [(128, 256), (576, 1536), (3584, 3584)]
FORMATS = [("awq", 128), ("awq", 32), ("q4_0", 32), ("q4_1", 32), ("q4_1", 128)]
TOKENS = [9, 16, 33, 64, 100, 200, 256]  # 100: one partial 128-token (MT 8) tile; 200: a full one and a partial one
WG_TOKENS = [1, 9, 100, 128, 129, 200, 256, 300]  # the wgmma form: one token of a 128-token tile .. 2 and a part
W2_TOKENS = [1, 100, 129, 256, 300, 513]  # its 256-token form: one token of a tile .. 2 and a part of a third


@pytest.fixture(scope="module")
def backend():
    return tiny_backend()


def upload_with_rows(backend, w):
    """w on the GPU with its row form kept beside the GEMM layout (CudaOptions.q4_gemv=0's upload; by default a 4-bit
    weight in the layout holds only the reordered copy): dequant_q4_bf16 reads it for an independent reference."""
    backend.q4_gemv = False
    try:
        dw = backend.upload_quantized(w)
    finally:
        backend.q4_gemv = True
    assert dw.qweight is not None
    return dw


def dequant_cublas(backend, x, dw, bias, out, accumulate, mw=None):
    """The path above quant_linear.MAX_TOKENS, explicitly: the weight dequantized into a bf16 matrix (from the GEMM
    layout with mw, as the backend does where it has one; else dequant_q4_bf16 from the row form), then the
    backend's cuBLAS GEMM."""
    N, K = dw.shape
    wb = cp.empty((N, K), dtype=cp.uint16)
    if mw is not None:
        backend.dequant_marlin(mw, wb)
        return backend._linear(x, wb, bias, out, accumulate)
    assert dw.qweight is not None, "no row form: upload it with upload_with_rows"
    backend.k.dequant_q4_bf16((min(65535, -(-(N * K // 8) // 256)),), (256,),
                              (dw.qweight, dw.scales, NULL if dw.zeros is None else dw.zeros, wb, np.int32(N),
                               np.int32(K), np.int32(dw.group_size), np.int32(1 if dw.mode == "min" else 0)))
    backend._linear(x, wb, bias, out, accumulate)


def check(out, ref, what):
    out = cp.asnumpy(out)
    err = rel_err(out, ref)
    row = max(rel_err(out[t], ref[t]) for t in range(ref.shape[0]))  # a wrong tail row or tile shows here
    assert err < TOL and row < TOL, (what, err, row)
    return err


@pytest.mark.parametrize("form", ["mma", "wgmma", "wgmma256"])
@pytest.mark.parametrize("N,K", SHAPES)
@pytest.mark.parametrize("kind,G", FORMATS)
def test_gemm_q4_matches_numpy_bf16_reference(backend, N, K, kind, G, form):
    """Every form: mma.sync (gemm_q4{z,m}_m<MT>) and the Hopper ones (wgmma, sm_90a: gemm_q4wg{z,m}, its 128-token
    tiles from one token to two and a partial third; gemm_q4w2{z,m}, 256-token tiles from one token to two and a
    partial third; 3 K slices too)."""
    wgmma, t256 = form != "mma", form == "wgmma256"
    if wgmma and not backend.k.wgmma_arch:
        pytest.skip(f"wgmma needs compute capability 9.0 (this GPU: {backend.k.cc})")
    rng = np.random.default_rng(N + K + G + 7 * wgmma + 11 * t256)
    w = make_weight(kind, N, K, G, rng)
    dw = backend.upload_quantized(w)
    mw = backend.to_marlin(dw)
    assert mw is not None and mw.mode == (1 if kind == "q4_1" else 0)
    np.testing.assert_array_equal(cp.asnumpy(mw.qweight), Q.marlin_reorder(w.qweight))
    wref = round_bf16(w.dequantize()).astype(np.float64)
    worst = 0.0
    for idx, T in enumerate(W2_TOKENS if t256 else WG_TOKENS if wgmma else TOKENS):
        accumulate, with_bias = idx % 2 == 1, idx % 3 != 1
        x = rng.standard_normal((T, K)).astype(np.float32)
        bias = rng.standard_normal(N).astype(np.float32) if with_bias else None
        y0 = rng.standard_normal((T, N)).astype(np.float32)
        ref = round_bf16(x).astype(np.float64) @ wref.T
        if bias is not None:
            ref = ref + bias
        if accumulate:
            ref = ref + y0
        xb = bf16_words(backend, x)
        b = None if bias is None else cp.asarray(bias)
        for splits in (1, 3, None) if wgmma else (1, None):
            out = cp.asarray(y0) if accumulate else cp.full((T, N), np.nan, dtype=cp.float32)
            assert backend.gemm_q4(xb, mw, b, out, accumulate, splits=splits, wgmma=wgmma, t256=t256)
            worst = max(worst, check(out, ref, f"{form} {kind} G{G} N{N} K{K} T{T} acc{accumulate} "
                                               f"bias{with_bias} splits{splits}"))
        if not wgmma:
            out = cp.asarray(y0) if accumulate else cp.full((T, N), np.nan, dtype=cp.float32)
            assert backend.linear_q4(cp.asarray(x), mw, b, out, accumulate)  # from f32 x, through gemm_x
            worst = max(worst, check(out, ref, f"linear_q4 {kind} G{G} N{N} K{K} T{T}"))
    report(f"gemm_q4{'' if form == 'mma' else ' ' + form} {kind} G{G} N{N} K{K}", {"rel": worst})


@pytest.mark.parametrize("kind,G", [("awq", 128), ("q4_0", 32), ("q4_1", 32)])
@pytest.mark.parametrize("T", [9, 40, 256])
def test_gemm_q4_equals_dequantize_plus_cublas(backend, kind, G, T):
    N, K = 576, 1536
    rng = np.random.default_rng(T + G)
    w = make_weight(kind, N, K, G, rng)
    dw = upload_with_rows(backend, w)
    mw = backend.to_marlin(dw)
    x = cp.asarray(rng.standard_normal((T, K)).astype(np.float32))
    bias = cp.asarray(rng.standard_normal(N).astype(np.float32))
    y0 = cp.asarray(rng.standard_normal((T, N)).astype(np.float32))
    for accumulate in (False, True):
        ref = y0.copy() if accumulate else cp.zeros((T, N), dtype=cp.float32)
        dequant_cublas(backend, x, dw, bias, ref, accumulate)
        out = y0.copy() if accumulate else cp.full((T, N), np.nan, dtype=cp.float32)
        assert backend.linear_q4(x, mw, bias, out, accumulate)
        err = check(out, cp.asnumpy(ref).astype(np.float64), f"vs cublas {kind} T{T} acc{accumulate}")
        report(f"gemm_q4 vs dequant+cublas {kind} G{G} T{T} acc{accumulate}", {"rel": err})


@pytest.mark.parametrize("t256,T", [(False, 256), (True, 256), (True, 480)], ids=["wgmma", "wgmma256", "wgmma256-T480"])
def test_backend_takes_wgmma_above_mma_sync_tokens(backend, monkeypatch, t256, T):
    """Where the GPU has it, a 4-bit linear of 256 tokens (a 256-sequence decode step) goes through the wgmma GEMM
    (its 256-token form unless kernels.wgmma_t256 is off; that form also takes 425-512 tokens: two of its tiles), not
    dequantize + cuBLAS, and equals the latter up to summation order."""
    import llmrs.backends.cuda.quant_linear as q4gemm

    if not backend.k.wgmma_arch:
        pytest.skip(f"wgmma needs compute capability 9.0 (this GPU: {backend.k.cc})")
    backend.k.wgmma_fns()
    monkeypatch.setattr(backend.k, "wgmma", True)  # the wgmma switch (on by default where sm_90a)
    monkeypatch.setattr(backend.k, "wgmma_t256", t256)  # its 256-token form
    N, K = 576, 1536
    rng = np.random.default_rng(11)
    dw = upload_with_rows(backend, make_weight("awq", N, K, 128, rng))
    assert q4gemm.gemm_takes(T, N, K, backend.k.wgmma, t256) and backend.wgmma_takes(T)
    assert backend.w2_takes(T) == t256
    x = cp.asarray(rng.standard_normal((T, K)).astype(np.float32))
    out = cp.full((T, N), np.nan, dtype=cp.float32)
    backend._linear_quant(x, dw, None, out, False, "t")
    ref = cp.zeros((T, N), dtype=cp.float32)
    dequant_cublas(backend, x, dw, None, ref, False)
    check(out, cp.asnumpy(ref).astype(np.float64), f"backend wgmma (t256 {t256}) vs dequant+cublas")
    # its input as bf16 words (the producers write them where it runs: `_gemm_takes_bf16`): the same result uncast
    assert backend._gemm_takes_bf16(dw, T) and not backend._gemm_out_bf16(dw, T)
    out2 = cp.full((T, N), np.nan, dtype=cp.float32)
    backend._linear(bf16_words(backend, cp.asnumpy(x)), dw, None, out2)
    np.testing.assert_array_equal(cp.asnumpy(out2), cp.asnumpy(out))


def test_bf16_input_to_the_mma_gemm_gives_the_cast_paths_bits(backend, monkeypatch):
    """CudaOptions.q4_bf16_input (on by default): at 17-192 tokens the mma.sync GEMM reads x as bf16 words from the
    producers instead of casting f32 x itself; the same bits either way."""
    monkeypatch.setattr(backend, "q4_bf16_input", True)
    N, K, T = 576, 1536, 64
    rng = np.random.default_rng(13)
    dw = backend.upload_quantized(make_weight("awq", N, K, 128, rng))
    assert backend._gemm_takes_bf16(dw, T) and not backend._gemm_out_bf16(dw, T)
    x = rng.standard_normal((T, K)).astype(np.float32)
    a, b = cp.full((T, N), np.nan, dtype=cp.float32), cp.full((T, N), np.nan, dtype=cp.float32)
    backend._linear_quant(cp.asarray(x), dw, None, a, False, "f32 x")
    backend._linear(bf16_words(backend, x), dw, None, b)
    np.testing.assert_array_equal(cp.asnumpy(a), cp.asnumpy(b))
    assert np.isfinite(cp.asnumpy(b)).all()


def test_shapes_outside_the_kernel_fall_back(backend):
    rng = np.random.default_rng(0)
    assert backend.to_marlin(backend.upload_quantized(make_weight("awq", 96, 256, 128, rng))) is None  # N % 64
    assert backend.to_marlin(backend.upload_quantized(make_weight("q4_0", 64, 96, 32, rng))) is None  # K % 64
    assert backend.to_marlin(backend.upload_quantized(make_weight("awq", 64, 192, 96, rng))) is None  # G 96
    q8 = Q.gguf_to_rows(np.zeros(64 * 64 // 32 * 34, dtype=np.uint8), 8, 64, 64)
    assert backend.to_marlin(backend.upload_quantized(q8)) is None
    out = cp.zeros((9, 64), dtype=cp.float32)
    assert not backend.gemm_q4(cp.zeros((9, 64), dtype=cp.uint16), None, None, out)


def test_gemm_q4_timing_beside_dequantize_plus_cublas(backend, monkeypatch):
    """Figures for the notes: 7B-like shapes (qkv, down), prefill-sized and batched-decode-sized T (timings not
    asserted; the two paths' outputs are), and from 65 tokens the 64-token tiles (MT 4) beside the 128-token ones
    (MT 8, quant_linear.MT8_FROM)."""
    import llmrs.backends.cuda.quant_linear as q4gemm

    def gemm_mt4(xb, mw, out):
        monkeypatch.setattr(q4gemm, "MT8_FROM", 0)
        try:
            return backend.gemm_q4(xb, mw, None, out, wgmma=False)
        finally:
            monkeypatch.undo()

    rng = np.random.default_rng(5)
    for N, K in [(4608, 3584), (3584, 18944), (37888, 3584)]:
        w = make_weight("awq", N, K, 128, rng)
        dw = backend.upload_quantized(w)
        mw = backend.to_marlin(dw)
        for T in (16, 64, 96, 128, 192, 256, 1024):
            x = cp.asarray(rng.standard_normal((T, K)).astype(np.float32))
            xb = bf16_words(backend, x)
            out = cp.empty((T, N), dtype=cp.float32)
            figures, outs = {}, {}
            forms = [("gemm_q4", lambda: backend.gemm_q4(xb, mw, None, out, wgmma=False)),
                     ("dequant+cublas", lambda: dequant_cublas(backend, x, dw, None, out, False, mw))]
            if backend.k.wgmma_arch:
                forms.append(("wgmma", lambda: backend.gemm_q4(xb, mw, None, out, wgmma=True)))
            if q4gemm.tile_rows(T) == 8:
                forms.append(("gemm_q4 MT4", lambda: gemm_mt4(xb, mw, out)))
            for label, fn in forms:
                fn()
                outs[label] = cp.asnumpy(out).copy()
                start, stop = cp.cuda.Event(), cp.cuda.Event()
                start.record()
                for _ in range(10):
                    fn()
                stop.record()
                stop.synchronize()
                us = cp.cuda.get_elapsed_time(start, stop) * 1e3 / 10
                figures[label] = {"us": round(us, 1), "tflops": round(2 * T * N * K / us / 1e6, 1)}
            # what was timed computed the same product (both on bf16 x and the same bf16 weight values)
            assert np.isfinite(outs["gemm_q4"]).all()
            assert rel_err(outs["gemm_q4"], outs["dequant+cublas"]) < 1e-4, (N, K, T)
            for other in ("gemm_q4 MT4", "wgmma"):  # the same sums (K slices may differ: the tile count sets them)
                if other in outs:
                    assert rel_err(outs["gemm_q4"], outs[other]) < 1e-4, (N, K, T, other)
            report(f"gemm_q4 timing N{N} K{K} T{T}", figures)
            print(f"N{N} K{K} T{T}: {figures}")
