"""attn_o_cluster (attention.cu: one token's decode attention fused with the o projection, x += W_o att, the heads'
partial products summed by each split's last block) against float64 numpy and against attn_cluster + the o matvec,
then end to end: a tiny Qwen2 with 128-dim heads greedy through the backend with the fused kernel on and off. Run on
the GPU machine (`pytest -m gpu`); skips below compute capability 9.0."""

from __future__ import annotations

import numpy as np
import pytest

from tests.cuda_helpers import rel_err, report, require_gpu
from tests.gpu.test_attention_cluster_gpu import BS, bf16_words, cluster_inputs, reference

cp = require_gpu()
pytestmark = pytest.mark.gpu

if int(cp.cuda.Device().compute_capability) < 90:
    pytest.skip("thread-block clusters need sm_90+", allow_module_level=True)

from llmrs.backends.cuda import kernels as ck  # noqa: E402

D = 128


def run_fused(k, args, wo, x0, Hq, Hkv, N, CL, T, W=16):
    """x after attn_o_cluster{CL} (W warps a block: 16, or the 8-warp form _w8) on a copy of x0, and whether its
    split counters are back to 0."""
    x = cp.asarray(x0.copy())
    part = cp.full((T, Hq, N), np.nan, dtype=cp.float32)
    counts = cp.zeros(T * CL, dtype=cp.int32)
    k.fns[f"attn_o_cluster{CL}{'_w8' if W == 8 else ''}"]((T, Hq, CL), (32 * W,),
                                 args + (cp.asarray(wo), part, counts, x, np.int32(Hq), np.int32(Hkv), np.int32(N),
                                         np.int32(BS), np.float32(1 / np.sqrt(D))))
    cp.cuda.Device().synchronize()
    return cp.asnumpy(x), int(cp.asnumpy(counts).any())


@pytest.mark.parametrize("Hq,Hkv,N,CL,lens,W", [(16, 2, 2048, 8, [300], 16), (16, 2, 2048, 8, [1], 16),
                                                (16, 2, 2048, 8, [1023], 16), (16, 2, 2048, 4, [300], 16),
                                                (16, 2, 2048, 4, [1023, 2], 16), (12, 2, 1536, 8, [77], 16),
                                                (8, 2, 1024, 4, [5, 130], 16), (28, 4, 896, 4, [512, 64, 3], 16),
                                                (16, 2, 2048, 8, [300], 8), (16, 2, 2048, 8, [1, 1023], 8),
                                                (12, 2, 1536, 8, [77, 33], 8)])
