"""decode_attn_tc (prefill_attention.cu: decode attention on tensor cores, the G query heads of a KV head as the
MMA's rows; LLMRS_ATTN_KERNEL=tc) against the float64 reference and attn_partial on test_attention_gqa_gpu's
cases (decodes at contexts 1-512, a fresh prefill and a chunk over a cached prefix, shuffled tables, NaN in every
slot no token may read), head dims 64 and 128, 1 to 16 query heads a KV head, 1 / 3 / 8 splits; then inside CUDA
graphs with programmatic launches (a tiny model with 64-dim heads: graph replay == eager step); then a timing
figure at the 7B shape, 64 and 256 decodes at context 512 (printed and reported, never asserted). Q and P go
through bf16 for the MMAs (as the prefill kernel): bounds as the prefill tests'."""

from __future__ import annotations

import numpy as np
import pytest

from tests.cuda_helpers import event_us, rel_err, report, require_gpu

cp = require_gpu()
pytestmark = pytest.mark.gpu

from llmrs.engine.backends.cuda import NULL, CUDABackend, bf16_bits, rope_threads  # noqa: E402
from llmrs.engine.backends.cuda_prefill import decode_attention_tc, decode_tc_rope_takes  # noqa: E402
from llmrs.engine.batch import build_step_batch  # noqa: E402
from tests.test_attention_gqa_gpu import BS, cfg, launch, make_case, reference  # noqa: E402


@pytest.fixture(scope="module")
def rng():
    return np.random.default_rng(97)


@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("ratio", [1, 4, 7, 16])
@pytest.mark.parametrize("splits", [1, 3, 8])
def test_tc_decode_attention_matches_float64_and_attn_partial(rng, head_dim, ratio, splits):
    kv = 2
    heads, D = ratio * kv, head_dim
    be, batch, db, K, V, qkv, q_dev, q_stride = make_case(rng, heads, kv, D)
    want = reference(qkv[:, : heads * D], K, V, batch, ratio, float(be.scale))
    base = cp.asnumpy(launch(be, getattr(be.k, f"attn_partial_d{be.dpl}"), q_dev, q_stride, db, splits))
    be.attn_splits = splits
    out = cp.full((db.T, heads * D), np.nan, dtype=cp.float32)
    assert decode_attention_tc(be, 0, q_dev, q_stride, db, out) is out
    got = cp.asnumpy(out)
    assert np.isfinite(got).all(), "every row written, nothing read past a token's limit"
    err, err_base = rel_err(got, want), rel_err(got, base)
    report(f"attn_tc hd{D} h{heads}/{kv} splits={splits} vs float64", err)
    assert err < 5e-3 and err_base < 5e-3, (err, err_base)
    rows = [rel_err(got[t], want[t]) for t in range(batch.num_tokens)]
    assert max(rows) < 2e-2, (int(np.argmax(rows)), max(rows))
    # o's bf16 input written by the kernel (one split) or attn_merge_bf16: the bits a cast of the f32 result makes
    words = cp.full((db.T, heads * D), 0xFFFF, dtype=cp.uint16)
    assert decode_attention_tc(be, 0, q_dev, q_stride, db, out, out_bf16=words) is words
    assert np.array_equal(cp.asnumpy(words), bf16_bits(got))


def test_tc_attention_in_decode_graphs_equals_the_eager_step(tmp_path, monkeypatch):
    """A tiny Qwen2 with 64-dim heads decoding through graphs (programmatic launches on sm_90) with
    LLMRS_ATTN_KERNEL=tc, one split: every replay's logits equal the eager step's."""
    from llmrs.engine.loader import load
    from llmrs.engine.runner import ModelRunner
    from tests.conftest import write_tiny_model
    from tests.test_cuda_graphs import greedy_decode, prompts_of

    monkeypatch.setenv("LLMRS_ATTN_KERNEL", "tc")
    path = write_tiny_model(tmp_path / "qwen2", "qwen2", hidden_size=256, num_attention_heads=4,
                            num_key_value_heads=2)
    r = ModelRunner(load(str(path)), num_blocks=64, device="cuda")
    assert r.backend.config.head_dim == 64 and r.backend.attn_kernel == "tc"
    r.backend.attn_splits = 1  # the same tiles in both paths (a graph's split count follows its context cap)
    for n in (1, 3):
        prompts = prompts_of(n, seed=40 + n)
        eager = greedy_decode(r, prompts, 8, graphs=False)
        graph = greedy_decode(r, prompts, 8, graphs=True)
        assert not r.backend.graphs.failed
        for e, g in zip(eager, graph):
            assert np.isfinite(g).all()
            assert np.array_equal(e, g)


