"""Tensor-core prefill attention (kernels_cu/prefill_attention.cu) against a float64 numpy causal attention and
against the decode-style kernel (attn_partial), over a cache filled through scattered block tables."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tests.cuda_helpers import event_us, rel_err, report, require_gpu

cp = require_gpu()
pytestmark = pytest.mark.gpu

from llmrs.backends.cuda import CUDABackend  # noqa: E402
from llmrs.model.weights import bf16_bits, round_bf16  # noqa: E402
from llmrs.backends.cuda.prefill import plan_prefill_tiles  # noqa: E402
from llmrs.engine.batch import build_step_batch  # noqa: E402
from llmrs.engine.config import ModelConfig  # noqa: E402


def cfg(heads: int, kv: int, head_dim: int) -> ModelConfig:
    return ModelConfig(model_type="llama", vocab_size=300, hidden_size=heads * head_dim, intermediate_size=160,
                       num_hidden_layers=1, num_attention_heads=heads, num_key_value_heads=kv, head_dim=head_dim,
                       rope_theta=10000.0, rope_scaling=None, max_position_embeddings=40000)


def fill_cache(rng, be):
    """Random bf16 K/V in every block of layer 0; returns them as float64 [blocks, Hkv, bs, D]."""
    out = []
    for cache in (be.k_cache[0], be.v_cache[0]):
        vals = round_bf16(rng.standard_normal(cache.shape).astype(np.float32))
        cache[...] = cp.asarray(bf16_bits(vals))
        out.append(vals.astype(np.float64))
    return out


def reference(q, kc, vc, batch, bs, Hq, Hkv, D, scale):
    """float64 causal attention, q [T, Hq*D] as given (the caller rounds it to bf16)."""
    G = Hq // Hkv
    out = np.zeros((batch.num_tokens, Hq, D))
    for b in range(batch.num_seqs):
        s, e = int(batch.query_start[b]), int(batch.query_start[b + 1])
        ctx = int(batch.context_lens[b])
        j = np.arange(ctx)
        blk = batch.block_tables[b, j // bs]
        K = np.repeat(kc[blk, :, j % bs, :], G, axis=1)  # [ctx, Hq, D]
        V = np.repeat(vc[blk, :, j % bs, :], G, axis=1)
        qq = q[s:e].reshape(e - s, Hq, D).astype(np.float64)
        sc = np.einsum("thd,jhd->htj", qq, K) * scale
        sc[:, j[None, :] > batch.positions[s:e, None]] = -np.inf
        p = np.exp(sc - sc.max(-1, keepdims=True))
        p /= p.sum(-1, keepdims=True)
        out[s:e] = np.einsum("htj,jhd->thd", p, V)
    return out.reshape(batch.num_tokens, Hq * D)


def make_step(rng, specs, nb, bs):
    """A StepBatch over shuffled (non-contiguous) block ids: specs are (new tokens, cached before)."""
    perm = rng.permutation(nb).tolist()
    seqs, used = [], 0
    for n, cached in specs:
        nblk = -(-(n + cached) // bs)
        seqs.append((list(rng.integers(0, 10, n)), cached, perm[used: used + nblk], True))
        used += nblk
    assert used <= nb
    batch = build_step_batch(seqs, bs)
    batch.validate(bs)
    return batch


def run_prefill(be, batch, qkv_dev, q_stride, out):
    db = be.device_batch(batch)
    tiles = plan_prefill_tiles(batch.query_start, batch.positions)
    ok = be._prefill_attention(0, qkv_dev, q_stride, db, cp.asarray(tiles.reshape(-1)), tiles.shape[0], out)
    return ok, db


# prompts of 1, 15, 64, 65, 200, 256 tokens; a 37-token chunk at 100..136 over 100 cached keys; a decode at 150
SPECS = [(1, 0), (15, 0), (64, 0), (65, 0), (200, 0), (256, 0), (37, 100), (1, 150)]


@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("heads,kv", [(4, 4), (8, 2), (28, 4)])
def test_prefill_attention_matches_float64_and_the_decode_kernel(head_dim, heads, kv):
    rng = np.random.default_rng(head_dim * 100 + heads)
    c = cfg(heads, kv, head_dim)
    nb, bs = 80, 16
    be = CUDABackend(c, num_blocks=nb, block_size=bs, cuda_graphs=False)
    kc, vc = fill_cache(rng, be)
    batch = make_step(rng, SPECS, nb, bs)
    T, Dq = batch.num_tokens, heads * head_dim
    q_stride = (heads + 2 * kv) * head_dim  # q sits in the fused qkv buffer; its k/v columns are poison
    qkv = np.full((T, q_stride), np.nan, dtype=np.float32)
    qkv[:, :Dq] = rng.standard_normal((T, Dq)).astype(np.float32) * 1.5
    qkv_dev = cp.asarray(qkv)
    out = cp.full((T, Dq), np.nan, dtype=cp.float32)
    ok, db = run_prefill(be, batch, qkv_dev, q_stride, out)
    assert ok
    got = cp.asnumpy(out)
    want = reference(round_bf16(qkv[:, :Dq]), kc, vc, batch, bs, heads, kv, head_dim, float(be.scale))
    err = rel_err(got, want)
    # the decode-style kernel (f32 q, f32 probabilities) on the same inputs: a step without prefill tiles (with
    # them, _attention would run this same kernel again)
    old = cp.full((T, Dq), np.nan, dtype=cp.float32)
    be.prefill_min_tokens = None
    db_old = be.device_batch(batch)
    assert db_old.n_prefill_tiles == 0
    be._attention(0, qkv_dev, q_stride, db_old, old)
    err_old = rel_err(got, cp.asnumpy(old))
    report(f"prefill_attn hd{head_dim} h{heads}/{kv} vs f64", err)
    report(f"prefill_attn hd{head_dim} h{heads}/{kv} vs attn_partial", err_old)
    assert err < 5e-3 and err_old < 5e-3, (err, err_old)
    # per row too: a wrong causal limit on a few rows would hide in the global norm
    row_err = np.linalg.norm(got - want, axis=1) / np.linalg.norm(want, axis=1)
    assert row_err.max() < 2e-2, (int(row_err.argmax()), float(row_err.max()))
    # bf16 out (the o projection's GEMM input): the bits cast_f32_bf16 makes of the f32 output, every row written
    ob = cp.full((T, Dq), 0xFFFF, dtype=cp.uint16)
    assert run_prefill(be, batch, qkv_dev, q_stride, ob)[0]
    np.testing.assert_array_equal(cp.asnumpy(ob), bf16_bits(got))


def test_a_prefill_step_feeds_o_bf16_from_the_attention_kernel():
    """_attention with out_bf16 on a step a tensor-core kernel runs (a prefill; decodes with decode_attn_tc, auto's
    choice from 2 tokens) returns the bf16 buffer (no cast before o), holding the bits a cast of the f32 result
    makes; on a step attn_partial runs (CudaOptions.attn_kernel=partial), the f32 one."""
    rng = np.random.default_rng(7)
    heads, kv, D = 8, 2, 64
    be = CUDABackend(cfg(heads, kv, D), num_blocks=80, block_size=16, cuda_graphs=False)
    fill_cache(rng, be)
    for specs, kernel, bf16 in (([(40, 0), (1, 20)], "auto", True), ([(1, 30), (1, 5)], "auto", True),
                                ([(1, 30), (1, 5)], "partial", False)):
        be.attn_kernel = kernel
        batch = make_step(rng, specs, 80, 16)
        T = batch.num_tokens
        qkv = cp.asarray(rng.standard_normal((T, (heads + 2 * kv) * D)).astype(np.float32))
        f32 = cp.full((T, heads * D), np.nan, dtype=cp.float32)
        b16 = cp.full((T, heads * D), 0xFFFF, dtype=cp.uint16)
        db = be.device_batch(batch)
        got = be._attention(0, qkv, (heads + 2 * kv) * D, db, f32, out_bf16=b16)
        assert got is (b16 if bf16 else f32), (specs, kernel)
        if bf16:
            ref = cp.full((T, heads * D), np.nan, dtype=cp.float32)
            be._attention(0, qkv, (heads + 2 * kv) * D, db, ref)
            np.testing.assert_array_equal(cp.asnumpy(b16), bf16_bits(cp.asnumpy(ref)))


def test_prefill_attention_block_size_32_and_unsupported_head_dim():
    rng = np.random.default_rng(7)
    c = cfg(8, 2, 64)
    nb, bs = 24, 32
    be = CUDABackend(c, num_blocks=nb, block_size=bs, cuda_graphs=False)
    kc, vc = fill_cache(rng, be)
    batch = make_step(rng, [(100, 0), (30, 70), (1, 200)], nb, bs)
    T, Dq = batch.num_tokens, 8 * 64
    q = rng.standard_normal((T, Dq)).astype(np.float32)
    out = cp.full((T, Dq), np.nan, dtype=cp.float32)
    ok, _ = run_prefill(be, batch, cp.asarray(q), Dq, out)
    assert ok
    want = reference(round_bf16(q), kc, vc, batch, bs, 8, 2, 64, float(be.scale))
    assert rel_err(cp.asnumpy(out), want) < 5e-3
    be32 = CUDABackend(cfg(8, 2, 32), num_blocks=4, cuda_graphs=False)
    b32 = make_step(rng, [(5, 0)], 4, 16)
    o32 = cp.zeros((5, 8 * 32), dtype=cp.float32)
    ok32, _ = run_prefill(be32, b32, cp.zeros((5, 8 * 32), dtype=cp.float32), 8 * 32, o32)
    assert not ok32


@pytest.mark.parametrize("n_seqs,lengths", [(1, [16, 32, 64, 128, 256, 512, 1024, 2048, 4096]),
                                             (16, [8, 16, 32, 64, 128, 256, 512])])
def test_prefill_attention_speed_against_the_decode_kernel(n_seqs, lengths):
    """Qwen2.5-7B attention shape (28 q / 4 kv heads, D 128), n_seqs fresh prompts of each length in one step:
    time both kernels with CUDA events (back-to-back launches: at the shortest lengths this is the launch
    rate, not GPU time), report TFLOP/s (causal FLOPs 4 D Hq sum(pos + 1)). Run with -s for the table."""
    heads, kv, D, bs = 28, 4, 128, 16
    nb = n_seqs * -(-max(lengths) // bs) + 1
    be = CUDABackend(cfg(heads, kv, D), num_blocks=nb, block_size=bs, cuda_graphs=False)
    rng = np.random.default_rng(3)
    fill_cache(rng, be)
    rows = []
    for L in lengths:
        batch = make_step(rng, [(L, 0)] * n_seqs, nb, bs)
        T = batch.num_tokens
        q = cp.asarray(rng.standard_normal((T, heads * D)).astype(np.float32))
        out = cp.empty((T, heads * D), dtype=cp.float32)
        db = be.device_batch(batch)
        tiles = plan_prefill_tiles(batch.query_start, batch.positions)
        td = cp.asarray(tiles.reshape(-1))
        t_new = event_us(lambda: be._prefill_attention(0, q, heads * D, db, td, tiles.shape[0], out)) * 1e-6
        be.prefill_min_tokens = None  # a step without tiles: _attention runs attn_partial
        db_old = be.device_batch(batch)
        be.prefill_min_tokens = 16
        assert db_old.n_prefill_tiles == 0
        t_old = event_us(lambda: be._attention(0, q, heads * D, db_old, out)) * 1e-6
        flops = 4.0 * D * heads * n_seqs * L * (L + 1) / 2
        rows.append((L, t_new, t_old))
        report(f"prefill_attn 7B-shape {n_seqs}x{L}", {"us": t_new * 1e6, "tflops": flops / t_new / 1e12,
                                                       "attn_partial_us": t_old * 1e6,
                                                       "attn_partial_tflops": flops / t_old / 1e12})
        print(f"{n_seqs:3d} x L={L:5d}  prefill_attn {t_new * 1e6:9.1f} us {flops / t_new / 1e12:7.1f} TFLOP/s   "
              f"attn_partial {t_old * 1e6:9.1f} us {flops / t_old / 1e12:7.1f} TFLOP/s")
    # figures only (reported, and recorded in reports/): timings are not asserted in tests
    assert all(math.isfinite(t) and t > 0 for _, a, b in rows for t in (a, b))
