"""Quantized weights on the GPU (kernels_cu/matvec_q4.cu through CUDABackend): run on the GPU machine with
`python3 -m pytest -q -m gpu tests/gpu/test_quant_gpu.py`; skips cleanly without CuPy or a GPU.

- the 4-bit (AWQ, Q4_0, Q4_1) and 8-bit (Q8_0) matvec against x @ W.T of the exact numpy dequantization, fresh
  random inputs, odd shapes, 1..8 tokens, bias and accumulate;
- the GEMM path's dequantization to bf16 is bit-exact with the CPU's float32 dequantization rounded to bf16;
- tiny AWQ models end to end: with every linear on the matvec, greedy tokens identical to the CPU reference on
  the exact weights; the default path (GEMM prefill) against the dequantized-bf16 path (`--dequantize`);
- SmolLM2's real Q4_1/Q8_0 weights kept quantized against the dequantized-bf16 path.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from llmrs.errors import UserError

from tests.cuda_helpers import rel_err, report, require_gpu, tiny_backend

cp = require_gpu()
pytestmark = pytest.mark.gpu

from llmrs.bench.checkpoint import write_awq_checkpoint  # noqa: E402
from llmrs.model import quant as Q  # noqa: E402
from llmrs.backends.cuda import CUDABackend  # noqa: E402
from llmrs.model.weights import bf16_bits, round_bf16  # noqa: E402
from llmrs.model.loader import load  # noqa: E402
from llmrs.engine.runner import ModelRunner  # noqa: E402
from tests.conftest import write_tiny_model  # noqa: E402
from tests.gpu.test_cuda_parity_gpu import compare, greedy, last_logits, prompts_for  # noqa: E402
from tests.model.test_quant import random_awq, random_gguf_blocks  # noqa: E402


@pytest.fixture(scope="module")
def backend():
    return tiny_backend()


def make_weight(source, N, K, G, seed):
    rng = np.random.default_rng(seed)
    if source == "awq":
        # AutoAWQ packs along the output dim in 8s; rows past N are dropped after the repack (odd N)
        qw, qz, s = random_awq(rng, K, -(-N // 8) * 8, G)
        return Q.awq_to_rows(qw, qz, s, G).take_rows(np.arange(N))
    ggml = {"q4_0": 2, "q4_1": 3, "q8_0": 8}[source]
    return Q.gguf_to_rows(random_gguf_blocks(rng, source, N, K), ggml, N, K)


CASES = [("awq", 37, 384, 128), ("awq", 131, 1152, 128), ("awq", 4099, 640, 64), ("awq", 67, 96, 32),
         ("q4_0", 37, 96, 32), ("q4_0", 1029, 2080, 32), ("q4_1", 37, 96, 32), ("q4_1", 1029, 2080, 32),
         ("q8_0", 37, 96, 32), ("q8_0", 1029, 2080, 32)]


@pytest.mark.parametrize("source,N,K,G", CASES)
@pytest.mark.parametrize("T", [1, 2, 3, 5, 8])
def test_quant_matvec_matches_numpy_dequantized_reference(backend, source, N, K, G, T):
    w = make_weight(source, N, K, G, seed=N + K + T)
    rng = np.random.default_rng(T)
    x = rng.standard_normal((T, K)).astype(np.float32)
    bias = rng.standard_normal(N).astype(np.float32)
    dw = backend.upload_quantized(w)
    ref = x.astype(np.float64) @ w.dequantize().astype(np.float64).T
    out = backend.linear(cp.asarray(x), dw, cp.asarray(bias))
    err = rel_err(cp.asnumpy(out), ref + bias)
    assert err < 2e-6 * np.sqrt(K), err
    y0 = rng.standard_normal((T, N)).astype(np.float32)
    y = cp.asarray(y0)
    backend._linear(cp.asarray(x), dw, None, y, accumulate=True)
    assert rel_err(cp.asnumpy(y), ref + y0) < 2e-6 * np.sqrt(K)
    report(f"matvec {source} N{N} K{K} G{G} T{T}", {"rel": err})


@pytest.mark.parametrize("source,N,K,G", CASES[:4] + CASES[5:6] + CASES[7:8] + CASES[9:10])
def test_gemm_path_dequantizes_to_bf16_bit_exactly(backend, source, N, K, G):
    w = make_weight(source, N, K, G, seed=7)
    T = 17  # above matvec_max_tokens: dequantize into the bf16 scratch, then cuBLAS
    x = np.random.default_rng(1).standard_normal((T, K)).astype(np.float32)
    dw = backend.upload_quantized(w)
    out = backend.linear(cp.asarray(x), dw)
    cp.cuda.Device().synchronize()
    scratch = cp.asnumpy(backend._ws["dequant_w"][: N * K]).reshape(N, K)
    np.testing.assert_array_equal(scratch, bf16_bits(w.dequantize()))
    ref = round_bf16(x).astype(np.float64) @ round_bf16(w.dequantize()).astype(np.float64).T
    assert rel_err(cp.asnumpy(out), ref) < 1e-5


# ---------------------------------------------------------------------- end to end
def compare_weights(name, a, b, prompts, rel_tol=5e-2):
    """Runner a against runner b when their weights differ by bf16 rounding (the quantized path holds the exact
    (q - z) * s, --dequantize its bf16 rounding: ~1.4% on the tiny random models' logits, measured on the CPU):
    logits within rel_tol; greedy tokens identical, or diverging only at a near tie of b (top-2 margin below 4x
    the worst logit difference), reported."""
    worst_abs, worst_rel = 0.0, 0.0
    for ids in prompts:
        x, y = last_logits(a, ids), last_logits(b, ids)
        worst_abs, worst_rel = max(worst_abs, float(np.abs(x - y).max())), max(worst_rel, rel_err(x, y))
    report(f"{name} logits", {"max_abs": worst_abs, "rel": worst_rel})
    assert worst_rel < rel_tol, worst_rel
    identical, near_ties = 0, []
    for ids in prompts:
        ta, tb = greedy(a, ids), greedy(b, ids)
        if ta == tb:
            identical += 1
            continue
        i = next(k for k in range(len(tb)) if ta[k] != tb[k])
        top2 = np.sort(last_logits(b, ids + tb[:i]))[-2:]
        margin = float(top2[1] - top2[0])
        near_ties.append({"prompt_len": len(ids), "step": i, "margin": margin})
        assert margin < 4 * max(worst_abs, 1e-3), f"{name}: greedy tokens diverge at step {i}, margin {margin}"
    report(f"{name} greedy32", {"identical": identical, "of": len(prompts), "near_tie_divergences": near_ties})


@pytest.fixture(scope="module")
def tiny_awq(tmp_path_factory):
    d = tmp_path_factory.mktemp("awq_gpu")
    return {arch: write_awq_checkpoint(write_tiny_model(d / arch, arch), d / f"{arch}-awq", group_size=32)
            for arch in ("llama", "qwen2")}


def exact_reference(loaded_dense, num_blocks):
    """The CPU reference on what the quantized GPU path holds: exact dequantized linears, bf16-rounded everything
    else (norms, biases, embeddings, lm_head), bf16 K/V."""
    t = {k: v if k.endswith("proj.weight") else round_bf16(v) for k, v in loaded_dense.tensors.items()}
    r = ModelRunner(dataclasses.replace(loaded_dense, tensors=t), num_blocks=num_blocks, device="cpu")
    write = r.backend.write_kv
    r.backend.write_kv = lambda layer, k, v, slots: write(layer, round_bf16(k), round_bf16(v), slots)
    return r


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_tiny_awq_matvec_everywhere_equals_cpu_reference_on_exact_weights(arch, tiny_awq, monkeypatch):
    kept = load(str(tiny_awq[arch]), keep_quantized=True)
    # decode on the matvec too (the GEMV rounds x to bf16): CudaOptions.q4_gemv=0 from the upload on, which keeps every
    # weight's row form (by default a weight in the GEMM layout holds only the reordered copy)
    monkeypatch.setattr(CUDABackend, "q4_gemv", False)
    gpu = ModelRunner(kept, num_blocks=32, device="cuda")
    assert isinstance(gpu.model.w.layers[0].qkv, Q.DeviceQuantWeight)
    assert all(w.qweight is not None for w in (gpu.model.w.layers[0].qkv, gpu.model.w.layers[0].down))
    gpu.backend.quant_matvec_max_tokens = 1 << 30  # prefill through the 4-bit matvec too: f32 activations
    gpu.backend.prefill_min_tokens = None  # and the f32 attention kernel (the tensor-core one rounds q to bf16)
    cpu = exact_reference(load(str(tiny_awq[arch])), 32)
    compare(f"awq tiny {arch} matvec vs exact cpu", gpu, cpu, prompts_for(kept.tokenizer), strict=True)


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_tiny_awq_quantized_path_equals_dequantized_bf16_path(arch, tiny_awq):
    """Default engine path (4-bit matvec for decode, dequantize + GEMM for prefill) against `--dequantize`
    (bf16 weights). The two hold different weights (bf16 rounds (q - z) * s), so a divergence is accepted
    only at a near tie of the reference, and reported."""
    kept = load(str(tiny_awq[arch]), keep_quantized=True)
    quant = ModelRunner(kept, num_blocks=32, device="cuda")
    dense = ModelRunner(load(str(tiny_awq[arch]), keep_quantized=False), num_blocks=32, device="cuda")
    assert not isinstance(dense.model.w.layers[0].qkv, Q.DeviceQuantWeight)
    compare_weights(f"awq tiny {arch} quantized vs --dequantize", quant, dense, prompts_for(kept.tokenizer))


def test_smollm2_q4_1_kept_quantized_equals_dequantized_bf16_path():
    try:  # GPU machines may lack the embedded package: skip there (LLMRS_EMBEDDED_DIR points at the file)
        kept = load("smollm2-135m", keep_quantized=True)
    except UserError as e:
        pytest.skip(str(e))
    quant = ModelRunner(kept, num_blocks=64, device="cuda")
    assert isinstance(quant.model.w.layers[0].gate_up, Q.DeviceQuantWeight)
    dense = ModelRunner(load("smollm2-135m", keep_quantized=False), num_blocks=64, device="cuda")
    compare_weights("smollm2 Q4_1 quantized vs --dequantize", quant, dense, prompts_for(kept.tokenizer))


def test_synthetic_awq_decode_bench_runs_packed_weights():
    """`llmrs synth --like P --quant awq --decode-bench`: 4-bit weights drawn on the GPU in the backend's packed
    form (+ the GEMM's reordered copy), decoded through the 4-bit matvec; bytes from the awq format."""
    from llmrs.profiling.decode_bench import decode_benchmark

    r = decode_benchmark("qwen2.5-0.5b", prompt_len=40, steps=8, warmup=2, quant="awq")
    bf16 = decode_benchmark("qwen2.5-0.5b", prompt_len=40, steps=8, warmup=2)
    assert r["weights"] == "awq" and r["ms_per_token"] > 0
    assert r["bytes_per_step"] < 0.75 * bf16["bytes_per_step"]  # 4.25-bit linears, bf16 lm_head
    report("decode awq qwen2.5-0.5b ms/token (8 steps)", r["ms_per_token"])


# ---------------------------------------------------------------------- 4-bit matvec: rows per block, timing
# matvec_q4.cu gives each block 4 rows (every warp works on all four, x read once per block): row counts that are
# not a multiple of 4 leave guard rows in the last block (read row N - 1, store nothing); K long enough that a
# thread walks several chunks (K = 8320: 260 chunks a row, 128 threads).
ODD_ROWS = [(1, 4608), (7, 384), (33, 8320), (4609, 640)]


@pytest.mark.parametrize("source,G", [("awq", 128), ("q4_0", 32), ("q4_1", 32)])
@pytest.mark.parametrize("N,K", ODD_ROWS)
@pytest.mark.parametrize("T", [1, 3, 8])
def test_q4_matvec_rows_not_a_multiple_of_the_block_rows_match_numpy(backend, source, G, N, K, T):
    w = make_weight(source, N, K, G, seed=3 * N + K + T)
    rng = np.random.default_rng(N + T)
    x = rng.standard_normal((T, K)).astype(np.float32)
    bias = rng.standard_normal(N).astype(np.float32)
    dw = backend.upload_quantized(w)
    ref = x.astype(np.float64) @ w.dequantize().astype(np.float64).T
    y0 = rng.standard_normal((T, N)).astype(np.float32)
    y = cp.asarray(y0)  # guard rows must not write past N: a poisoned tail checks it
    buf = cp.full(T * N + 64, np.nan, dtype=cp.float32)
    out = buf[: T * N].reshape(T, N)
    backend._linear(cp.asarray(x), dw, cp.asarray(bias), out)
    err = rel_err(cp.asnumpy(out), ref + bias)
    assert err < 2e-6 * np.sqrt(K), err
    assert bool(cp.isnan(buf[T * N:]).all()), "wrote past the last row"
    backend._linear(cp.asarray(x), dw, None, y, accumulate=True)
    assert rel_err(cp.asnumpy(y), ref + y0) < 2e-6 * np.sqrt(K)
    report(f"matvec q4 rows {source} N{N} K{K} T{T}", {"rel": err})


QWEN7B_SHAPES = {"qkv": (4608, 3584), "o": (3584, 3584), "gate_up": (37888, 3584), "down": (3584, 18944)}
HBM_TBPS = {"H200": 4.8, "H100": 3.35}  # for the printout only


def test_q4_matvec_bandwidth_on_qwen2_5_7b_shapes(backend):
    """Timing, not asserted: the 4-bit matvec (AWQ, G = 128) at T = 1 on a Qwen2.5-7B layer's shapes, GB/s of the
    packed bytes (codes + fp16 scales + fp16 zeros), and the 28 layers' linears per token at those rates. Asserted:
    its outputs are finite and bit-identical from launch to launch."""
    rs = cp.random.RandomState(0)
    G, layer_us, layer_bytes, figures = 128, 0.0, 0, {}
    start, stop = cp.cuda.Event(), cp.cuda.Event()
    for name, (N, K) in QWEN7B_SHAPES.items():
        words = rs.randint(0, 1 << 16, size=(N, K // 4), dtype=cp.int32).astype(cp.uint16)
        qweight = cp.ascontiguousarray(words.view(cp.uint32))
        scales = (rs.uniform(0.5, 1.5, size=(N, K // G), dtype=cp.float32) * 0.004).astype(cp.float16).view(cp.uint16)
        zeros = rs.randint(0, 16, size=(N, K // G), dtype=cp.int32).astype(cp.float16).view(cp.uint16)
        dw = Q.DeviceQuantWeight("awq", N, K, G, qweight, scales, zeros)
        x = rs.standard_normal((1, K), dtype=cp.float32)
        out = cp.empty((1, N), dtype=cp.float32)
        for _ in range(3):
            backend._linear(x, dw, None, out)
        first = cp.asnumpy(out).copy()
        reps = 50
        start.record()
        for _ in range(reps):
            backend._linear(x, dw, None, out)
        stop.record()
        stop.synchronize()
        us = cp.cuda.get_elapsed_time(start, stop) * 1e3 / reps
        # what was timed: finite, and the same bits every launch (a fixed-order reduction)
        assert np.isfinite(first).all() and np.array_equal(first, cp.asnumpy(out)), name
        nbytes = qweight.nbytes + scales.nbytes + zeros.nbytes
        figures[name] = {"N": N, "K": K, "us": round(us, 2), "GB/s": round(nbytes / us / 1e3, 1)}
        layer_us, layer_bytes = layer_us + us, layer_bytes + nbytes
        del qweight, scales, zeros, dw, words
    figures["layer"] = {"us": round(layer_us, 2), "GB/s": round(layer_bytes / layer_us / 1e3, 1),
                        "28 layers ms": round(28 * layer_us / 1e3, 3),
                        "floor ms at 4.8 TB/s": round(28 * layer_bytes / 4.8e12 * 1e3, 3)}
    name = cp.cuda.runtime.getDeviceProperties(0)["name"].decode()
    print(f"\nq4 matvec T=1, Qwen2.5-7B shapes, G=128 ({name}; HBM ceilings TB/s {HBM_TBPS}):")
    for k, v in figures.items():
        print(f"  {k:8s} {v}")
    report("matvec q4 T1 qwen2.5-7b shapes", figures)
