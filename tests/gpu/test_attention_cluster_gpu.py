"""attn_cluster (attention.cu: the splits of a decode attention as one thread-block cluster, merged through
distributed shared memory, sm_90+) against attention in float64 numpy and against attn_partial + attn_merge, then
end to end: a tiny Qwen2 with 128-dim heads (the kernel's d4) greedy through the backend with the cluster path on
and off. Run on the GPU machine (`pytest -m gpu`); skips below compute capability 9.0."""

from __future__ import annotations

import numpy as np
import pytest

from tests.cuda_helpers import rel_err, report, require_gpu

cp = require_gpu()
pytestmark = pytest.mark.gpu

if int(cp.cuda.Device().compute_capability) < 90:
    pytest.skip("thread-block clusters need sm_90+", allow_module_level=True)

from llmrs.backends.cuda import kernels as ck  # noqa: E402

BS = 16


def bf16_words(a):
    return (a.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)  # truncation: exact bf16 values


def reference(q, k_cache, v_cache, tables, positions, Hq, Hkv, D, scale):
    """out [T, Hq*D] in float64 from the bf16 caches (the kernel's inputs)."""
    kf = (k_cache.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    vf = (v_cache.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    T = q.shape[0]
    out = np.zeros((T, Hq * D))
    for t in range(T):
        L = positions[t] + 1
        rows = [(tables[t, j // BS], j % BS) for j in range(L)]
        for h in range(Hq):
            g = h // (Hq // Hkv)
            K = np.stack([kf[b, g, o] for b, o in rows])
            V = np.stack([vf[b, g, o] for b, o in rows])
            s = K @ q[t, h * D:(h + 1) * D].astype(np.float64) * scale
            p = np.exp(s - s.max())
            out[t, h * D:(h + 1) * D] = p @ V / p.sum()
    return out


@pytest.mark.parametrize("D,CL", [(128, 4), (128, 8), (128, 16), (64, 8), (64, 16)])
@pytest.mark.parametrize("Hq,Hkv,lens", [(28, 4, [512]), (28, 4, [1, 5, 17]), (16, 2, [300, 64, 1023]),
                                         (32, 2, [200, 129]), (14, 2, [300])])
def test_attn_cluster_matches_float64_and_partial_merge(D, CL, Hq, Hkv, lens):
    """128-dim (d4) and 64-dim (d2) heads; lengths below the cluster size (empty splits), not a multiple of it,
    past 64 keys a split (a warp loops over batches of keys); 16 query heads a kv head (two head groups); several
    tokens of different lengths in one launch; the 0.5B's 14 / 2 heads."""
    T, dpl = len(lens), D // 32
    rng = np.random.default_rng(CL + Hq + len(lens))
    nb = -(-max(lens) // BS)
    blocks = T * nb
    k_cache = bf16_words(rng.standard_normal((blocks, Hkv, BS, D)))
    v_cache = bf16_words(rng.standard_normal((blocks, Hkv, BS, D)))
    tables = rng.permutation(blocks).reshape(T, nb).astype(np.int32)
    positions = np.array([n - 1 for n in lens], dtype=np.int32)
    q = rng.standard_normal((T, (Hq + 2 * Hkv) * D)).astype(np.float32)
    scale = np.float32(1 / np.sqrt(D))
    ref = reference(q, k_cache, v_cache, tables, positions, Hq, Hkv, D, float(scale))
    k = ck.get_kernels()
    groups = -(-(Hq // Hkv) // 8)
    args = (cp.asarray(q), np.int32(q.shape[1]), cp.asarray(k_cache), cp.asarray(v_cache), cp.asarray(tables),
            np.int32(nb), cp.arange(T, dtype=cp.int32), cp.asarray(positions))
    out = cp.full((T, Hq * D), np.nan, dtype=cp.float32)
    k.fns[f"attn_cluster{CL}_d{dpl}"]((T, Hkv * groups, CL), (256,),
                                  args + (out, np.int32(Hq), np.int32(Hkv), np.int32(D), np.int32(BS), scale))
    got = cp.asnumpy(out)
    assert np.isfinite(got).all(), "every output written"
    err = rel_err(got, ref)
    # attn_partial + attn_merge at 33 splits (the backend's choice for a 7B token at context 512)
    S = 33
    part = cp.full((T, Hq * D), np.nan, dtype=cp.float32)
    acc = cp.full((T * Hq * S * D,), np.nan, dtype=cp.float32)
    ml = cp.full((T * Hq * S * 2,), np.nan, dtype=cp.float32)
    k.fns[f"attn_partial_d{dpl}"]((T, Hkv * groups, S), (128,),
                             args + (part, acc, ml, np.int32(Hq), np.int32(Hkv), np.int32(D), np.int32(BS),
                                     np.int32(-(-max(lens) // S)), scale))
    k.fns["attn_merge"]((T, Hq), (128,), (acc, ml, part, np.int32(Hq), np.int32(D), np.int32(S)))
    pm = cp.asnumpy(part)
    report(f"attn_cluster{CL}_d{dpl} Hq{Hq} Hkv{Hkv} lens{lens}",
           {"rel_err_f64": err, "rel_err_partial": rel_err(got, pm), "partial_rel_err_f64": rel_err(pm, ref)})
    assert err < 1e-5, err  # f32 with other summation orders than float64 (attn_partial: ~1e-7 here)
    assert rel_err(got, pm) < 1e-5


def cluster_inputs(rng, lens, Hq, Hkv, D):
    """attn_cluster's arguments up to `out`: q (fused qkv rows), random bf16 K / V caches paged in shuffled blocks,
    the block tables, token_seq and positions of one token per sequence of the given lengths."""
    T, nb = len(lens), -(-max(lens) // BS)
    blocks = T * nb
    return (cp.asarray(rng.standard_normal((T, (Hq + 2 * Hkv) * D)).astype(np.float32)),
            np.int32((Hq + 2 * Hkv) * D), cp.asarray(bf16_words(rng.standard_normal((blocks, Hkv, BS, D)))),
            cp.asarray(bf16_words(rng.standard_normal((blocks, Hkv, BS, D)))),
            cp.asarray(rng.permutation(blocks).reshape(T, nb).astype(np.int32)), np.int32(nb),
            cp.arange(T, dtype=cp.int32), cp.asarray(np.array([n - 1 for n in lens], dtype=np.int32)))


@pytest.mark.parametrize("D,CL", [(128, 8), (128, 16), (64, 8), (64, 16)])
@pytest.mark.parametrize("Hq,Hkv,lens", [(28, 4, [512]), (28, 4, [1, 5, 17]), (16, 2, [300, 64, 1023]),
                                         (14, 2, [300]), (12, 2, [77])])
def test_attn_cluster_g4_gives_the_bits_of_the_8_head_form(D, CL, Hq, Hkv, lens):
    """attn_cluster{CL}_d{D}_g4 (a block per 4 query heads: 7 a kv head -> 4 + 3, 8 -> 4 + 4, 6 -> 4 + 2) against
    the 8-head form: the same keys a warp, the same sums and softmax per head, so the same bits."""
    T, dpl = len(lens), D // 32
    rng = np.random.default_rng(CL + Hq + len(lens) + D)
    args = cluster_inputs(rng, lens, Hq, Hkv, D)
    k = ck.get_kernels()
    outs = []
    for suffix, hg in (("", 8), ("_g4", 4)):
        out = cp.full((T, Hq * D), np.nan, dtype=cp.float32)
        k.fns[f"attn_cluster{CL}_d{dpl}{suffix}"]((T, Hkv * -(-(Hq // Hkv) // hg), CL), (256,),
                                                 args + (out, np.int32(Hq), np.int32(Hkv), np.int32(D),
                                                         np.int32(BS), np.float32(1 / np.sqrt(D))))
        outs.append(cp.asnumpy(out))
    assert np.isfinite(outs[1]).all(), "every output written"
    assert np.array_equal(outs[0], outs[1])


@pytest.mark.parametrize("D,CL", [(128, 8), (128, 16), (64, 8), (64, 16)])
@pytest.mark.parametrize("Hq,Hkv,lens", [(28, 4, [512]), (28, 4, [1, 5, 17]), (16, 2, [300, 64, 1023]),
                                         (14, 2, [300]), (12, 2, [77])])
def test_attn_cluster_16_warps_a_block_matches_float64_and_the_8_warp_form(D, CL, Hq, Hkv, lens):
    """attn_cluster{CL}_d{D}_g4_w16 (CudaOptions.attn_cluster_warps=16: 16 warps a block, 4 keys a warp where the 8-warp
    form takes 8; 512 threads): float64 numpy's attention and the 8-warp form's to f32 rounding (the keys meet in
    other warps, so other roundings); lengths with empty splits and past one batch a warp (1023: a warp loops)."""
    T, dpl = len(lens), D // 32
    rng = np.random.default_rng(3 * CL + Hq + len(lens) + D)
    args = cluster_inputs(rng, lens, Hq, Hkv, D)
    k = ck.get_kernels()
    outs = {}
    for suffix, threads in (("_g4", 256), ("_g4_w16", 512)):
        out = cp.full((T, Hq * D), np.nan, dtype=cp.float32)
        k.fns[f"attn_cluster{CL}_d{dpl}{suffix}"]((T, Hkv * -(-(Hq // Hkv) // 4), CL), (threads,),
                                                 args + (out, np.int32(Hq), np.int32(Hkv), np.int32(D),
                                                         np.int32(BS), np.float32(1 / np.sqrt(D))))
        outs[suffix] = cp.asnumpy(out)
    got = outs["_g4_w16"]
    assert np.isfinite(got).all(), "every output written"
    q, _, kc, vc, tables, _, _, positions = args
    ref = reference(cp.asnumpy(q), cp.asnumpy(kc), cp.asnumpy(vc), cp.asnumpy(tables), cp.asnumpy(positions), Hq,
                    Hkv, D, float(np.float32(1 / np.sqrt(D))))
    err = rel_err(got, ref)
    report(f"attn_cluster{CL}_d{dpl}_g4_w16 Hq{Hq} Hkv{Hkv} lens{lens}",
           {"rel_err_f64": err, "rel_err_8_warps": rel_err(got, outs["_g4"])})
    assert err < 1e-5, err
    assert rel_err(got, outs["_g4"]) < 1e-5


@pytest.mark.parametrize("hidden,kernel", [(1024, "auto"), (512, "partial"), (512, "auto")])
def test_backend_takes_the_cluster_where_attn_partial_ran_and_tokens_agree(tmp_path, hidden, kernel):
    """A tiny Qwen2 with 8 query heads and 2 kv heads of 128 dims (auto: attn_partial's place at one token) or 64
    dims (auto: decode_attn_tc's place, which gives way to the cluster where it covers the context;
    CudaOptions.attn_kernel=partial): one-token decode steps take attn_cluster
    (8 by default at these lengths, 16 when forced), and its greedy tokens equal those of CudaOptions.attn_cluster=0's
    path: attn_partial + attn_merge, or decode_attn_tc + attn_merge for 64-dim heads under auto."""
    from llmrs.model.loader import load
    from llmrs.engine.runner import ModelRunner, stream_generate
    from llmrs.engine.sampling import SamplingParams
    from tests.conftest import write_tiny_model

    loaded = load(str(write_tiny_model(tmp_path / "qwen2", "qwen2", hidden_size=hidden, num_attention_heads=8,
                                       num_key_value_heads=2)))
    d = loaded.config.head_dim // 32
    params = SamplingParams(max_tokens=48, temperature=0.0, ignore_eos=True)
    ids = loaded.tokenizer.encode("The quick brown fox jumps over the lazy dog. " * 4)
    names = (f"attn_cluster16_d{d}", f"attn_cluster8_d{d}", f"attn_partial_d{d}", f"attn_cluster16_d{d}_g4",
             f"attn_cluster8_d{d}_g4", f"attn_cluster16_d{d}_g4_w16", f"attn_cluster8_d{d}_g4_w16",
             f"decode_attn_tc_d{32 * d}", f"decode_attn_tc_bf16_d{32 * d}")
    runs = {}
    for cl in (16, 8, 0):
        r = ModelRunner(loaded, num_blocks=32, device="cuda")
        be = r.backend
        be.attn_kernel = kernel
        be.attn_o_fused = False  # (one token's attention + o as one kernel: tests/gpu/test_attention_o_gpu.py)
        assert be.attn_cluster is None and be._cluster_size(1, 100) == 8  # auto (CudaOptions.attn_cluster unset)
        be.attn_cluster = cl
        assert be._cluster_size(1, 100) == cl
        launched: list[str] = []
        fns = be.k.fns  # the process's compiled kernels: wrapped to count launches, restored after
        saved = {n: fns[n] for n in names}

        def counting(name, fn):
            def call(*a, **kw):
                launched.append(name)
                return fn(*a, **kw)
            return call

        try:
            for n in names:
                fns[n] = counting(n, saved[n])
            be.graphs = None  # eager: every launch goes through the wrapped functions
            runs[cl] = [o.token_ids[0] for o in stream_generate(r, ids, params)]
        finally:
            fns.update(saved)
        g4 = "_g4" if cl and be._cluster_form(1, 100)[1] == 4 else ""  # auto / CudaOptions.attn_heads_per_block
        g4 += "_w16" if g4 and be.attn_cluster_warps == 16 else ""  # CudaOptions.attn_cluster_warps
        want = {f"attn_cluster{cl}_d{d}{g4}"} if cl else {f"attn_partial_d{d}"}
        if not cl and kernel == "auto" and d == 2:  # the cluster off: one token of small heads on decode_attn_tc
            want = {f"decode_attn_tc_d{32 * d}", f"decode_attn_tc_bf16_d{32 * d}"}
        assert want & set(launched), (cl, sorted(set(launched)))
        if cl:
            assert f"attn_partial_d{d}" not in launched
    assert runs[16] == runs[0] and runs[8] == runs[0], runs
