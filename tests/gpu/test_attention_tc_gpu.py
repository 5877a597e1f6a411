"""decode_attn_tc (prefill_attention.cu: decode attention on tensor cores, the G query heads of a KV head as the
MMA's rows; CudaOptions.attn_kernel=tc) against the float64 reference and attn_partial on test_attention_gqa_gpu's
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

from llmrs.backends.cuda import CUDABackend  # noqa: E402
from llmrs.model.weights import bf16_bits  # noqa: E402
from llmrs.engine.batch import build_step_batch  # noqa: E402
from tests.gpu.test_attention_gqa_gpu import BS, cfg, launch, make_case, reference  # noqa: E402


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
    assert be._decode_attention_tc(0, q_dev, q_stride, db, out) is out
    got = cp.asnumpy(out)
    assert np.isfinite(got).all(), "every row written, nothing read past a token's limit"
    err, err_base = rel_err(got, want), rel_err(got, base)
    report(f"attn_tc hd{D} h{heads}/{kv} splits={splits} vs float64", err)
    assert err < 5e-3 and err_base < 5e-3, (err, err_base)
    rows = [rel_err(got[t], want[t]) for t in range(batch.num_tokens)]
    assert max(rows) < 2e-2, (int(np.argmax(rows)), max(rows))
    # o's bf16 input written by the kernel (one split) or attn_merge_bf16: the bits a cast of the f32 result makes
    words = cp.full((db.T, heads * D), 0xFFFF, dtype=cp.uint16)
    assert be._decode_attention_tc(0, q_dev, q_stride, db, out, out_bf16=words) is words
    assert np.array_equal(cp.asnumpy(words), bf16_bits(got))


def test_tc_attention_in_decode_graphs_equals_the_eager_step(tmp_path, monkeypatch):
    """A tiny Qwen2 with 64-dim heads decoding through graphs (programmatic launches on sm_90) with
    the tensor-core decode attention forced (CudaOptions.attn_kernel "tc"), one split: every replay's logits equal the eager step's."""
    from llmrs.model.loader import load
    from llmrs.engine.runner import ModelRunner
    from tests.conftest import write_tiny_model
    from tests.backends.test_cuda_graphs import greedy_decode, prompts_of

    from llmrs.backends.cuda import CUDABackend

    monkeypatch.setattr(CUDABackend, "attn_kernel", "tc")
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
