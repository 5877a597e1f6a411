"""The 4-bit decode GEMV (llmrs/kernels_cu/gemm_q4.cu's gemv_q4 via QuantLinearOps.gemv_q4) on the GPU: run on the
GPU machine with `python3 -m pytest -q -m gpu tests/gpu/test_gemv_q4_gpu.py`; skips cleanly without CuPy or a GPU.

- against numpy: x rounded to bf16 @ the exact dequantized weight (not rounded: the kernel applies scale and zero
  in f32 after the group's mma), float64; fresh random inputs, T = 1..16 (one and two tiles of 8 tokens),
  G 32 / 64 / 128, zero (AWQ, Q4_0) and min (Q4_1) modes, bias and accumulate, one K slice and several (the
  split-K hand-off through the last block of each tile, or on sm_90 a cluster of the slices), outputs poisoned
  with NaN and a poisoned tail past N;
- the cluster launch and the L2 hand-off give the same bits at every cluster size; launches chained in a graph
  with programmatic launch replay the eager bits;
- the paired forms (gate_up + SiLU x up, qkv + RoPE + the paged-cache write in the epilogue) give the bits of
  gemv_q4 + silu_mul / rope_write_kv, kernel by kernel and through a tiny AWQ model's decode graphs;
- the RMSNorm between two GEMVs carried by them (norm_out: o / down also write x * g and the tiles' sums of x^2;
  norm_in: gate_up / qkv scale by 1 / rms): the producer's outputs exactly, the consumer within bf16 rounding of
  rms_norm + the plain form, a tiny AWQ model's decode steps as close to the CPU reference as without it;
- repeated launches give the same bits (fixed reduction order; the per-tile counters go back to 0);
- the backend's decode dispatch takes it for 4-bit weights in the layout and keeps matvec_q4 otherwise;
- a weight whose tiles fill the GPU holds only the reordered copy, and every token count still works from it
  (dequant_marlin_bf16 equal in value to dequant_q4_bf16);
- timing on Qwen2.5-7B shapes beside matvec_q4 (T = 1, 4) and the 4-bit GEMM (T = 16), GB/s of the packed bytes,
  reported, not asserted.
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.cuda_helpers import graph_us, rel_err, report, require_gpu, tiny_awq_runners, tiny_backend

cp = require_gpu()
pytestmark = pytest.mark.gpu

from llmrs.backends.cuda import NULL  # noqa: E402
from llmrs.model.weights import round_bf16  # noqa: E402

from llmrs.model.weights import bf16_to_f32  # noqa: E402
from tests.model.test_quant_marlin import make_weight  # noqa: E402

TOL = 2e-5  # measured ~1e-6 (f32 sums of exact products); a wrong slot pairing or group is O(1)
CASES = [("awq", 64, 64, 32), ("awq", 576, 1536, 128), ("awq", 4608, 3584, 128), ("awq", 128, 8192, 64),
         ("q4_0", 3584, 2048, 32), ("q4_1", 1024, 4096, 32), ("q4_1", 192, 1152, 128)]


@pytest.fixture(scope="module")
def backend():
    return tiny_backend()


@pytest.mark.parametrize("kind,N,K,G", CASES)
def test_gemv_q4_matches_numpy_on_exact_weights(backend, kind, N, K, G):
    rng = np.random.default_rng(N + K + G)
    w = make_weight(kind, N, K, G, rng)
    mw = backend.to_marlin(backend.upload_quantized(w))
    wref = w.dequantize().astype(np.float64)
    worst = 0.0
    for T in list(range(1, 10)) + [12, 15, 16]:
        accumulate, with_bias = T % 2 == 0, T % 3 != 0
        x = rng.standard_normal((T, K)).astype(np.float32)
        bias = rng.standard_normal(N).astype(np.float32) if with_bias else None
        y0 = rng.standard_normal((T, N)).astype(np.float32)
        ref = round_bf16(x).astype(np.float64) @ wref.T + (0 if bias is None else bias) + (y0 if accumulate else 0)
        b = None if bias is None else cp.asarray(bias)
        for splits in (1, 3, None):
            buf = cp.full(T * N + 64, np.nan, dtype=cp.float32)
            out = buf[: T * N].reshape(T, N)
            if accumulate:
                out[...] = cp.asarray(y0)
            assert backend.gemv_q4(cp.asarray(x), mw, b, out, accumulate, splits=splits)
            got = cp.asnumpy(out)
            err = rel_err(got, ref)
            row = max(rel_err(got[t], ref[t]) for t in range(T))
            assert err < TOL and row < TOL, (kind, N, K, G, T, splits, err, row)
            assert bool(cp.isnan(buf[T * N:]).all()), "wrote past the output"
            worst = max(worst, err)
    report(f"gemv_q4 {kind} N{N} K{K} G{G}", {"rel": worst, "splits auto": backend.gemv_splits(N, K)})


def test_gemv_q4_repeats_bit_exactly_and_resets_its_counters(backend):
    rng = np.random.default_rng(11)
    N, K = 3584, 18944  # Qwen2.5-7B down: several K slices per tile
    mw = backend.to_marlin(backend.upload_quantized(make_weight("awq", N, K, 128, rng)))
    x = cp.asarray(rng.standard_normal((2, K)).astype(np.float32))
    first = cp.empty((2, N), dtype=cp.float32)
    assert backend.gemv_q4(x, mw, None, first)
    assert backend.gemv_splits(N, K)[0] > 1
    for _ in range(5):
        again = cp.empty((2, N), dtype=cp.float32)
        assert backend.gemv_q4(x, mw, None, again)
        assert bool((again == first).all())
    assert int(backend._ws["gemv_q4_sem"].sum()) == 0


@pytest.mark.parametrize("kind,N,K,G", [("awq", 4608, 3584, 128), ("awq", 256, 11008, 128), ("q4_1", 1024, 4096, 32),
                                         ("q4_0", 64, 8192, 32)])
def test_gemv_q4_cluster_launch_equals_the_l2_hand_off_bit_exactly(backend, kind, N, K, G, monkeypatch):
    """sm_90+: a split tile's S blocks launched as one cluster (the partials pushed into the first block's shared
    memory) sum the same partials in the same order as the hand-off through L2: the same bits, every S up to
    GEMV_CLUSTER_MAX, T 1..8 (the t16 forms keep the hand-off), bias and accumulate, nothing written past N; more
    slices than a cluster takes stay on the hand-off (its counters back at 0)."""
    import llmrs.backends.cuda.quant_linear as q4gemm

    if backend.k.cc < 90:
        pytest.skip("thread-block clusters need sm_90")
    rng = np.random.default_rng(N + K)
    w = make_weight(kind, N, K, G, rng)
    mw = backend.to_marlin(backend.upload_quantized(w))
    wref = w.dequantize().astype(np.float64)
    sizes = set()
    for T in range(1, 9):
        x = cp.asarray(rng.standard_normal((T, K)).astype(np.float32))
        y0 = cp.asarray(rng.standard_normal((T, N)).astype(np.float32))
        bias = cp.asarray(rng.standard_normal(N).astype(np.float32)) if T % 2 else None
        for splits in range(2, q4gemm.GEMV_CLUSTER_MAX + 3):
            outs = {}
            for cluster in (True, False):
                monkeypatch.setattr(backend, "q4_gemv_cluster", cluster)
                buf = cp.full(T * N + 64, np.nan, dtype=cp.float32)
                out = buf[: T * N].reshape(T, N)
                out[...] = y0
                assert backend.gemv_q4(x, mw, bias, out, accumulate=T > 4, splits=splits)
                assert bool(cp.isnan(buf[T * N:]).all()), "wrote past the output"
                outs[cluster] = cp.asnumpy(out)
            S = backend.gemv_splits(N, K, splits)[0]
            sizes.add(S)
            np.testing.assert_array_equal(outs[True], outs[False], err_msg=f"T {T} S {S}")
            ref = (round_bf16(cp.asnumpy(x)).astype(np.float64) @ wref.T
                   + (0 if bias is None else cp.asnumpy(bias)) + (cp.asnumpy(y0) if T > 4 else 0))
            assert rel_err(outs[True], ref) < TOL, (T, S)
    assert int(backend._ws["gemv_q4_sem"].sum()) == 0
    assert max(sizes) > 2, sizes  # the shapes reach clusters of several sizes (and K slices past them)
    report(f"gemv_q4 cluster {kind} N{N} K{K}", {"cluster sizes": sorted(sizes)})


def test_gemv_q4_cluster_launches_chain_inside_a_programmatic_launch_graph(backend):
    """The decode graph's form: gemv_q4 launches captured with programmatic stream serialization (and, sm_90+, as
    clusters), each reading the previous one's output after its pdl_wait: the replay gives the eager chain's
    bits, twice over."""
    if not backend.k.pdl_capable:
        pytest.skip("programmatic dependent launch needs sm_90 and cuLaunchKernelEx")
    rng = np.random.default_rng(5)
    dims = [3584, 3584, 18944, 3584, 4608]  # o, gate-up-like, down: K slices of 4 and 1 on an H200
    ws = [backend.to_marlin(backend.upload_quantized(make_weight("awq", n, k, 128, rng)))
          for k, n in zip(dims[:-1], dims[1:])]
    x = cp.asarray(rng.standard_normal((1, dims[0])).astype(np.float32))
    outs = [cp.empty((1, n), dtype=cp.float32) for n in dims[1:]]

    def chain():
        src = x
        for mw, out in zip(ws, outs):
            assert backend.gemv_q4(src, mw, None, out)
            src = out

    chain()
    eager = [cp.asnumpy(o) for o in outs]
    stream = cp.cuda.Stream(non_blocking=True)
    launches = backend.k.pdl_launches
    with stream:
        stream.begin_capture()
        backend.k.pdl = True
        try:
            chain()
        finally:
            backend.k.pdl = False
        graph = stream.end_capture()
    assert backend.k.pdl_launches == launches + len(ws)
    for _ in range(2):
        for o in outs:
            o.fill(np.nan)
        graph.launch(stream)
        stream.synchronize()
        for e, o in zip(eager, outs):
            np.testing.assert_array_equal(cp.asnumpy(o), e)
    assert int(backend._ws["gemv_q4_sem"].sum()) == 0


PAIR_CASES = [("awq", 128, 1), ("awq", 128, 3), ("awq", 128, None), ("awq", 128, 7), ("q4_1", 32, None),
              ("q4_0", 32, 2)]


@pytest.mark.parametrize("kind,G,splits", PAIR_CASES)
def test_gemv_q4_silu_pair_equals_gemv_then_silu_mul_bit_exactly(backend, kind, G, splits):
    """gate_up through the paired form (SiLU x up in the epilogue) against gemv_q4 into [T, 2I] and silu_mul: the
    same bits, T 1..8, one K slice, a cluster (S <= 4) and the L2 hand-off (S > 4); nothing past [T, I] written."""
    rng = np.random.default_rng(G + (splits or 0))
    I, K = 1024, 4096  # (up to 8 K slices)
    mw = backend.to_marlin(backend.upload_quantized(make_weight(kind, 2 * I, K, G, rng)))
    for T in range(1, 9):
        x = cp.asarray(rng.standard_normal((T, K)).astype(np.float32))
        gu = cp.empty((T, 2 * I), dtype=cp.float32)
        assert backend.gemv_q4(x, mw, None, gu, splits=splits)
        ref = cp.empty((T, I), dtype=cp.float32)
        backend.k.silu_mul((-(-T * I // 256),), (256,), (gu, ref, np.int32(T), np.int32(I)))
        buf = cp.full(T * I + 64, np.nan, dtype=cp.float32)
        act = buf[: T * I].reshape(T, I)
        backend.gemv_q4_pair("silu", x, mw, act, splits=splits)
        np.testing.assert_array_equal(cp.asnumpy(act), cp.asnumpy(ref), err_msg=f"T {T}")
        assert bool(cp.isnan(buf[T * I:]).all()), "wrote past the output"
    assert int(backend._ws["gemv_q4_sem"].sum()) == 0


@pytest.mark.parametrize("kind,G,splits", PAIR_CASES)
@pytest.mark.parametrize("D", [64, 128])
def test_gemv_q4_rope_pair_equals_gemv_then_rope_write_kv_bit_exactly(backend, kind, G, splits, D):
    """qkv (+ bias) through the paired form (RoPE and the paged-cache write in the epilogue) against gemv_q4 into
    qkv and rope_write_kv: the same q bits in qkv and the same K / V cache bits, T 1..8 at scattered positions and
    slots, 64- and 128-dim heads (pairs of tiles across half a head)."""
    from llmrs.backends.cuda import rope_threads

    rng = np.random.default_rng(D + G + (splits or 0))
    Hq, Hkv, K, bs, blocks = 6, 2, 4096, 16, 64
    N = (Hq + 2 * Hkv) * D
    mw = backend.to_marlin(backend.upload_quantized(make_weight(kind, N, K, G, rng)))
    bias = cp.asarray(rng.standard_normal(N).astype(np.float32))
    inv_freq = cp.asarray((10000.0 ** (-np.arange(0, D, 2) / D)).astype(np.float32))
    for T in range(1, 9):
        x = cp.asarray(rng.standard_normal((T, K)).astype(np.float32))
        positions = cp.asarray(rng.integers(0, 30000, T).astype(np.int32))
        slots = cp.asarray(rng.choice(blocks * bs, T, replace=False).astype(np.int32))
        caches = [cp.zeros((blocks, Hkv, bs, D), dtype=cp.uint16) for _ in range(4)]
        ref = cp.empty((T, N), dtype=cp.float32)
        assert backend.gemv_q4(x, mw, bias, ref, splits=splits)
        backend.k.rope_write_kv((T,), (rope_threads(Hq, Hkv, D),),
                                (ref, positions, inv_freq, slots, caches[0], caches[1], np.int32(Hq), np.int32(Hkv),
                                 np.int32(D), np.int32(bs), NULL))
        got = cp.full((T, N), np.nan, dtype=cp.float32)
        backend.gemv_q4_pair("rope", x, mw, got, bias,
                     (positions, inv_freq, slots, caches[2], caches[3], Hq, Hkv, D, bs), splits=splits)
        q = slice(0, Hq * D)
        np.testing.assert_array_equal(cp.asnumpy(got[:, q]), cp.asnumpy(ref[:, q]), err_msg=f"q, T {T}")
        np.testing.assert_array_equal(cp.asnumpy(caches[2]), cp.asnumpy(caches[0]), err_msg=f"k cache, T {T}")
        np.testing.assert_array_equal(cp.asnumpy(caches[3]), cp.asnumpy(caches[1]), err_msg=f"v cache, T {T}")
        assert bool(cp.isnan(got[:, Hq * D:]).all())  # k and v go to the caches only
        assert int((caches[2] != 0).sum()) > 0 and int((caches[3] != 0).sum()) > 0
    assert int(backend._ws["gemv_q4_sem"].sum()) == 0


@pytest.mark.parametrize("kind,G,splits", [("awq", 128, 1), ("awq", 128, 3), ("q4_1", 32, 7), ("q4_0", 32, None)])
def test_gemv_q4_norm_out_writes_the_next_norms_inputs(backend, kind, G, splits):
    """gemv_q4 with norm_out (o / down carrying the next RMSNorm): `out` the plain launch's bits (accumulating into
    the residual), xg = out * g exactly, ssp [T, N / 32] each 32-column tile's sum of out^2; one K slice, a
    cluster, the L2 hand-off, T 1..8."""
    rng = np.random.default_rng(G + (splits or 0))
    N, K = 1024, 2048
    mw = backend.to_marlin(backend.upload_quantized(make_weight(kind, N, K, G, rng)))
    g = round_bf16(1.0 + 0.3 * rng.standard_normal(N).astype(np.float32))
    for T in range(1, 9):
        x = cp.asarray(rng.standard_normal((T, K)).astype(np.float32))
        y0 = rng.standard_normal((T, N)).astype(np.float32)
        ref, got = cp.asarray(y0), cp.asarray(y0)
        assert backend.gemv_q4(x, mw, None, ref, accumulate=True, splits=splits)
        xg = cp.full((T, N), np.nan, dtype=cp.float32)
        ssp = cp.full((T, N // 32), np.nan, dtype=cp.float32)
        assert backend.gemv_q4(x, mw, None, got, accumulate=True, splits=splits, norm_out=(cp.asarray(g), xg, ssp))
        out = cp.asnumpy(got)
        np.testing.assert_array_equal(out, cp.asnumpy(ref), err_msg=f"T {T}")
        np.testing.assert_array_equal(cp.asnumpy(xg), out * g)
        want = (out.astype(np.float64) ** 2).reshape(T, N // 32, 32).sum(-1)
        np.testing.assert_allclose(cp.asnumpy(ssp), want, rtol=1e-5)
    with pytest.raises(ValueError, match="no bias"):
        backend.gemv_q4(x, mw, cp.zeros(N, dtype=cp.float32), got, norm_out=(cp.asarray(g), xg, ssp))
    assert int(backend._ws["gemv_q4_sem"].sum()) == 0


@pytest.mark.parametrize("kind,G,splits", [("awq", 128, 1), ("awq", 128, 3), ("awq", 128, 4), ("q4_1", 32, 2)])
@pytest.mark.parametrize("epi", ["silu", "rope"])
def test_gemv_q4_pairs_take_the_norm_from_the_producer(backend, kind, G, splits, epi):
    """The paired forms with norm_in (x = the residual times the norm weight, ssp its 32-column tiles' sums of x^2,
    as o / down write them) against rms_norm + the plain paired form, T 1..8, one K slice and clusters of 2-4,
    tokens whose rows differ in scale by 10^7: gate_up's SiLU x up as close to a float64 reference as the unfolded
    path is (x * g rounded to bf16 instead of g * x / rms: the same size of error, not the same bits), q and the K /
    V caches of qkv within that rounding of the unfolded path's; the L2 hand-off (5+ slices) refuses it."""
    rng = np.random.default_rng(G + splits + (7 if epi == "rope" else 0))
    K, eps = 4096, 1e-6
    D, Hq, Hkv, bs, blocks = 128, 4, 2, 16, 64
    N = 2048 if epi == "silu" else (Hq + 2 * Hkv) * D
    w = make_weight(kind, N, K, G, rng)
    mw = backend.to_marlin(backend.upload_quantized(w))
    wref = w.dequantize().astype(np.float64)
    g = round_bf16(1.0 + 0.3 * rng.standard_normal(K).astype(np.float32))
    bias = cp.asarray(rng.standard_normal(N).astype(np.float32)) if epi == "rope" else None
    inv_freq = cp.asarray((10000.0 ** (-np.arange(0, D, 2) / D)).astype(np.float32))
    for T in range(1, 9):
        x = (rng.standard_normal((T, K)) * 10.0 ** rng.uniform(-3, 4, (T, 1))).astype(np.float32)
        normed = cp.empty((T, K), dtype=cp.float32)
        backend._rms_norm(cp.asarray(x), cp.asarray(g), eps, normed)
        xg = cp.asarray(x * g)
        ssp = cp.asarray((x.astype(np.float64) ** 2).reshape(T, K // 32, 32).sum(-1).astype(np.float32))
        if epi == "silu":
            ref = cp.full((T, N // 2), np.nan, dtype=cp.float32)
            got = cp.full((T, N // 2), np.nan, dtype=cp.float32)
            backend.gemv_q4_pair("silu", normed, mw, ref, splits=splits)
            backend.gemv_q4_pair("silu", xg, mw, got, splits=splits, norm_in=(ssp, eps))
            xn = x.astype(np.float64) / np.sqrt((x.astype(np.float64) ** 2).mean(1, keepdims=True) + eps) * g
            gu = xn @ wref.T
            exact = gu[:, : N // 2] / (1.0 + np.exp(-gu[:, : N // 2])) * gu[:, N // 2:]
            e_got, e_ref = rel_err(cp.asnumpy(got), exact), rel_err(cp.asnumpy(ref), exact)
            assert e_got < 1.5 * e_ref + 1e-6 and e_got < 5e-3, (T, e_got, e_ref)
            continue
        positions = cp.asarray(rng.integers(0, 30000, T).astype(np.int32))
        slots = cp.asarray(rng.choice(blocks * bs, T, replace=False).astype(np.int32))
        caches = [cp.zeros((blocks, Hkv, bs, D), dtype=cp.uint16) for _ in range(4)]
        outs = [cp.full((T, N), np.nan, dtype=cp.float32) for _ in range(2)]
        for i, (xi, nin) in enumerate(((normed, None), (xg, (ssp, eps)))):
            backend.gemv_q4_pair("rope", xi, mw, outs[i], bias,
                         (positions, inv_freq, slots, caches[2 * i], caches[2 * i + 1], Hq, Hkv, D, bs),
                         splits=splits, norm_in=nin)
        q = slice(0, Hq * D)
        assert rel_err(cp.asnumpy(outs[1][:, q]), cp.asnumpy(outs[0][:, q])) < 5e-3, T
        for c in (0, 1):  # K, V: the token's slots, as f32
            a, b = (bf16_to_f32(cp.asnumpy(caches[c + 2 * i])) for i in (1, 0))
            assert np.count_nonzero(b) >= T * Hkv * D // 2 and rel_err(a, b) < 5e-3, (T, c)
    with pytest.raises(ValueError, match="cluster"):
        backend.gemv_q4_pair("silu", xg[:1], mw, cp.empty((1, N // 2), dtype=cp.float32), splits=8,
                     norm_in=(ssp, eps))
    assert int(backend._ws["gemv_q4_sem"].sum()) == 0


@pytest.mark.parametrize("G", [32, 128])
def test_awq_decode_with_the_norms_in_the_gemvs_matches_the_cpu_reference(tmp_path, G, monkeypatch):
    """The tiny Qwen2 AWQ model with every linear on the GEMV at one token, decode steps of one and three sequences
    through the decode graphs with the RMSNorms carried by the GEMVs (q4_gemv_norm: o / down write x * g and the sums
    of squares, gate_up / qkv scale) and without: against the CPU reference on the exact dequantized weights, the
    carried step's logits as close to it as the plain step's (both round x to bf16, at different points; this random
    model turns a 2^-9 change of x into a few % of its logits), and the launches: every o and down but the last
    down writing the norm's inputs, every gate_up and qkv but the first taking them, one rms_norm a step (the first
    layer's; the final norm is the sampled rows')."""
    import llmrs.backends.cuda.quant_linear as q4gemm
    from llmrs.backends.cuda import CUDABackend
    from llmrs.engine.batch import build_step_batch
    from llmrs.model.loader import load
    from tests.gpu.test_cuda_parity_gpu import prompts_for
    from tests.gpu.test_quant_gpu import exact_reference

    monkeypatch.setattr(q4gemm, "GEMV_ONE_TOKEN_MIN_WEIGHTS", 0)
    kept, runners = tiny_awq_runners(tmp_path, G, "q4_gemv_norm")
    assert CUDABackend.q4_gemv_norm  # the default
    layers = runners[True].model.w.layers
    for T in (1, 3, 8):
        assert runners[True].backend.q4_norm_chain(layers, T, 64)
        assert not runners[False].backend.q4_norm_chain(layers, T, 64)
    assert not runners[True].backend.q4_norm_chain(layers, 9, 64)
    calls = []
    for name in ("gemv_q4", "gemv_q4_pair"):  # (methods: the forward's and _linear_quant's calls alike)
        real = getattr(CUDABackend, name)
        monkeypatch.setattr(CUDABackend, name, lambda be, *a, _r=real, _n=name, **k: calls.append(
            (be, _n, a[0] if _n == "gemv_q4_pair" else None, k.get("norm_out") is not None
             or k.get("norm_in") is not None)) or _r(be, *a, **k))
    prompts = prompts_for(kept.tokenizer)[:3]
    bs = runners[True].backend.block_size
    tables = [list(range(8 * i, 8 * i + 8)) for i in range(len(prompts))]
    logits = {}
    for fold, run in (*runners.items(), ("cpu", exact_reference(load(str(tmp_path / "awq")), 64))):
        for ids, table in zip(prompts, tables):
            run.execute(build_step_batch([(ids[:-1], 0, table, False)], bs))
        calls.clear()
        one = run.execute(build_step_batch([(prompts[0][-1:], len(prompts[0]) - 1, tables[0], True)], bs))
        three = run.execute(build_step_batch([(ids[-1:], len(ids) - 1, t, True) for ids, t in zip(prompts, tables)],
                                             bs))
        logits[fold] = (np.asarray(one).copy(), np.asarray(three).copy())
        if fold is True:
            carried = [c for c in calls if c[0] is run.backend]
            L = len(layers)
            assert sum(n for _, f, _, n in carried if f == "gemv_q4") >= 2 * (2 * L - 1)
            assert sum(n for _, f, _, n in carried if f == "gemv_q4_pair") >= 2 * (2 * L - 1)
    for step, ref in enumerate(logits["cpu"]):
        e_fold, e_plain = rel_err(logits[True][step], ref), rel_err(logits[False][step], ref)
        report(f"awq norm chain G{G} step {step} logits vs exact cpu", {"carried": e_fold, "plain": e_plain})
        assert e_fold < 2 * e_plain + 1e-3, (step, e_fold, e_plain)


@pytest.mark.parametrize("G", [32, 128])
def test_awq_decode_with_the_fused_epilogues_gives_the_unfused_bits(tmp_path, G, monkeypatch):
    """A tiny Qwen2 AWQ model (64-dim heads, q/k/v bias) with every linear on the GEMV at one token: decode steps
    of one and of three sequences through the decode graphs (programmatic launch, clusters), with the paired forms
    (gate_up + SiLU, qkv + RoPE + KV write) and without (q4_gemv_epilogue False): the same logits, bit for bit,
    and the same greedy tokens."""
    import llmrs.backends.cuda.quant_linear as q4gemm
    from llmrs.backends.cuda import CUDABackend
    from llmrs.engine.batch import build_step_batch
    from tests.gpu.test_cuda_parity_gpu import greedy, prompts_for

    monkeypatch.setattr(q4gemm, "GEMV_ONE_TOKEN_MIN_WEIGHTS", 0)  # every shape on the GEMV at one token
    monkeypatch.setattr(CUDABackend, "q4_gemv_norm", False)  # the norm chain changes the rounding
    kept, runners = tiny_awq_runners(tmp_path, G, "q4_gemv_epilogue")
    assert CUDABackend.q4_gemv_epilogue  # the default
    r = runners[True]
    layer = r.model.w.layers[0]
    assert r.backend.gemv_pair_takes("rope", layer.qkv, 1, 64)
    assert r.backend.gemv_pair_takes("silu", layer.gate_up, 3)
    assert not runners[False].backend.gemv_pair_takes("silu", layer.gate_up, 3)
    real, calls = CUDABackend.gemv_q4_pair, []
    monkeypatch.setattr(CUDABackend, "gemv_q4_pair",
                        lambda be, epi, *a, **k: calls.append((be, epi)) or real(be, epi, *a, **k))
    prompts = prompts_for(kept.tokenizer)[:3]
    bs = r.backend.block_size
    tables = [list(range(8 * i, 8 * i + 8)) for i in range(len(prompts))]
    logits = {}
    for fused, run in runners.items():
        for ids, table in zip(prompts, tables):
            run.execute(build_step_batch([(ids[:-1], 0, table, False)], bs))
        one = run.execute(build_step_batch([(prompts[0][-1:], len(prompts[0]) - 1, tables[0], True)], bs))
        three = run.execute(build_step_batch([(ids[-1:], len(ids) - 1, t, True) for ids, t in zip(prompts, tables)],
                                             bs))
        logits[fused] = (np.asarray(one).copy(), np.asarray(three).copy())
    for a, b in zip(logits[True], logits[False]):
        np.testing.assert_array_equal(a, b)
    n_layers = len(r.model.w.layers)  # each decode step (eager or captured) took both epilogues in every layer
    assert {epi for be, epi in calls} == {"rope", "silu"} and len(calls) >= 4 * n_layers
    assert all(be is r.backend for be, _ in calls)
    assert all(greedy(runners[True], ids) == greedy(runners[False], ids) for ids in prompts)


def test_decode_dispatch_takes_gemv_for_the_layout_and_matvec_otherwise(backend, monkeypatch):
    rng = np.random.default_rng(4)
    calls = []
    from llmrs.backends.cuda import CUDABackend  # (_linear_quant's gemv_q4)

    real = CUDABackend.gemv_q4
    monkeypatch.setattr(CUDABackend, "gemv_q4", lambda *a, **k: calls.append(a[2] is not None) or real(*a, **k))
    # N % 64: no Marlin copy, matvec_q4; one token on the GEMV in the layout (quant_linear.gemv_one_token: every
    # shape by default, K >= 4 N or full tiles under GEMV_ONE_TOKEN_K_PER_N=4), else on matvec_q4
    for N, K, in_layout in [(256, 512, True), (96, 256, False)]:
        w = make_weight("awq", N, K, 128, rng)
        dw = backend.upload_quantized(w)
        x = rng.standard_normal((3, K)).astype(np.float32)
        out = cp.asnumpy(backend.linear(cp.asarray(x), dw))
        exact = x.astype(np.float64) @ w.dequantize().astype(np.float64).T
        ref = round_bf16(x).astype(np.float64) @ w.dequantize().astype(np.float64).T if in_layout else exact
        assert rel_err(out, ref) < TOL
        assert calls[-1] == in_layout
        n_calls = len(calls)
        one = rng.standard_normal((1, K)).astype(np.float32)
        got = cp.asnumpy(backend.linear(cp.asarray(one), dw))
        one_takes = backend.gemv_takes(1, N, K)  # asked (it refuses a weight without the layout: matvec_q4)
        one_gemv = in_layout and one_takes
        assert len(calls) == n_calls + one_takes and (not one_takes or calls[-1] == in_layout)
        if one_gemv:
            assert rel_err(got, round_bf16(one).astype(np.float64) @ w.dequantize().astype(np.float64).T) < TOL
        else:
            assert rel_err(got, one.astype(np.float64) @ w.dequantize().astype(np.float64).T) < 2e-6 * np.sqrt(K)
        n_calls = len(calls)
        backend.q4_gemv = False  # (row form kept at upload): the f32 matvec for the same weight
        try:
            rows = backend.upload_quantized(w)
            assert rel_err(cp.asnumpy(backend.linear(cp.asarray(x), rows)), exact) < 2e-6 * np.sqrt(K)
        finally:
            backend.q4_gemv = True
        assert len(calls) == n_calls
        if in_layout:  # 9..16 tokens: the GEMV's two-tile form, not the 4-bit GEMM
            x12 = rng.standard_normal((12, K)).astype(np.float32)
            got = cp.asnumpy(backend.linear(cp.asarray(x12), dw))
            assert len(calls) == n_calls + 1 and calls[-1]
            assert rel_err(got, round_bf16(x12).astype(np.float64) @ w.dequantize().astype(np.float64).T) < TOL


@pytest.mark.parametrize("shape", ["tiles fill the GPU", "long K"])
@pytest.mark.parametrize("kind,G", [("awq", 128), ("q4_0", 32), ("q4_1", 64)])
def test_weights_the_gemv_takes_at_one_token_hold_only_the_reordered_copy(backend, kind, G, shape):
    """N / 32 >= 4 x SMs (a 7B's gate_up) or K >= 4 N (its down): the GEMV takes even one token, so the row form
    is released and every path reads the GEMM's copy: the GEMV up to 16 tokens, the 4-bit GEMM up to 192, above it
    dequant_marlin_bf16 (the values dequant_q4_bf16 gives from the row form) + cuBLAS."""

    rng = np.random.default_rng(G)
    N, K = (128 * backend.num_sms, 512) if shape == "tiles fill the GPU" else (256, 1024)
    w = make_weight(kind, N, K, G, rng)
    dw = backend.upload_quantized(w)
    assert dw.qweight is None and dw.scales is None and dw.marlin is not None
    assert dw.nbytes == dw.marlin.nbytes and dw.gpu_nbytes == dw.marlin.nbytes
    exact = w.dequantize().astype(np.float64)
    rounded = round_bf16(w.dequantize()).astype(np.float64)
    for T in (1, 5, 12, 40, 200):
        x = rng.standard_normal((T, K)).astype(np.float32)
        out = cp.asnumpy(backend.linear(cp.asarray(x), dw))
        ref = round_bf16(x).astype(np.float64) @ (exact if T <= 16 else rounded).T
        assert rel_err(out, ref) < TOL, (kind, T)
    wb = cp.empty((N, K), dtype=cp.uint16)
    backend.dequant_marlin(dw.marlin, wb)
    backend.q4_gemv = False  # the row form stays (matvec_q4 reads it)
    try:
        both = backend.upload_quantized(w)
    finally:
        backend.q4_gemv = True
    assert both.qweight is not None and both.gpu_nbytes > both.nbytes
    wr = cp.empty((N, K), dtype=cp.uint16)
    backend.k.dequant_q4_bf16((min(65535, -(-(N * K // 8) // 256)),), (256,),
                              (both.qweight, both.scales, NULL if both.zeros is None else both.zeros, wr, np.int32(N),
                               np.int32(K), np.int32(G), np.int32(1 if kind == "q4_1" else 0)))
    # equal values; a zero weight of a negative scale is +0 from frag_b and -0 from dequant_q4_bf16 (gemm_q4.cu)
    as_f32 = lambda bits: bf16_to_f32(cp.asnumpy(bits))  # noqa: E731
    np.testing.assert_array_equal(as_f32(wb), as_f32(wr))
    differ = cp.asnumpy(wb) != cp.asnumpy(wr)
    assert (as_f32(wb)[differ] == 0).all()


@pytest.mark.parametrize("kind,N,K,G", [("awq", 64, 64, 32), ("awq", 96, 320, 64), ("q4_0", 160, 1152, 32),
                                         ("q4_1", 192, 640, 128), ("awq", 4608, 3584, 128)])
def test_both_dequant_kernels_equal_numpy_at_any_grid(backend, kind, N, K, G):
    """dequant_q4_bf16 (row form: a warp 128 words a pass, 4 a lane) and dequant_marlin_bf16 (GEMM layout: two
    records a thread a pass, a quad transpose before each 16-byte store) against numpy's f32 dequantization rounded
    to bf16, at the backend's grid and at grids that leave threads several passes, a lone last record, or idle."""

    rng = np.random.default_rng(N + K)
    w = make_weight(kind, N, K, G, rng)
    backend.q4_gemv = False  # keep the row form beside the GEMM layout
    try:
        dw = backend.upload_quantized(w)
    finally:
        backend.q4_gemv = True
    mw = backend.to_marlin(dw)
    ref = round_bf16(w.dequantize())
    words, records = N * K // 8, N * K // 32
    for blocks in (None, 1, 3, 7, 65535):
        out = cp.full((N, K), 0xFFFF, dtype=cp.uint16)  # NaN bits: a word left unwritten shows
        grid = (min(65535, -(-words // 1024)),) if blocks is None else (blocks,)
        backend.k.dequant_q4_bf16(grid, (256,), (dw.qweight, dw.scales, NULL if dw.zeros is None else dw.zeros, out,
                                                 np.int32(N), np.int32(K), np.int32(G),
                                                 np.int32(1 if kind == "q4_1" else 0)))
        np.testing.assert_array_equal(bf16_to_f32(cp.asnumpy(out)), ref, err_msg=f"row form, grid {grid}")
        if mw is None:
            continue
        out = cp.full((N, K), 0xFFFF, dtype=cp.uint16)
        if blocks is None:
            backend.dequant_marlin(mw, out)
        else:
            backend.k.fns[f"dequant_marlin_{'q4m' if mw.mode else 'q4z'}_bf16"](
                (blocks,), (256,), (mw.qweight, mw.sz, out, np.int32(N), np.int32(K), np.int32(G)))
        # equal values (a zero weight of a negative scale is +0 here, -0 in numpy: assert_array_equal treats them
        # as equal)
        np.testing.assert_array_equal(bf16_to_f32(cp.asnumpy(out)), ref, err_msg=f"GEMM layout, {blocks} blocks")
    assert records % 32 == 0


QWEN7B = {"qkv": (4608, 3584), "o": (3584, 3584), "gate_up": (37888, 3584), "down": (3584, 18944)}


def test_gemv_q4_bandwidth_on_qwen2_5_7b_shapes_beside_matvec_q4(backend):
    """Timing, not asserted: AWQ G128 at T = 1, 4, 16, GB/s of the packed bytes (codes + fp16 scales + zeros),
    each kernel timed inside a CUDA graph (back-to-back launches from Python would time the host). Asserted: the
    two timed kernels' outputs agree to bf16 rounding."""
    rng = np.random.default_rng(0)
    totals: dict[str, float] = {}
    lines = []
    for name, (N, K) in QWEN7B.items():
        w = make_weight("awq", N, K, 128, rng)
        backend.q4_gemv = False  # keep the row form of every shape: matvec_q4 is timed beside
        try:
            dw = backend.upload_quantized(w)
        finally:
            backend.q4_gemv = True
        nbytes = dw.nbytes
        for T in (1, 4, 16):
            x = cp.asarray(rng.standard_normal((T, K)).astype(np.float32))
            out = cp.empty((T, N), dtype=cp.float32)
            figures, outs = {}, {}
            other = "gemm_q4" if T > 8 else "matvec_q4"
            for label, flag in (("gemv_q4", True), (other, False)):
                backend.q4_gemv = flag  # off: backend._linear takes matvec_q4 at any T
                try:
                    us = graph_us(lambda: backend.gemv_q4(x, dw.marlin, None, out) if flag
                                  else backend.linear_q4(x, dw.marlin, None, out) if T > 8
                                  else backend._linear(x, dw, None, out))
                finally:
                    backend.q4_gemv = True
                outs[label] = cp.asnumpy(out).copy()
                figures[label] = {"us": round(us, 2), "GB/s": round(nbytes / us / 1e3, 1)}
                totals[f"{label} T{T}"] = totals.get(f"{label} T{T}", 0.0) + us
            # what was timed computed the same product, to bf16 rounding: gemv_q4 rounds x to bf16 and keeps the
            # dequantized weights f32, matvec_q4 keeps x f32, gemm_q4 rounds both x and the weights to bf16 for the
            # mma (measured on the H200: 1.7e-3 at qkv T16)
            assert np.isfinite(outs["gemv_q4"]).all()
            assert rel_err(outs["gemv_q4"], outs[other]) < 1e-2, (name, T)
            lines.append(f"  {name:8s} N{N} K{K} T{T}: {figures}")
            report(f"gemv_q4 timing {name} T{T}", figures)
        del dw
    totals = {k: round(28 * v / 1e3, 3) for k, v in totals.items()}
    print("\nAWQ G128 linears of Qwen2.5-7B, one layer (inside a CUDA graph):\n" + "\n".join(lines))
    print(f"  28 layers, ms: {totals}")
    report("gemv_q4 timing qwen2.5-7b 28 layers ms", totals)
