"""Each CUDA kernel against numpy (the CPU reference backend where it has the op), on fresh random inputs of
several shapes (odd sizes, partial KV blocks, shuffled block tables), outputs poisoned with NaN first."""

from __future__ import annotations

import numpy as np
import pytest

from tests.cuda_helpers import rel_err, report, require_gpu

cp = require_gpu()
pytestmark = pytest.mark.gpu

from llmrs.backends.cpu import CPUBackend  # noqa: E402
from llmrs.backends.cuda import NULL, CUDABackend, needs_cpu_sampler, rope_threads  # noqa: E402
from llmrs.engine.batch import build_step_batch  # noqa: E402
from llmrs.engine.config import ModelConfig  # noqa: E402
from llmrs.engine.sampling import SamplingParams, SamplingState, filter_probs, make_generator  # noqa: E402
from llmrs.model.weights import bf16_bits, bf16_to_f32, round_bf16  # noqa: E402


def cfg(heads=8, kv=2, head_dim=64, hidden=None, inter=160, vocab=300, llama3=False, layers=1) -> ModelConfig:
    rs = ({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
           "original_max_position_embeddings": 64} if llama3 else None)
    return ModelConfig(model_type="llama", vocab_size=vocab, hidden_size=hidden or heads * head_dim,
                       intermediate_size=inter, num_hidden_layers=layers, num_attention_heads=heads,
                       num_key_value_heads=kv, head_dim=head_dim, rope_theta=10000.0, rope_scaling=rs,
                       max_position_embeddings=40000)


def poison(shape, dtype=np.float32):
    return cp.full(shape, np.nan, dtype=dtype)


@pytest.fixture(scope="module")
def rng():
    return np.random.default_rng(1234)


@pytest.mark.parametrize("n", [1001, 4096, 917504 + 4])
def test_bf16_rounding_matches_kernel(rng, n):
    """cast_f32_bf16 = bf16_bits (round to nearest even, NaN kept NaN): one element a thread (n = 1001), 4 a thread
    (n % 4 == 0), and a 256 x 3584 activation (+ 4)."""
    be = CUDABackend(cfg(), num_blocks=1)
    x = (rng.standard_normal(n) * 10 ** rng.uniform(-6, 6, n)).astype(np.float32)
    x[:5] = [0.0, -0.0, np.inf, -np.inf, np.nan]
    out = cp.full(x.shape, 0xFFFF, dtype=cp.uint16)
    be._cast_bf16(cp.asarray(x), out)
    np.testing.assert_array_equal(cp.asnumpy(out), bf16_bits(x))
    # round to nearest even: 1 + 2^-8 is a tie between 1 and 1 + 2^-7 -> 1
    assert round_bf16(np.array([1 + 2**-8], dtype=np.float32))[0] == 1.0


@pytest.mark.parametrize("H,T", [(64, 1), (77, 5), (896, 3)])
def test_embedding_gathers_bf16_rows(rng, H, T):
    be = CUDABackend(cfg(), num_blocks=1)
    table = rng.standard_normal((301, H)).astype(np.float32)
    ids = rng.integers(0, 301, T).astype(np.int32)
    out = poison((T, H))
    be.k.embedding_gather((T,), (256,), (be.upload(table), cp.asarray(ids), out, np.int32(H), np.int32(0),
                                         np.int32(301)))
    np.testing.assert_array_equal(cp.asnumpy(out), round_bf16(table)[ids])


def test_embedding_of_a_vocabulary_slice_zeroes_other_ranks_tokens(rng):
    """A tensor-parallel rank holds rows [start, start + rows) of the table: other tokens embed to zeros."""
    be = CUDABackend(cfg(), num_blocks=1)
    H, start, rows = 96, 100, 57
    table = rng.standard_normal((rows, H)).astype(np.float32)
    ids = np.array([0, 99, 100, 130, 156, 157, 300], dtype=np.int32)
    out = poison((len(ids), H))
    be.k.embedding_gather((len(ids),), (256,), (be.upload(table), cp.asarray(ids), out, np.int32(H),
                                                np.int32(start), np.int32(rows)))
    want = np.zeros((len(ids), H), np.float32)
    mine = (ids >= start) & (ids < start + rows)
    want[mine] = round_bf16(table)[ids[mine] - start]
    np.testing.assert_array_equal(cp.asnumpy(out), want)


@pytest.mark.parametrize("H,T", [(64, 1), (77, 3), (896, 7), (3584, 2), (5000, 1)])
def test_rms_norm_and_fused_residual(rng, H, T):
    be = CUDABackend(cfg(), num_blocks=1)
    ref = CPUBackend(cfg(), num_blocks=1)
    x = rng.standard_normal((T, H)).astype(np.float32) * 3
    y = rng.standard_normal((T, H)).astype(np.float32)
    w = round_bf16(rng.standard_normal(H).astype(np.float32))
    out = poison((T, H))
    be._rms_norm(cp.asarray(x), be.upload(w), 1e-6, out)
    assert rel_err(cp.asnumpy(out), ref.rms_norm(x, w, 1e-6)) < 1e-5
    rows = np.array([T - 1, 0], dtype=np.int32)
    out2 = poison((2, H))
    be._rms_norm(cp.asarray(x), be.upload(w), 1e-6, out2, rows=cp.asarray(rows), n_rows=2)
    assert rel_err(cp.asnumpy(out2), ref.rms_norm(x[rows], w, 1e-6)) < 1e-5
    xd = cp.asarray(x)
    normed = be.add_rms_norm(xd, cp.asarray(y), be.upload(w), 1e-6)
    assert rel_err(cp.asnumpy(xd), x + y) < 1e-7
    assert rel_err(cp.asnumpy(normed), ref.rms_norm(x + y, w, 1e-6)) < 1e-5


@pytest.mark.parametrize("N,K,T", [(1, 8, 1), (37, 64, 3), (896, 896, 1), (1001, 4864, 8), (129, 77, 5),
                                   (4608, 3584, 2), (300, 160, 6)])