def decode_case(rng, heads: int, kv: int, D: int):
    """A decode step (every sequence one new token) at contexts 1, 15, 16, 17, 32, 300 and 512 over shuffled blocks:
    random bf16 K / V in the cached slots, NaN in every other slot (the new tokens' own included: a read before the
    write shows). Returns (be, db, q_stride)."""
    cached = [0, 14, 15, 16, 31, 299, 511]
    nb = sum(-(-(c + 1) // BS) for c in cached) + 5
    be = CUDABackend(cfg(heads, kv, D), num_blocks=nb)
    perm = rng.permutation(nb).tolist()
    seqs, used = [], 0
    for c in cached:
        nblk = -(-(c + 1) // BS)
        seqs.append(([int(rng.integers(0, 10))], c, perm[used: used + nblk], True))
        used += nblk
    batch = build_step_batch(seqs, BS)
    K = np.full((nb, kv, BS, D), np.nan, dtype=np.float32)
    V = np.full((nb, kv, BS, D), np.nan, dtype=np.float32)
    for b, c in enumerate(cached):
        slots = np.arange(c)
        blocks = batch.block_tables[b][slots // BS]
        for arr in (K, V):
            arr[blocks, :, slots % BS, :] = rng.standard_normal((c, kv, D)).astype(np.float32)
    be.k_cache[0][...] = cp.asarray(bf16_bits(K))
    be.v_cache[0][...] = cp.asarray(bf16_bits(V))
    return be, be.device_batch(batch), (heads + 2 * kv) * D


@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("ratio", [1, 7, 16])
@pytest.mark.parametrize("splits", [1, 3])
@pytest.mark.parametrize("bias", [False, True])
def test_rope_in_decode_attn_tc_is_rope_write_kv_then_the_attention(rng, head_dim, ratio, splits, bias):
    """decode_attn_tc_rope* (RoPE, the q / k / v bias and the K / V cache write in the attention's prologue) against
    rope_write_kv + decode_attn_tc on the same raw qkv rows: the output (f32, and bf16 words for o) and both caches
    bit for bit, every split count; the new keys' slots held NaN before, so attending to one before it is written
    shows."""
    kv = 2
    heads, D = ratio * kv, head_dim
    be, db, q_stride = decode_case(rng, heads, kv, D)
    assert db.one_token_each and not db.n_prefill_tiles
    be.attn_kernel, be.attn_splits = "tc", splits
    qkv = cp.asarray(rng.standard_normal((db.T, q_stride)).astype(np.float32) * 2)
    b = cp.asarray(rng.standard_normal(q_stride).astype(np.float32)) if bias else None
    assert decode_tc_rope_takes(be, db, qkv, q_stride)
    k0, v0 = be.k_cache[0].copy(), be.v_cache[0].copy()

    def run(fused: bool, words: bool):
        be.k_cache[0][...] = k0
        be.v_cache[0][...] = v0
        q = qkv.copy()
        if not fused:
            be.k.rope_write_kv((db.T,), (rope_threads(heads, kv, D),),
                               (q, db.positions, be.inv_freq, db.slots, be.k_cache[0], be.v_cache[0], np.int32(heads),
                                np.int32(kv), np.int32(D), np.int32(BS), NULL if b is None else b))
        out = cp.full((db.T, heads * D), np.nan, dtype=cp.float32)
        w = cp.full((db.T, heads * D), 0xFFFF, dtype=cp.uint16) if words else None
        dst = decode_attention_tc(be, 0, q, q_stride, db, out, out_bf16=w, rope=(b,) if fused else None)
        return cp.asnumpy(dst), cp.asnumpy(be.k_cache[0]), cp.asnumpy(be.v_cache[0])

    for words in (False, True):
        want, got = run(False, words), run(True, words)
        # every row written, no key read before its write
        assert (got[0] != 0xFFFF).all() if words else np.isfinite(got[0]).all()
        for a, g, what in zip(want, got, ("output", "K cache", "V cache")):
            assert np.array_equal(a.view(np.uint8), g.view(np.uint8)), what


def test_rope_in_attention_keeps_a_tiny_models_decode_logits(tmp_path, monkeypatch):
    """A tiny Qwen2 (64-dim heads, q / k / v bias) decoding 3 and 10 sequences at once (the bf16 GEMM path, so
    decode_attn_tc_rope runs): eager logits with LLMRS_ROPE_IN_ATTENTION's fusion on equal those with rope_write_kv,
    bit for bit, and the decode graphs (which capture the fused form) equal both."""
    from llmrs.engine.loader import load
    from llmrs.engine.runner import ModelRunner
    from tests.conftest import write_tiny_model
    from tests.test_cuda_graphs import greedy_decode, prompts_of

    monkeypatch.setenv("LLMRS_ATTN_KERNEL", "tc")
    path = write_tiny_model(tmp_path / "qwen2", "qwen2", hidden_size=256, num_attention_heads=4,
                            num_key_value_heads=2)
    r = ModelRunner(load(str(path)), num_blocks=64, device="cuda")
    be = r.backend
    be.attn_splits = 1
    assert be.rope_in_attention and r.model.w.layers[0].qkv_bias is not None
    for n in (3, 10):
        prompts = prompts_of(n, seed=70 + n)
        be.rope_in_attention = False
        plain = greedy_decode(r, prompts, 6, graphs=False)
        be.rope_in_attention = True
        fused = greedy_decode(r, prompts, 6, graphs=False)
        graph = greedy_decode(r, prompts, 6, graphs=True)
        assert not be.graphs.failed
        for p, f, g in zip(plain, fused, graph):
            assert np.isfinite(f).all()
            assert np.array_equal(p, f) and np.array_equal(f, g)


def test_tc_attention_timing_7b_decode():
    """Qwen2.5-7B attention (28/4 heads, head_dim 128) for 64 and 256 decodes at context 512: attn_partial_gqa (the
    backend's choice there) against decode_attn_tc at its own splits, CUDA events; outputs must agree."""
    heads, kv, D, ctx = 28, 4, 128, 512
    nbps = ctx // BS
    nb = 256 * nbps
    be = CUDABackend(cfg(heads, kv, D), num_blocks=nb)
    gen = cp.random.default_rng(3)
    for cache in (be.k_cache[0], be.v_cache[0]):
        cache[...] = (gen.standard_normal(cache.shape, dtype=cp.float32).view(cp.uint32) >> 16).astype(cp.uint16)
    perm = np.random.default_rng(0).permutation(nb).tolist()
    for B in (64, 256):
        batch = build_step_batch([([1], ctx - 1, perm[b * nbps: (b + 1) * nbps], True) for b in range(B)], BS)
        db = be.device_batch(batch)
        q_stride = (heads + 2 * kv) * D
        qkv = gen.standard_normal((B, q_stride), dtype=cp.float32)
        out_g = cp.zeros((B, heads * D), dtype=cp.float32)
        out_t = cp.zeros_like(out_g)
        be.attn_kernel = "gqa"
        us_g = event_us(lambda: be._attention(0, qkv, q_stride, db, out_g))
        be.attn_kernel = "tc"
        us_t = event_us(lambda: be._attention(0, qkv, q_stride, db, out_t))
        kv_bytes = 2 * 2 * B * ctx * kv * D
        line = (f"7B attention B={B} ctx={ctx}: gqa {us_g:.1f} us ({kv_bytes / us_g / 1e3:.0f} GB/s), "
                f"tc {us_t:.1f} us ({kv_bytes / us_t / 1e3:.0f} GB/s)")
        print(line)
        report(f"attn_tc timing B={B}", {"gqa_us": us_g, "tc_us": us_t})
        assert rel_err(cp.asnumpy(out_t), cp.asnumpy(out_g)) < 5e-3