def test_attn_o_cluster_matches_float64_and_the_two_kernels(Hq, Hkv, N, CL, lens, W):
    """The 3B's shape (16 / 2 heads, 2048 rows, 8 splits of 256 or 4 of 512) from 1 key (splits with none) to 1023
    (a warp loops over batches of keys), the 1.5B's, several tokens in one launch, o splits of fewer rows than a
    block holds (224); against attention + x += W_o att in float64 and against attn_cluster8_d4_g4_w16 +
    matvec_bf16_t1 (f32, other summation orders); the split counters are back to 0 after the launch, and a second
    launch gives the same bits."""
    T = len(lens)
    rng = np.random.default_rng(Hq + N + CL + T)
    args = cluster_inputs(rng, lens, Hq, Hkv, D)
    wo = bf16_words(rng.standard_normal((N, Hq * D)) / np.sqrt(Hq * D))
    x0 = rng.standard_normal((T, N)).astype(np.float32)
    k = ck.get_kernels()
    got, dirty = run_fused(k, args, wo, x0, Hq, Hkv, N, CL, T, W)
    assert np.isfinite(got).all() and not dirty
    again, _ = run_fused(k, args, wo, x0, Hq, Hkv, N, CL, T, W)
    assert np.array_equal(got, again), "deterministic: the heads summed in order by whichever block comes last"
    q, _, kc, vc, tables, _, _, positions = args
    att = reference(cp.asnumpy(q), cp.asnumpy(kc), cp.asnumpy(vc), cp.asnumpy(tables), cp.asnumpy(positions), Hq,
                    Hkv, D, float(np.float32(1 / np.sqrt(D))))
    wf = (wo.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    ref = x0.astype(np.float64) + att @ wf.T
    # the two kernels the fused one replaces: attn_cluster (16 warps, 4 heads a block) into att, then x += W_o att
    att_d = cp.full((T, Hq * D), np.nan, dtype=cp.float32)
    k.fns["attn_cluster8_d4_g4_w16"]((T, Hkv * -(-(Hq // Hkv) // 4), 8), (512,),
                                     args + (att_d, np.int32(Hq), np.int32(Hkv), np.int32(D), np.int32(BS),
                                             np.float32(1 / np.sqrt(D))))
    x2 = cp.asarray(x0.copy())
    for t in range(T):
        k.fns["matvec_bf16_t1"]((-(-N // 4), 1), (128,), (cp.asarray(wo), att_d[t], np.uint64(0), x2[t], np.int32(N),
                                                          np.int32(Hq * D), np.int32(1), np.int32(1), np.int32(1)))
    two = cp.asnumpy(x2)
    err, err2 = rel_err(got, ref), rel_err(got, two)
    report(f"attn_o_cluster{CL} W{W} Hq{Hq} Hkv{Hkv} N{N} lens{lens}",
           {"rel_err_f64": err, "rel_err_two_kernels": err2, "two_kernels_rel_err_f64": rel_err(two, ref)})
    assert err < 1e-5, err
    assert err2 < 1e-5, err2


@pytest.mark.parametrize("graphs", [False, True])
def test_backend_fuses_attention_and_o_at_one_token_and_tokens_agree(tmp_path, graphs):
    """A tiny Qwen2 with 8 query heads and 2 kv heads of 128 dims (hidden 1024): one-token decode steps take
    attn_o_cluster8 (8 x 8 blocks, 128 rows a split) instead of attn_cluster + the o matvec (eager: launches
    counted), and its greedy tokens equal the two kernels' (CudaOptions.attn_o_fused=0's path), eager and with decode
    graphs."""
    from llmrs.model.loader import load
    from llmrs.engine.runner import ModelRunner, stream_generate
    from llmrs.engine.sampling import SamplingParams
    from tests.conftest import write_tiny_model

    loaded = load(str(write_tiny_model(tmp_path / "qwen2", "qwen2", hidden_size=1024, num_attention_heads=8,
                                       num_key_value_heads=2)))
    params = SamplingParams(max_tokens=48, temperature=0.0, ignore_eos=True)
    ids = loaded.tokenizer.encode("The quick brown fox jumps over the lazy dog. " * 4)
    runs, launched = {}, {}
    for fused in (True, False):
        r = ModelRunner(loaded, num_blocks=32, device="cuda")
        be = r.backend
        be.attn_o_fused = fused
        names = ("attn_o_cluster8", "attn_cluster8_d4_g4_w16")
        fns = be.k.fns
        saved = {n: fns[n] for n in names}
        seen: list[str] = []

        def counting(name, fn):
            def call(*a, **kw):
                seen.append(name)
                return fn(*a, **kw)
            return call

        try:
            for n in names:
                fns[n] = counting(n, saved[n])
            if not graphs:
                be.graphs = None
            runs[fused] = [o.token_ids[0] for o in stream_generate(r, ids, params)]
        finally:
            fns.update(saved)
        launched[fused] = set(seen)
    if not graphs:  # (a graph may have been captured before the wrappers went in)
        assert "attn_o_cluster8" in launched[True] and "attn_cluster8_d4_g4_w16" not in launched[True], launched
        assert "attn_o_cluster8" not in launched[False] and "attn_cluster8_d4_g4_w16" in launched[False], launched
    assert runs[True] == runs[False], runs