@pytest.mark.parametrize("bias,accumulate", [(False, False), (True, True)])
def test_matvec_matches_numpy(rng, N, K, T, bias, accumulate):
    be = CUDABackend(cfg(), num_blocks=1, matvec_max_tokens=8)  # the matvec at every T here (default: T = 1)
    W = rng.standard_normal((N, K)).astype(np.float32) * 0.05
    x = rng.standard_normal((T, K)).astype(np.float32)
    b = round_bf16(rng.standard_normal(N).astype(np.float32)) if bias else None
    y0 = rng.standard_normal((T, N)).astype(np.float32)
    ref = x.astype(np.float64) @ round_bf16(W).T.astype(np.float64) + (b if bias else 0) + (y0 if accumulate else 0)
    out = cp.asarray(y0) if accumulate else poison((T, N))
    be._linear(cp.asarray(x), be.upload(W), be.upload(b) if bias else None, out, accumulate=accumulate)
    assert rel_err(cp.asnumpy(out), ref) < 1e-5


@pytest.mark.parametrize("N,K", [(1, 8), (37, 64), (896, 896), (2048, 2048), (3584, 3584), (1100, 4096), (300, 1000)])
@pytest.mark.parametrize("bias,accumulate", [(False, False), (True, True)])
def test_matvec_rows_equals_the_one_warp_matvec(rng, N, K, bias, accumulate):
    """matvec_rows_bf16 (one token, rows held in registers before pdl_wait; CudaOptions.matvec_rows=1, `preload`): the same
    bits as matvec_bf16_t1 at one warp a row (the same chunks in the same order)."""
    be = CUDABackend(cfg(), num_blocks=1)
    W = be.upload(rng.standard_normal((N, K)).astype(np.float32) * 0.05)
    x = cp.asarray(rng.standard_normal((1, K)).astype(np.float32))
    b = be.upload(round_bf16(rng.standard_normal(N).astype(np.float32))) if bias else None
    y0 = rng.standard_normal((1, N)).astype(np.float32)
    outs = []
    for rows in (False, True):
        be.matvec_rows = rows
        out = cp.asarray(y0) if accumulate else cp.asarray(poison((1, N)))
        be._linear(x, W, b, out, accumulate=accumulate, preload=True)
        outs.append(cp.asnumpy(out))
    assert be._matvec_splits(N, K) == 1
    np.testing.assert_array_equal(outs[1], outs[0])
    ref = cp.asnumpy(x).astype(np.float64) @ bf16_to_f32(cp.asnumpy(W)).T.astype(np.float64)
    ref = ref + (cp.asnumpy(b) if bias else 0) + (y0 if accumulate else 0)
    assert rel_err(outs[1], ref) < 1e-5


@pytest.mark.parametrize("N,K,T", [(64, 64, 9), (1001, 896, 33), (4864, 896, 130), (151, 72, 17)])
@pytest.mark.parametrize("bias,accumulate", [(False, False), (True, True)])
def test_cublas_gemm_path_matches_numpy(rng, N, K, T, bias, accumulate):
    """More tokens than matvec_max_tokens: bf16 activations x bf16 weights -> f32 through cuBLAS."""
    be = CUDABackend(cfg(), num_blocks=1)
    W = rng.standard_normal((N, K)).astype(np.float32) * 0.05
    x = rng.standard_normal((T, K)).astype(np.float32)
    b = round_bf16(rng.standard_normal(N).astype(np.float32)) if bias else None
    y0 = rng.standard_normal((T, N)).astype(np.float32)
    exact = round_bf16(x).astype(np.float64) @ round_bf16(W).T.astype(np.float64)
    ref = exact + (b if bias else 0) + (y0 if accumulate else 0)
    out = cp.asarray(y0) if accumulate else poison((T, N))
    be._linear(cp.asarray(x), be.upload(W), be.upload(b) if bias else None, out, accumulate=accumulate)
    assert rel_err(cp.asnumpy(out), ref) < 1e-5
    # against f32 activations: within bf16 tolerance
    full = x.astype(np.float64) @ round_bf16(W).T.astype(np.float64)
    assert rel_err(cp.asnumpy(out) - (b if bias else 0) - (y0 if accumulate else 0), full) < 1e-2


@pytest.mark.parametrize("T,I", [(1, 160), (7, 77), (3, 4864)])
def test_silu_mul_and_add(rng, T, I):
    be, ref = CUDABackend(cfg(), num_blocks=1), CPUBackend(cfg(), num_blocks=1)
    gu = (rng.standard_normal((T, 2 * I)) * 4).astype(np.float32)
    assert rel_err(cp.asnumpy(be.silu_mul(cp.asarray(gu))), ref.silu_mul(gu)) < 1e-6
    y = rng.standard_normal((T, 2 * I)).astype(np.float32)
    assert rel_err(cp.asnumpy(be.add(cp.asarray(gu), cp.asarray(y))), gu + y) < 1e-7


@pytest.mark.parametrize("head_dim,heads,kv,llama3", [(8, 8, 2, True), (64, 14, 2, False), (128, 28, 4, True)])
def test_rope_and_kv_write_match_reference(rng, head_dim, heads, kv, llama3):
    c = cfg(heads=heads, kv=kv, head_dim=head_dim, llama3=llama3)
    nb, bs = 9, 16
    be, ref = CUDABackend(c, num_blocks=nb), CPUBackend(c, num_blocks=nb)
    T = 11
    positions = np.sort(rng.choice(np.arange(0, 32000), T, replace=False)).astype(np.int32)
    positions[:3] = [0, 1, 63]
    slots = rng.choice(nb * bs, T, replace=False).astype(np.int64)
    qkv = rng.standard_normal((T, (heads + 2 * kv) * head_dim)).astype(np.float32)
    q, k, v = qkv[:, : heads * head_dim], qkv[:, heads * head_dim: (heads + kv) * head_dim], qkv[:, (heads + kv) * head_dim:]
    rq, rk = ref.rope(q, k, positions)
    ref.write_kv(0, rk, v, slots)
    # protocol path: rope alone
    gq, gk = be.rope(cp.asarray(q), cp.asarray(k), positions)
    assert rel_err(cp.asnumpy(gq), rq) < 1e-5 and rel_err(cp.asnumpy(gk), rk) < 1e-5
    # fused path: q rotated in place, k/v written as bf16 to their slots, other slots untouched
    for layer_cache in (be.k_cache[0], be.v_cache[0]):
        layer_cache.fill(0x7FC0)  # bf16 NaN everywhere
    d = cp.asarray(qkv)
    threads = rope_threads(heads, kv, head_dim)
    be.k.rope_write_kv((T,), (threads,), (d, cp.asarray(positions), be.inv_freq, cp.asarray(slots.astype(np.int32)),
                                          be.k_cache[0], be.v_cache[0], np.int32(heads), np.int32(kv),
                                          np.int32(head_dim), np.int32(bs), NULL))
    assert rel_err(cp.asnumpy(d[:, : heads * head_dim]), rq.reshape(T, -1)) < 1e-5
    blocks, offs = slots // bs, slots % bs
    for cache, want in ((be.k_cache[0], ref.k_cache[0]), (be.v_cache[0], ref.v_cache[0])):
        got = (cp.asnumpy(cache).astype(np.uint32) << 16).view(np.float32)
        assert rel_err(got[blocks, :, offs, :], want[blocks, :, offs, :]) < 4e-3  # bf16 storage
        untouched = np.ones(nb * bs, dtype=bool)
        untouched[slots] = False
        assert np.isnan(got.transpose(0, 2, 1, 3).reshape(nb * bs, -1)[untouched]).all()


