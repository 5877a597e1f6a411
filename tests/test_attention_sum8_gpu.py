"""The decode attention's reduce-scatter of the 8 (or 4) heads' dot products (attention.cu warp_sum8_own /
warp_sum4_own) against the per-head warp_sum it replaced (compiled with -DLLMRS_NO_WARP_SUM8): the same bits in every
output, at each head size and with splits. Run on the GPU machine (`pytest -m gpu`)."""

from __future__ import annotations

import numpy as np
import pytest

from llmrs.backends.cuda import kernels as ck

pytestmark = pytest.mark.gpu

def paged_inputs(cp, rng, T, bs, ctx, mid, Hq, Hkv, D):
    """q (fused qkv rows), random bf16 K / V caches paged in shuffled blocks of bs, the block tables, token_seq and
    positions ctx - 1, 40 and mid (causal limits below the context too)."""
    nb = -(-ctx // bs)
    blocks = T * nb
    cache = lambda: cp.asarray((rng.standard_normal((blocks, Hkv, bs, D), dtype=np.float32).view(np.uint32)
                                >> 16).astype(np.uint16))
    k_cache, v_cache = cache(), cache()
    tables = cp.asarray(rng.permutation(blocks).reshape(T, nb).astype(np.int32))
    positions = cp.asarray(np.array([ctx - 1, 40, mid], dtype=np.int32))
    token_seq = cp.arange(T, dtype=cp.int32)
    q = cp.asarray(rng.standard_normal((T, (Hq + 2 * Hkv) * D), dtype=np.float32))
    return q, k_cache, v_cache, tables, nb, token_seq, positions


@pytest.mark.parametrize("D,Hq,Hkv,S", [(8, 8, 2, 1), (64, 14, 2, 3), (128, 28, 4, 5), (128, 16, 2, 33),
                                        (256, 8, 1, 2)])
def test_warp_sum8_gives_the_bits_of_a_warp_sum_per_head(D, Hq, Hkv, S):
    from tests.cuda_helpers import require_gpu

    cp = require_gpu()
    src = ck.kernel_source("attention.cu")
    dpl = 1 if D <= 32 else D // 32
    name = f"attn_partial_d{dpl}"
    fns = [cp.RawModule(code=src, options=ck.options() + extra).get_function(name)
           for extra in ((), ("-DLLMRS_NO_WARP_SUM8",))]
    rng = np.random.default_rng(D + S)
    T, bs, ctx = 3, 16, 150
    q, k_cache, v_cache, tables, nb, token_seq, positions = paged_inputs(cp, rng, T, bs, ctx, 97, Hq, Hkv, D)
    groups = -(-(Hq // Hkv) // 8)
    chunk = -(-ctx // S)
    outs = []
    for fn in fns:
        out = cp.full((T, Hq * D), np.nan, dtype=cp.float32)
        acc = cp.full((T * Hq * S * D,), np.nan, dtype=cp.float32)
        ml = cp.full((T * Hq * S * 2,), np.nan, dtype=cp.float32)
        fn((T, Hkv * groups, S), (128,),
           (q, np.int32(q.shape[1]), k_cache, v_cache, tables, np.int32(nb), token_seq, positions, out, acc, ml,
            np.int32(Hq), np.int32(Hkv), np.int32(D), np.int32(bs), np.int32(chunk), np.float32(1 / np.sqrt(D))))
        cp.cuda.Device().synchronize()
        outs.append([cp.asnumpy(a) for a in ((out,) if S == 1 else (acc, ml))])
    for a, b in zip(*outs):
        assert not np.isnan(a).any(), "every partial written (an empty split's m is -inf)"
        assert np.array_equal(a, b)
    if S == 1:
        assert np.isfinite(outs[0][0]).all(), "every output written"


@pytest.mark.parametrize("hg", [8, 4])
@pytest.mark.parametrize("D,Hq,Hkv", [(128, 28, 4), (128, 16, 2), (64, 14, 2)])
def test_attn_cluster_reduce_scatter_gives_the_bits_of_a_warp_sum_per_head(D, Hq, Hkv, hg):
    """attn_cluster8 with 8 or 4 query heads a block (warp_sum8_own / warp_sum4_own, each lane's own head's softmax
    state) against a warp_sum per head (-DLLMRS_NO_WARP_SUM8): the same bits (sm_90: clusters)."""
    from tests.cuda_helpers import require_gpu

    cp = require_gpu()
    if int(cp.cuda.Device().compute_capability) < 90:
        pytest.skip("attn_cluster needs sm_90 (thread-block clusters)")
    src = ck.kernel_source("attention.cu")
    name = f"attn_cluster8_d{D // 32}" + ("_g4" if hg == 4 else "")
    fns = [cp.RawModule(code=src, options=ck.options() + extra).get_function(name)
           for extra in ((), ("-DLLMRS_NO_WARP_SUM8",))]
    rng = np.random.default_rng(D + Hq)
    T, bs, ctx = 3, 16, 300
    q, k_cache, v_cache, tables, nb, token_seq, positions = paged_inputs(cp, rng, T, bs, ctx, 197, Hq, Hkv, D)
    groups = -(-(Hq // Hkv) // hg)
    outs = []
    for fn in fns:
        out = cp.full((T, Hq * D), np.nan, dtype=cp.float32)
        fn((T, Hkv * groups, 8), (256,),
           (q, np.int32(q.shape[1]), k_cache, v_cache, tables, np.int32(nb), token_seq, positions, out,
            np.int32(Hq), np.int32(Hkv), np.int32(D), np.int32(bs), np.float32(1 / np.sqrt(D))))
        cp.cuda.Device().synchronize()
        outs.append(cp.asnumpy(out))
    assert np.isfinite(outs[0]).all(), "every output written"
    assert np.array_equal(outs[0], outs[1])
