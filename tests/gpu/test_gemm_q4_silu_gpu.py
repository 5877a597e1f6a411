"""The 4-bit GEMMs' SiLU forms (llmrs/kernels_cu/gemm_q4.cu's gemm_q4{wg,w2}{z,m}_silu_s{S} and
gemm_q4{z,m}_silu_m4 + gemm_q4_reduce_silu, via QuantLinearOps.gemm_q4_silu) on the GPU: run on the GPU machine with
`python3 -m pytest -q -m gpu tests/gpu/test_gemm_q4_silu_gpu.py`; skips cleanly without CuPy or a GPU (the wgmma cases
without sm_90a).

- gate_up through a SiLU form (SiLU x up in the epilogue, bf16 out) gives the bits of gemm_q4 into [T, 2I] f32
  + silu_mul_bf16, for the 128-token wgmma form (gemm_q4wg), the 256-token one (gemm_q4w2) at every cluster size,
  and mma.sync's MT 4 with one K slice and several (the split-K epilogue gemm_q4_reduce_silu); partial token
  tiles, zero and min modes, G 128 and 32; nothing written past [T, I];
- a tiny Qwen2 AWQ model's batched steps (40, 100 and 200 tokens: mma.sync and both wgmma forms) with the SiLU
  forms and without (CudaOptions.q4_gemm_epilogue=0) give the same logits bit for bit.
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.cuda_helpers import bf16_words, require_gpu, tiny_awq_runners, tiny_backend

cp = require_gpu()
pytestmark = pytest.mark.gpu

from tests.model.test_quant_marlin import make_weight  # noqa: E402

# form: (wgmma, t256, token counts); "mma": mma.sync's MT 4 (33-192 tokens)
FORMS = {"wg": (True, False, [9, 65, 100, 128, 200]), "w2": (True, True, [100, 129, 256, 300, 480]),
         "mma": (False, None, [33, 40, 64, 100, 192])}
CASES = [("awq", 128, 1), ("awq", 128, 2), ("awq", 128, 3), ("awq", 128, 4), ("awq", 128, None), ("q4_1", 32, None),
         ("q4_0", 32, 2), ("q4_1", 128, 3)]


@pytest.fixture(scope="module")
def backend():
    return tiny_backend()


def silu_mul_bf16(backend, gu):
    T, I = gu.shape[0], gu.shape[1] // 2
    out = cp.empty((T, I), dtype=cp.uint16)
    n = I // 16  # threads a row (I % 8 == 0: two chunks of 8 a thread, elementwise.cu)
    backend.k.fns["silu_mul_bf16"]((-(-n // 256), T), (256,), (gu, out, np.int32(T), np.int32(I)))
    return out


@pytest.mark.parametrize("form", sorted(FORMS))
@pytest.mark.parametrize("kind,G,splits", CASES)
def test_gemm_silu_pair_equals_gemm_then_silu_mul_bf16_bit_exactly(backend, form, kind, G, splits):
    wgmma, t256, tokens = FORMS[form]
    if wgmma and not backend.k.wgmma_arch:
        pytest.skip(f"the wgmma forms need compute capability 9.0 (this GPU: {backend.k.cc})")
    rng = np.random.default_rng(G + (splits or 0) + 5 * len(form))
    I, K = 576, 2048  # 9 blocks of 64 gate + 64 up columns; up to 32 k64 stages (4 slices of 8)
    mw = backend.to_marlin(backend.upload_quantized(make_weight(kind, 2 * I, K, G, rng)))
    for T in tokens:
        xb = bf16_words(backend, rng.standard_normal((T, K)).astype(np.float32))
        gu = cp.full((T, 2 * I), np.nan, dtype=cp.float32)
        assert backend.gemm_q4(xb, mw, None, gu, splits=splits, wgmma=wgmma, t256=t256)
        ref = silu_mul_bf16(backend, gu)
        buf = cp.full(T * I + 64, 0xFFFF, dtype=cp.uint16)
        act = buf[: T * I].reshape(T, I)
        backend.gemm_q4_silu(xb, mw, act, splits=splits, wgmma=wgmma, t256=t256)
        np.testing.assert_array_equal(cp.asnumpy(act), cp.asnumpy(ref), err_msg=f"{form} T {T}")
        assert bool((buf[T * I:] == 0xFFFF).all()), "wrote past the output"
        assert int((act == 0xFFFF).sum()) == 0


@pytest.mark.parametrize("G", [32, 128])
def test_awq_batched_steps_with_the_gemm_epilogues_give_the_unfused_bits(tmp_path, G, monkeypatch):
    """A tiny Qwen2 AWQ model (64-dim heads, q/k/v bias): a lone 40-token prefill (mma.sync, replayed from its 64-token
    graph bucket), a lone 100-token prefill (the 128-token wgmma form, its 128-token bucket) and a step of
    two 100-token prefills (200 tokens: the 256-token form), with the paired GEMM forms and without
    (q4_gemm_epilogue False): the same logits, bit for bit, each layer's
    gate_up through a paired kernel."""
    from llmrs.backends.cuda import CUDABackend
    from llmrs.engine.batch import build_step_batch

    kept, runners = tiny_awq_runners(tmp_path, G, "q4_gemm_epilogue")
    if not runners[True].backend.k.wgmma:
        pytest.skip("the wgmma forms need compute capability 9.0 (sm_90a)")
    assert CUDABackend.q4_gemm_epilogue  # the default
    r = runners[True]
    layer = r.model.w.layers[0]
    for T in (40, 64, 100, 200):
        assert r.backend.gemm_silu_takes(layer.gate_up, T)
        assert not runners[False].backend.gemm_silu_takes(layer.gate_up, T)
    real, calls = CUDABackend.gemm_q4_silu, []
    monkeypatch.setattr(CUDABackend, "gemm_q4_silu",
                        lambda be, x, *a, **k: calls.append((be, x.shape[0])) or real(be, x, *a, **k))
    rng = np.random.default_rng(G)
    vocab = kept.config.vocab_size
    prompts = [rng.integers(3, vocab, n).tolist() for n in (100, 100, 100, 40)]
    bs = r.backend.block_size
    tables = [list(range(8 * i, 8 * i + 8)) for i in range(len(prompts))]
    logits = {}
    for fused, run in runners.items():
        one = run.execute(build_step_batch([(prompts[0], 0, tables[0], True)], bs))
        two = run.execute(build_step_batch([(prompts[i], 0, tables[i], True) for i in (1, 2)], bs))
        short = run.execute(build_step_batch([(prompts[3], 0, tables[3], True)], bs))
        logits[fused] = (np.asarray(one).copy(), np.asarray(two).copy(), np.asarray(short).copy())
    for a, b in zip(logits[True], logits[False]):
        assert np.isfinite(a).all()
        np.testing.assert_array_equal(a, b)
    # every layer of each step: the lone prefill eager or padded to its graph bucket (128 tokens; captured, checked
    # against the eager step), the two prefills eager at 200
    n_layers = len(r.model.w.layers)
    assert all(be is r.backend for be, _ in calls)
    for lo, hi in ((40, 64), (100, 128), (200, 200)):
        n = sum(1 for _, t in calls if lo <= t <= hi)
        assert n >= n_layers and n % n_layers == 0, (lo, hi, calls)