def fill_caches(rng, be, ref, layer=0):
    """Random bf16 K/V in every slot, the same values in both backends."""
    for gpu, cpu in ((be.k_cache, ref.k_cache), (be.v_cache, ref.v_cache)):
        vals = round_bf16(rng.standard_normal(cpu[layer].shape).astype(np.float32))
        cpu[layer][...] = vals
        gpu[layer][...] = cp.asarray(bf16_bits(vals))


@pytest.mark.parametrize("head_dim,heads,kv", [(8, 8, 2), (64, 14, 2), (128, 28, 4), (64, 18, 2), (32, 4, 4)])
@pytest.mark.parametrize("splits", [None, 1, 3, 8])
@pytest.mark.parametrize("kernel", ["auto", "partial", "gqa"])
def test_paged_attention_prefill_chunks_and_decodes(rng, head_dim, heads, kv, splits, kernel):
    """Sequences mixing a fresh prefill, a chunk over a cached prefix, decodes at partial blocks, ctx 1: each
    decode attention kernel (auto takes decode_attn_tc where it runs: Q and P through bf16 for its MMAs, so the
    prefill kernel's bound; attn_partial and attn_partial_gqa are f32 throughout)."""

    c = cfg(heads=heads, kv=kv, head_dim=head_dim)
    nb, bs = 64, 16
    be, ref = CUDABackend(c, num_blocks=nb), CPUBackend(c, num_blocks=nb)
    be.attn_splits, be.attn_kernel = splits, kernel
    bound = 5e-3 if kernel == "auto" and be.decode_tc_supported() else 1e-5
    be.prefill_min_tokens = None  # attn_partial itself (the tensor-core prefill kernel: test_prefill_attention_gpu.py)
    fill_caches(rng, be, ref)
    perm = rng.permutation(nb).tolist()
    # (new tokens, cached before): prefill 13; chunk of 5 after 20 cached; decode at 37; decode at 0; 300-token decode
    specs = [(13, 0), (5, 20), (1, 36), (1, 0), (1, 299), (40, 100)]
    seqs, used = [], 0
    for n, cached in specs:
        nblk = -(-(n + cached) // bs)
        seqs.append((list(rng.integers(0, 10, n)), cached, perm[used: used + nblk], True))
        used += nblk
    assert used <= nb
    batch = build_step_batch(seqs, bs)
    batch.validate(bs)
    q = rng.standard_normal((batch.num_tokens, heads * head_dim)).astype(np.float32)
    want = ref.attention(0, q, batch)
    out = poison((batch.num_tokens, heads * head_dim))
    be._attention(0, cp.asarray(q), heads * head_dim, be.device_batch(batch), out)
    err = rel_err(cp.asnumpy(out), want)
    report(f"attention {kernel} hd{head_dim} h{heads}/{kv} splits={splits}", err)
    assert err < bound, (be._attn_choice(batch.num_tokens), err)


# ---------------------------------------------------------------------- sampling
def states_for(params_list, seed0=0):
    return [SamplingState(p, make_generator(seed0 + i), [], [], []) for i, p in enumerate(params_list)]


def test_greedy_sampling_is_argmax_with_lowest_index_ties(rng):
    be = CUDABackend(cfg(), num_blocks=1)
    for V in (7, 1000, 151936):
        logits = rng.standard_normal((5, V)).astype(np.float32)
        logits[1, [3, V - 1]] = 50.0  # a tie: the lowest index wins, as np.argmax
        toks = be.sample(cp.asarray(logits), states_for([SamplingParams(temperature=0.0)] * 5))
        assert [t.token_id for t in toks] == np.argmax(logits, axis=-1).tolist()


@pytest.mark.parametrize("params", [
    SamplingParams(temperature=0.8, top_k=5), SamplingParams(temperature=1.0, top_p=0.5),
    SamplingParams(temperature=1.3, min_p=0.2), SamplingParams(temperature=0.7, top_k=40, top_p=0.9, min_p=0.05),
    SamplingParams(temperature=1.0, top_k=1),
])
def test_gpu_sampling_never_leaves_the_filtered_set(rng, params):
    be = CUDABackend(cfg(), num_blocks=1)
    V, S = 2000, 64
    logits = (rng.standard_normal((S, V)) * 3).astype(np.float32)
    toks = be.sample(cp.asarray(logits), states_for([params] * S))
    for i, t in enumerate(toks):
        z = logits[i].astype(np.float64) / params.temperature
        probs = np.exp(z - z.max())
        allowed = filter_probs(probs / probs.sum(), params) > 0
        assert allowed[t.token_id], (i, t.token_id)


def test_gpu_sampling_follows_the_distribution_and_seeds_reproduce(rng):
    be = CUDABackend(cfg(), num_blocks=1)
    V, S = 20, 4000
    base = (rng.standard_normal(V) * 1.5).astype(np.float32)
    logits = np.tile(base, (S, 1))
    params = SamplingParams(temperature=0.9, top_p=0.8)
    toks = [t.token_id for t in be.sample(cp.asarray(logits), states_for([params] * S))]
    z = base.astype(np.float64) / 0.9
    p = np.exp(z - z.max())
    want = filter_probs(p / p.sum(), params)
    freq = np.bincount(toks, minlength=V) / S
    assert np.abs(freq - want).max() < 0.04
    again = [t.token_id for t in be.sample(cp.asarray(logits), states_for([params] * S))]
    assert again == toks  # same seeds, same tokens
    other = [t.token_id for t in be.sample(cp.asarray(logits), states_for([params] * S, seed0=10_000))]
    assert other != toks


def test_greedy_sampling_over_several_blocks_a_row(rng):
    """A small batch spreads each row's argmax over several blocks (kernels.sample_row_blocks): the maximum
    in any block's slice, ties across slices to the lowest index, every row count up to one block a row, and a
    mixed batch (greedy rows beside sampled ones) whose greedy rows still get the argmax."""
    be = CUDABackend(cfg(), num_blocks=1)
    V = 151936
    for S in (1, 2, 3, 7, 40, 70):
        logits = rng.standard_normal((S, V)).astype(np.float32)
        for r in range(S):  # the maximum in a random slice, a tie with a later index in another
            a, b = sorted(rng.choice(V, 2, replace=False))
            logits[r, [a, b]] = 40.0 + r % 3
        params = [SamplingParams(temperature=0.0) if r % 3 else SamplingParams(temperature=0.8, top_p=0.9)
                  for r in range(S)]
        for _ in range(2):  # the hand-off's counters are back at 0 for the next launch
            toks = [t.token_id for t in be.sample(cp.asarray(logits), states_for(params))]
            want = np.argmax(logits, axis=-1)
            assert all(toks[r] == want[r] for r in range(S) if r % 3), S
            assert all(logits[r, toks[r]] == 40.0 + r % 3 for r in range(S) if not r % 3), S  # the two maxima only
        assert int(cp.asnumpy(be._counters("sample_sem", be.num_sms)).sum()) == 0


@pytest.mark.parametrize("params", [
    SamplingParams(temperature=0.8, top_k=50, top_p=0.9), SamplingParams(temperature=0.7, top_p=0.9),
    SamplingParams(temperature=1.0, top_k=20), SamplingParams(temperature=1.2, min_p=0.1, top_p=0.95),
    SamplingParams(temperature=0.5), SamplingParams(temperature=1.0, top_k=3000, top_p=0.95),
])
def test_gpu_sampling_draws_the_cpu_samplers_tokens(rng, params):
    """The same seeds give the CPU sampler's tokens (llmrs.engine.sampling.sample: float64 probabilities, the GPU's
    fixed-point masses) on a real vocabulary's width, and the same tokens again on a second launch; top_k=50 runs on
    the kernel's candidate list, top_k=3000 (more than SAMPLE_LIST) and temperature alone over the whole row."""
    from llmrs.engine.sampling import sample as cpu_sample

    be = CUDABackend(cfg(), num_blocks=1)
    S, V = 24, 151936
    logits = (rng.standard_normal((S, V)) * 2.5).astype(np.float32)
    want = [r.token_id for r in cpu_sample(logits, states_for([params] * S))]
    got = [t.token_id for t in be.sample(cp.asarray(logits), states_for([params] * S))]
    assert got == want
    assert [t.token_id for t in be.sample(cp.asarray(logits), states_for([params] * S))] == got


def test_gpu_sampling_cuts_ties_by_index(rng):
    """Ties at top_k's k-th value and at top_p's threshold keep the lowest indices (the CPU sampler's stable
    order): 300 equal maxima with top_k=5 draw only the first 5 of them; a flat row with top_p=0.1 only its
    first tenth; top_k=40 then top_p=0.5 over 100 equal maxima the first 20."""
    be = CUDABackend(cfg(), num_blocks=1)
    S, V = 200, 5000
    logits = rng.standard_normal((S, V)).astype(np.float32)
    ties = np.sort(rng.choice(V, 300, replace=False))
    logits[:, ties] = 30.0

    def draw(x, **kw):
        return [t.token_id for t in be.sample(cp.asarray(x), states_for([SamplingParams(temperature=1.0, **kw)] * S))]

    toks = draw(logits, top_k=5)
    assert set(toks) <= set(ties[:5].tolist()) and len(set(toks)) == 5
    toks = draw(np.zeros((S, V), dtype=np.float32), top_p=0.1)
    assert max(toks) < V // 10 and len(set(toks)) > 100
    logits[:, ties] = -30.0
    logits[:, ties[:100]] = 30.0
    toks = draw(logits, top_k=40, top_p=0.5)
    assert set(toks) <= set(ties[:20].tolist()) and len(set(toks)) > 10


def test_gpu_sampling_falls_back_to_cpu_for_penalties_and_logprobs(rng):
    be = CUDABackend(cfg(), num_blocks=1)
    logits = rng.standard_normal((2, 50)).astype(np.float32)
    st = states_for([SamplingParams(temperature=0.0, logprobs=2), SamplingParams(temperature=0.0)])
    res = be.sample(cp.asarray(logits), st)
    assert res[0].logprob is not None and len(res[0].top_logprobs) == 2
    assert [r.token_id for r in res] == np.argmax(logits, axis=-1).tolist()


def test_gpu_sampling_hands_logit_bias_rows_to_the_host(rng):
    """A row with a logit_bias is sampled by the host sampler (which adds the bias); its neighbours stay on the GPU."""
    be = CUDABackend(cfg(), num_blocks=1)
    logits = rng.standard_normal((3, 5000)).astype(np.float32)
    forced, banned = int(np.argmin(logits[0])), int(np.argmax(logits[1]))
    params = [SamplingParams(temperature=0.0, logit_bias={forced: 100.0}),
              SamplingParams(temperature=0.0, logit_bias={banned: -100.0}), SamplingParams(temperature=0.0)]
    got = [r.token_id for r in be.sample(cp.asarray(logits), states_for(params))]
    assert got == [forced, int(np.argsort(-logits[1])[1]), int(np.argmax(logits[2]))]


def test_a_mixed_batch_samples_only_the_rows_that_need_it_on_the_cpu(rng, monkeypatch):
    """A step where some requests need the CPU sampler (logprobs, penalties, a pending min_tokens) and the others do
    not: only those rows' logits go to the host (the CPU sampler sees just them), the rest are sampled on the GPU,
    and every token (and the logprobs) is what the CPU sampler gives the whole batch with the same seeds; the
    device copy of the tokens (the next step's feed) holds them all."""
    import llmrs.engine.sampling as sampling

    be = CUDABackend(cfg(), num_blocks=1)
    S, V = 12, 151936
    logits = (rng.standard_normal((S, V)) * 2.5).astype(np.float32)
    hist = [3, 7, 7, 11]
    params = [SamplingParams(temperature=0.8, top_k=50, top_p=0.9), SamplingParams(temperature=0.0, logprobs=3),
              SamplingParams(temperature=0.0), SamplingParams(temperature=0.7, top_p=0.9, repetition_penalty=1.3),
              SamplingParams(temperature=1.0, top_k=20), SamplingParams(temperature=0.9, presence_penalty=0.5,
                                                                         logprobs=0),
              SamplingParams(temperature=0.5, min_tokens=4), SamplingParams(temperature=1.2, min_p=0.1)] + [
        SamplingParams(temperature=0.0)] * 4

    def states():
        st = states_for(params, seed0=40)
        for s_ in st:
            s_.prompt_ids.extend(hist)
            s_.output_ids.extend(hist[:2])
            s_.stop_ids.append(int(np.argmax(logits[6])))  # min_tokens pending: row 6's argmax is masked
        return st

    want = sampling.sample(logits, states())
    on_host = [i for i, st in enumerate(states()) if needs_cpu_sampler(st)]
    assert on_host == [1, 3, 5, 6]
    seen = []
    real = sampling.sample
    import llmrs.backends.cuda.sampler as gpu_sampler

    monkeypatch.setattr(gpu_sampler, "cpu_sample", lambda x, st: seen.append(x.shape) or real(x, st))
    got = be.sample(cp.asarray(logits), states())
    assert seen == [(len(on_host), V)]  # only those rows reached the host
    assert [r.token_id for r in got] == [r.token_id for r in want]
    for i in on_host:
        assert got[i].logprob == want[i].logprob and got[i].top_logprobs == want[i].top_logprobs
    assert got[1].logprob is not None and len(got[1].top_logprobs) == 3 and got[5].logprob is not None
    assert cp.asnumpy(be._samples[:S]).tolist() == [r.token_id for r in want]
    monkeypatch.setattr(sampling, "sample", real)
    every = [SamplingParams(temperature=0.0, logprobs=1)] * S  # every row on the host: as before
    assert [r.token_id for r in be.sample(cp.asarray(logits), states_for(every))] == np.argmax(logits, -1).tolist()


@pytest.mark.parametrize("splits", [1, 2, 4])
@pytest.mark.parametrize("N,K,T", [(37, 4096, 1), (3, 2056, 5), (1001, 4864, 8)])
def test_matvec_splits_agree(rng, splits, N, K, T):
    """Warps per row (split K, partial sums through shared memory): each split count matches numpy, any N."""
    be = CUDABackend(cfg(), num_blocks=1, matvec_max_tokens=8)
    be.matvec_splits = splits
    W = rng.standard_normal((N, K)).astype(np.float32) * 0.05
    x = rng.standard_normal((T, K)).astype(np.float32)
    b = round_bf16(rng.standard_normal(N).astype(np.float32))
    y0 = rng.standard_normal((T, N)).astype(np.float32)
    ref = x.astype(np.float64) @ round_bf16(W).T.astype(np.float64) + b + y0
    out = cp.asarray(y0)
    be._linear(cp.asarray(x), be.upload(W), be.upload(b), out, accumulate=True)
    assert rel_err(cp.asnumpy(out), ref) < 1e-5


# ---------------------------------------------------------------------- bf16 producers of GEMM inputs
def wide(rng, shape, scale=1.0):
    """Random f32 spanning many binades, so every rounding case of bf16 shows up."""
    return (rng.standard_normal(shape) * scale * 10 ** rng.uniform(-3, 3, shape)).astype(np.float32)


@pytest.mark.parametrize("T", [1, 3, 17])
@pytest.mark.parametrize("H", [64, 77, 896, 3584, 5000])
def test_bf16_norms_and_silu_mul_equal_the_cast_of_their_f32_outputs(rng, H, T):
    """rms_norm_bf16 / add_rms_norm_bf16 / silu_mul_bf16 write exactly bf16_bits(f32 kernel output): the fused
    GEMM input is bit-identical to f32 + cast_f32_bf16."""
    be = CUDABackend(cfg(), num_blocks=1)
    be.matvec_max_tokens = 0  # every T takes the GEMM-input (bf16) path of _silu_mul_for
    x, y = wide(rng, (T, H)), wide(rng, (T, H))
    w = be.upload(round_bf16(rng.standard_normal(H).astype(np.float32)))
    xd = cp.asarray(x)
    f32, b16 = poison((T, H)), cp.full((T, H), 0xFFFF, dtype=cp.uint16)
    be._rms_norm(xd, w, 1e-6, f32)
    be._rms_norm_bf16(xd, w, 1e-6, b16)
    np.testing.assert_array_equal(cp.asnumpy(b16), bf16_bits(cp.asnumpy(f32)))
    rows = cp.asarray(np.array([T - 1, 0, T // 2], dtype=np.int32))
    f32r, b16r = poison((3, H)), cp.full((3, H), 0xFFFF, dtype=cp.uint16)
    be._rms_norm(xd, w, 1e-6, f32r, rows=rows, n_rows=3)
    be._rms_norm_bf16(xd, w, 1e-6, b16r, rows=rows, n_rows=3)
    np.testing.assert_array_equal(cp.asnumpy(b16r), bf16_bits(cp.asnumpy(f32r)))
    x1, x2, yd = cp.asarray(x), cp.asarray(x), cp.asarray(y)
    be._add_rms_norm(x1, yd, w, 1e-6, f32)
    be._rms_norm_bf16(x2, w, 1e-6, b16, y=yd)
    np.testing.assert_array_equal(cp.asnumpy(x2), cp.asnumpy(x1))  # the residual, f32, the same in both
    np.testing.assert_array_equal(cp.asnumpy(b16), bf16_bits(cp.asnumpy(f32)))
    gu = cp.asarray(wide(rng, (T, 2 * H), scale=4.0))
    act = be._silu_mul_for(None, gu)
    assert act.dtype == cp.uint16 and act.shape == (T, H)
    np.testing.assert_array_equal(cp.asnumpy(act), bf16_bits(cp.asnumpy(be.silu_mul(gu))))


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
@pytest.mark.parametrize("lens", [[40], [5, 3, 4, 2, 6, 3, 5, 4, 2, 3, 6, 4]])  # 12 sampled rows: lm_head on cuBLAS
def test_fused_bf16_gemm_inputs_give_identical_logits_and_one_cast_per_layer(tmp_path, arch, lens):
    """A prefill step with the bf16 producers on and off: the same logits bit for bit; on, the only cast left
    per layer is the attention output's (before o), off, four (qkv, o, gate_up, down) and lm_head's."""
    from llmrs.model.loader import load
    from llmrs.engine.runner import ModelRunner
    from tests.conftest import write_tiny_model

    r = ModelRunner(load(str(write_tiny_model(tmp_path / arch, arch))), num_blocks=64, device="cuda")
    be = r.backend
    prng = np.random.default_rng(len(lens))
    batch = build_step_batch([(prng.integers(3, 400, n).tolist(), 0, [4 * i, 4 * i + 1, 4 * i + 2], True)
                              for i, n in enumerate(lens)], 16)
    assert batch.num_tokens > be.matvec_max_tokens
    casts = []
    cast = be._cast_bf16
    be._cast_bf16 = lambda x, out: (casts.append(x.shape), cast(x, out))[1]
    be.gate_up_bf16 = False  # (its own test below: a bf16 gate/up output is a rounding, not the same bits)
    logits = {}
    for fuse in (False, True, False):
        be.fuse_bf16 = fuse
        casts.clear()
        logits[fuse] = cp.asnumpy(be._forward_device(r.model.w, be.device_batch(batch)))
        L, S = r.config.num_hidden_layers, len(lens)
        assert len(casts) == (1 if fuse else 4) * L + (S > be.matvec_max_tokens and not fuse)
    assert np.isfinite(logits[True]).all()
    np.testing.assert_array_equal(logits[True], logits[False])


@pytest.mark.parametrize("T", [2, 17, 256])
@pytest.mark.parametrize("I", [160, 4736, 77, 36])
def test_gate_up_gemm_with_bf16_output_and_silu_from_bf16(rng, T, I):
    """_linear(out_bf16=True): cuBLAS writes gate/up as bf16 words, within bf16 rounding of the f64 product;
    silu_mul_bf16_bf16 on them is exactly silu_mul_bf16 on their f32 values (the same expression)."""
    be = CUDABackend(cfg(), num_blocks=1)
    K = 96
    W = be.upload(rng.standard_normal((2 * I, K)).astype(np.float32) * 0.1)
    x = rng.standard_normal((T, K)).astype(np.float32)
    assert be._gemm_takes_bf16(W, T)
    gu16 = cp.full((T, 2 * I), 0xFFFF, dtype=cp.uint16)
    be._linear(cp.asarray(x), W, None, gu16, name="gate_up", out_bf16=True)
    gu = bf16_to_f32(cp.asnumpy(gu16))
    ref = round_bf16(x).astype(np.float64) @ bf16_to_f32(cp.asnumpy(W)).T.astype(np.float64)  # x: bf16 operand
    assert np.abs(gu - ref).max() <= 2 ** -8 * np.abs(ref).max()
    act = be._silu_mul_for(None, gu16)  # bf16 gu: silu_mul_bf16_bf16, whatever `lin` (None here)
    want = cp.empty((T, I), dtype=cp.uint16)
    n = I // 4 if I % 4 == 0 else I
    be.k.silu_mul_bf16((min(65535, -(-n // 256)), T), (256,), (cp.asarray(gu), want, np.int32(T), np.int32(I)))
    np.testing.assert_array_equal(cp.asnumpy(act), cp.asnumpy(want))
    with pytest.raises(AssertionError):  # only where the GEMM runs, and without bias or accumulate
        be._linear(cp.asarray(x), W, None, gu16, accumulate=True, name="gate_up", out_bf16=True)


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_gate_up_bf16_keeps_logits_within_bf16_rounding(tmp_path, arch):
    """A GEMM-sized step with gate/up as bf16 (CudaOptions.gate_up_bf16, the default) against f32 gate/up: the same
    greedy tokens and logits within bf16 rounding; one silu kernel a layer either way."""
    from llmrs.model.loader import load
    from llmrs.engine.runner import ModelRunner
    from tests.conftest import write_tiny_model

    r = ModelRunner(load(str(write_tiny_model(tmp_path / arch, arch))), num_blocks=64, device="cuda")
    be = r.backend
    prng = np.random.default_rng(7)
    batch = build_step_batch([(prng.integers(3, 400, n).tolist(), 0, [4 * i, 4 * i + 1, 4 * i + 2], True)
                              for i, n in enumerate([40, 9, 17])], 16)
    assert batch.num_tokens > be.matvec_max_tokens
    logits = {}
    for on in (False, True):
        be.gate_up_bf16 = on
        silus = []
        orig = be.k.fns["silu_mul_bf16_bf16" if on else "silu_mul_bf16"]
        be.k.fns["silu_mul_bf16_bf16" if on else "silu_mul_bf16"] = lambda *a, **k: (silus.append(1), orig(*a, **k))
        try:
            logits[on] = cp.asnumpy(be._forward_device(r.model.w, be.device_batch(batch)))
        finally:
            be.k.fns["silu_mul_bf16_bf16" if on else "silu_mul_bf16"] = orig
        assert len(silus) == r.config.num_hidden_layers
    assert np.isfinite(logits[True]).all()
    assert rel_err(logits[True], logits[False]) < 1e-2
    diff = np.abs(logits[True] - logits[False]).max()
    for a, b in zip(logits[True], logits[False]):  # the same greedy token, but at a genuine near tie
        top2 = np.sort(b)[-2:]
        assert a.argmax() == b.argmax() or top2[1] - top2[0] < 4 * diff


@pytest.mark.parametrize("lens", [[40], [5, 3, 4, 2]])  # a prefill; a mixed batch of 14 tokens
def test_qkv_bias_in_rope_gives_identical_logits_and_caches(tmp_path, lens):
    """GEMM-sized steps of a Qwen2 model (q/k/v bias): the bias added by rope_write_kv instead of add_bias gives
    the same logits and K/V cache bit for bit, one launch fewer per layer."""
    from llmrs.model.loader import load
    from llmrs.engine.runner import ModelRunner
    from tests.conftest import write_tiny_model

    r = ModelRunner(load(str(write_tiny_model(tmp_path / "qwen2", "qwen2"))), num_blocks=64, device="cuda")
    be = r.backend
    prng = np.random.default_rng(sum(lens))
    batch = build_step_batch([(prng.integers(3, 400, n).tolist(), 0, [4 * i, 4 * i + 1, 4 * i + 2], True)
                              for i, n in enumerate(lens)], 16)
    assert batch.num_tokens > be.matvec_max_tokens
    out = {}
    add_bias = be.k.add_bias
    for fold in (False, True):
        be.fold_qkv_bias = fold
        for a in be.k_cache + be.v_cache:
            a[...] = 0
        launches = []
        be.k.fns["add_bias"] = lambda *a, **k: (launches.append(1), add_bias(*a, **k))
        try:
            logits = cp.asnumpy(be._forward_device(r.model.w, be.device_batch(batch)))
        finally:
            be.k.fns["add_bias"] = add_bias
        out[fold] = (logits, [cp.asnumpy(a) for a in be.k_cache + be.v_cache])
        assert len(launches) == (0 if fold else r.config.num_hidden_layers)
    be.fold_qkv_bias = CUDABackend.fold_qkv_bias
    assert np.isfinite(out[True][0]).all()
    np.testing.assert_array_equal(out[True][0], out[False][0])
    for a, b in zip(out[True][1], out[False][1]):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("T", [1, 2, 3, 8])
@pytest.mark.parametrize("heads,kv,head_dim,hidden", [(8, 2, 64, 512), (14, 2, 64, 77), (7, 1, 128, 384),
                                                      (4, 4, 32, 200)])
def test_paired_matvec_epilogues_equal_matvec_plus_their_kernels(rng, T, heads, kv, head_dim, hidden):
    """matvec_rope_bf16 (qkv + bias, RoPE, K/V into the cache) and matvec_silu_bf16 (gate_up, SiLU x up) write the
    same bits as the matvec followed by rope_write_kv / silu_mul, for odd K (77: the scalar path) and every NT."""
    c = cfg(heads, kv, head_dim, hidden=hidden, inter=3 * 37)
    nb = 8 * T  # 8 blocks (128 positions) of its own per sequence: no two tokens write one slot
    be = CUDABackend(c, num_blocks=nb, matvec_max_tokens=8)
    n_qkv = (heads + 2 * kv) * head_dim
    w_qkv = be.upload(rng.standard_normal((n_qkv, hidden)).astype(np.float32) / np.sqrt(hidden))
    bias = be.upload(rng.standard_normal(n_qkv).astype(np.float32))
    w_gu = be.upload(rng.standard_normal((2 * c.intermediate_size, hidden)).astype(np.float32) / np.sqrt(hidden))
    x = cp.asarray(rng.standard_normal((T, hidden)).astype(np.float32))
    perm = rng.permutation(nb).tolist()
    batch = build_step_batch([([int(v)], int(rng.integers(0, 128)), perm[8 * i:8 * i + 8], True)
                              for i, v in enumerate(rng.integers(3, 99, T))], be.block_size)
    db = be.device_batch(batch)
    assert be._pair_epilogue(w_qkv, T) and be._pair_epilogue(w_gu, T)

    def caches():
        return [cp.asnumpy(a).copy() for a in (be.k_cache[0], be.v_cache[0])]

    for a in (be.k_cache[0], be.v_cache[0]):
        a[...] = 0
    ref = poison((T, n_qkv))
    be._linear(x, w_qkv, bias, ref, name="qkv")
    threads = rope_threads(heads, kv, head_dim)
    be.k.rope_write_kv((T,), (threads,), (ref, db.positions, be.inv_freq, db.slots, be.k_cache[0], be.v_cache[0],
                                          np.int32(heads), np.int32(kv), np.int32(head_dim), np.int32(be.block_size),
                                          NULL))
    want_cache = caches()
    for a in (be.k_cache[0], be.v_cache[0]):
        a[...] = 0
    got = poison((T, n_qkv))
    be._matvec_pair("rope", x, w_qkv, got, bias=bias, db=db, layer=0)
    q = heads * head_dim
    np.testing.assert_array_equal(cp.asnumpy(got)[:, :q], cp.asnumpy(ref)[:, :q])
    for g, w_ in zip(caches(), want_cache):
        np.testing.assert_array_equal(g, w_)
    assert np.any(want_cache[0] != 0) and np.any(want_cache[1] != 0)

    gu = poison((T, 2 * c.intermediate_size))
    be._linear(x, w_gu, None, gu, name="gate_up")
    want = cp.asnumpy(be.silu_mul(gu))
    act = poison((T, c.intermediate_size))
    be._matvec_pair("silu", x, w_gu, act)
    np.testing.assert_array_equal(cp.asnumpy(act), want)


@pytest.mark.parametrize("T", [1, 2, 5, 8])
@pytest.mark.parametrize("heads,kv,head_dim,hidden", [(8, 2, 64, 512), (14, 2, 64, 77), (7, 1, 128, 384)])
def test_norm_folded_into_paired_matvecs_matches_rms_norm_then_matvec(rng, T, heads, kv, head_dim, hidden):
    """matvec_rope_norm_bf16 / matvec_silu_norm_bf16 take the residual stream and the norm weight: their outputs
    (q rotated, K/V in the cache, SiLU x up) equal rms_norm followed by the plain paired kernels to f32 rounding
    (the cache to one bf16 step), and numpy's rms_norm -> projection -> epilogue; odd K (77) takes the scalar path."""
    c = cfg(heads, kv, head_dim, hidden=hidden, inter=3 * 37)
    nb = 8 * T
    be = CUDABackend(c, num_blocks=nb, matvec_max_tokens=8)
    n_qkv = (heads + 2 * kv) * head_dim
    wq = rng.standard_normal((n_qkv, hidden)).astype(np.float32) / np.sqrt(hidden)
    w_qkv, bias = be.upload(wq), be.upload(rng.standard_normal(n_qkv).astype(np.float32))
    wg = rng.standard_normal((2 * c.intermediate_size, hidden)).astype(np.float32) / np.sqrt(hidden)
    w_gu = be.upload(wg)
    g = round_bf16(rng.standard_normal(hidden).astype(np.float32))
    gd = be.upload(g)
    xh = (rng.standard_normal((T, hidden)) * 5).astype(np.float32)
    x = cp.asarray(xh)
    eps = 1e-6
    perm = rng.permutation(nb).tolist()
    batch = build_step_batch([([int(v)], int(rng.integers(0, 128)), perm[8 * i:8 * i + 8], True)
                              for i, v in enumerate(rng.integers(3, 99, T))], be.block_size)
    db = be.device_batch(batch)

    def run(fold):
        for a in (be.k_cache[0], be.v_cache[0]):
            a[...] = 0
        qkv, act = poison((T, n_qkv)), poison((T, c.intermediate_size))
        if fold:
            be._matvec_pair("rope", x, w_qkv, qkv, bias=bias, db=db, norm=(gd, eps))
            be._matvec_pair("silu", x, w_gu, act, norm=(gd, eps))
        else:
            h = poison((T, hidden))
            be._rms_norm(x, gd, eps, h)
            be._matvec_pair("rope", h, w_qkv, qkv, bias=bias, db=db)
            be._matvec_pair("silu", h, w_gu, act)
        kc, vc = (cp.asnumpy(a).copy() for a in (be.k_cache[0], be.v_cache[0]))
        return cp.asnumpy(qkv)[:, :heads * head_dim], kc, vc, cp.asnumpy(act)

    got, want = run(True), run(False)
    assert np.isfinite(got[0]).all() and np.isfinite(got[3]).all()
    np.testing.assert_allclose(got[0], want[0], rtol=2e-5, atol=2e-5)
    np.testing.assert_allclose(got[3], want[3], rtol=2e-5, atol=2e-5)
    for a, b in zip(got[1:3], want[1:3]):  # bf16 words: equal or one rounding step apart
        np.testing.assert_allclose(bf16_to_f32(a), bf16_to_f32(b), rtol=2 ** -7, atol=1e-6)
        assert np.any(a != 0)
    # numpy: h = rms_norm(x) with the bf16-rounded weights the GPU holds
    h = g * (xh / np.sqrt(np.mean(xh.astype(np.float64) ** 2, axis=1, keepdims=True) + eps))
    gu = h @ round_bf16(wg).T
    I = c.intermediate_size
    want_act = gu[:, :I] / (1 + np.exp(-gu[:, :I])) * gu[:, I:]
    assert rel_err(got[3], want_act) < 1e-4


def decode_step_each(tmp_path, arch, n_seqs, seed, settings, counted):
    """A matvec-path decode step of a tiny model (n_seqs sequences, one new token each at a random position) once
    under each of `settings` (callables configuring the backend), each from zeroed K/V caches, counting the launches
    of the kernels named in `counted`: the runner and [(logits, caches, launches)] in the settings' order."""
    from llmrs.model.loader import load
    from llmrs.engine.runner import ModelRunner
    from tests.conftest import write_tiny_model

    r = ModelRunner(load(str(write_tiny_model(tmp_path / arch, arch))), num_blocks=64, device="cuda")
    be = r.backend
    be.matvec_max_tokens = 8  # the matvec path at every n_seqs (by default cuBLAS takes 2 tokens and more)
    prng = np.random.default_rng(seed)
    batch = build_step_batch([([int(prng.integers(3, 400))], int(prng.integers(1, 40)), [4 * i, 4 * i + 1,
                                                                                        4 * i + 2], True)
                              for i in range(n_seqs)], 16)
    results = []
    for configure in settings:
        configure(be)
        for a in be.k_cache + be.v_cache:
            a[...] = 0
        launches = []
        saved = {name: be.k.fns[name] for name in counted}
        for name, fn in saved.items():
            be.k.fns[name] = (lambda f, nm: lambda *a, **k: (launches.append(nm), f(*a, **k)))(fn, name)
        try:
            logits = cp.asnumpy(be._forward_device(r.model.w, be.device_batch(batch)))
        finally:
            be.k.fns.update(saved)
        results.append((logits, [cp.asnumpy(a) for a in be.k_cache + be.v_cache], len(launches)))
    return r, results


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
@pytest.mark.parametrize("n_seqs", [1, 4])
def test_folded_norms_keep_decode_logits_and_drop_two_launches_per_layer(tmp_path, arch, n_seqs):
    """A matvec-path decode step with the RMSNorms folded into the qkv and gate_up matvecs (`fuse_norm` "1";
    "auto" folds up to NORM_FOLD_MAX_K) and with rms_norm launched apart: logits equal to f32 tolerance, the same
    greedy tokens, the K/V cache within one bf16 step, and two rms_norm launches fewer per layer (the final norm
    stays)."""
    r, (apart, folded) = decode_step_each(
        tmp_path, arch, n_seqs, 7 + n_seqs,
        [lambda be: setattr(be, "fuse_norm", "0"), lambda be: setattr(be, "fuse_norm", "1")], ["rms_norm"])
    L = r.config.num_hidden_layers
    assert apart[2] == 2 * L + 1 and folded[2] == 1
    assert np.isfinite(folded[0]).all()
    np.testing.assert_allclose(folded[0], apart[0], rtol=1e-4, atol=1e-4)
    np.testing.assert_array_equal(folded[0].argmax(-1), apart[0].argmax(-1))
    for a, b in zip(folded[1], apart[1]):
        np.testing.assert_allclose(bf16_to_f32(a), bf16_to_f32(b), rtol=2 ** -7, atol=1e-5)


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
@pytest.mark.parametrize("n_seqs", [1, 3, 8])
def test_fused_epilogues_give_identical_decode_logits(tmp_path, arch, n_seqs):
    """A decode step (the matvec path) with RoPE / SiLU fused into their projections and without: the same logits
    and the same K/V cache, bit for bit, and two launches fewer per layer."""

    def epilogues(fuse):
        def configure(be):
            be.fuse_epilogues = fuse
            be.fuse_norm = "0"  # the folded RMSNorm rounds differently (its own test above); bit-exact here
        return configure

    r, (apart, fused) = decode_step_each(tmp_path, arch, n_seqs, n_seqs, [epilogues(False), epilogues(True)],
                                         ["rope_write_kv", "silu_mul"])
    assert apart[2] == 2 * r.config.num_hidden_layers and fused[2] == 0
    assert np.isfinite(fused[0]).all()
    np.testing.assert_array_equal(fused[0], apart[0])
    for a, b in zip(fused[1], apart[1]):
        np.testing.assert_array_equal(a, b)
