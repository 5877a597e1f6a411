"""4-bit weights on the CPU: AWQ packing and dequantization exact against references written here from the
spec (a loop per weight) and from AutoAWQ's / vLLM's vectorized formula; the row repacking and the GGUF
block conversion round-trip bit-exactly; a tiny AWQ model (written from a tiny HF model) runs the same math as
the dense reference on its dequantized weights; `llmrs synth --quant awq` output loads and runs."""

from __future__ import annotations

import json

import numpy as np
import pytest

from llmrs.bench.checkpoint import write_awq_checkpoint
from llmrs.model import quant as Q
from llmrs.engine.batch import build_step_batch
from llmrs.engine.config import EngineConfig
from llmrs.model.loader import load, resolve
from llmrs.engine.runner import ModelRunner
from llmrs.model.weights import dequant_q4_0, dequant_q4_1, dequant_q8_0
from llmrs.errors import UserError
from tests.conftest import write_tiny_model

BS = 16


def random_awq(rng, in_f, out_f, G):
    qweight = rng.integers(-(1 << 31), 1 << 31, size=(in_f, out_f // 8), dtype=np.int64).astype(np.int32)
    qzeros = rng.integers(-(1 << 31), 1 << 31, size=(in_f // G, out_f // 8), dtype=np.int64).astype(np.int32)
    scales = (rng.standard_normal((in_f // G, out_f)) * 0.01).astype(np.float16)
    return qweight, qzeros, scales


def loop_reference(qweight, qzeros, scales, G):
    """From the spec, one weight at a time: output o of packed column o // 8 sits in the nibble k with
    AWQ_ORDER[k] == o % 8 (AutoAWQ packs order_map = [0, 2, 4, 6, 1, 3, 5, 7]); w = (q - z) * s."""
    order = [0, 2, 4, 6, 1, 3, 5, 7]
    in_f, out_f = qweight.shape[0], qweight.shape[1] * 8
    w = np.zeros((out_f, in_f), dtype=np.float32)
    for o in range(out_f):
        k = order.index(o % 8)
        for i in range(in_f):
            q = (int(qweight[i, o // 8]) >> (4 * k)) & 0xF
            z = (int(qzeros[i // G, o // 8]) >> (4 * k)) & 0xF
            w[o, i] = np.float32(q - z) * np.float32(scales[i // G, o])
    return w


def autoawq_formula(qweight, qzeros, scales, G):
    """AutoAWQ's dequantize_gemm (unpack_awq + reverse_awq_order, as vLLM's awq dequant), in numpy and float32:
    shifts 0, 4, ..., 28 along a new last axis, reorder each 8 by [0, 4, 1, 5, 2, 6, 3, 7], & 0xF,
    (iweight - izeros.repeat_interleave(G)) * scales.repeat_interleave(G), transposed to [out, in]."""
    shifts = np.arange(0, 32, 4)
    iw = (qweight[:, :, None].astype(np.int64) >> shifts).reshape(qweight.shape[0], -1)
    iz = (qzeros[:, :, None].astype(np.int64) >> shifts).reshape(qzeros.shape[0], -1)
    rev = np.arange(iw.shape[1]).reshape(-1, 8)[:, [0, 4, 1, 5, 2, 6, 3, 7]].reshape(-1)
    iw, iz = iw[:, rev] & 0xF, iz[:, rev] & 0xF
    w = (iw - np.repeat(iz, G, axis=0)).astype(np.float32) * np.repeat(scales.astype(np.float32), G, axis=0)
    return w.T


@pytest.mark.parametrize("G", [32, 64, 128])
def test_awq_dequant_exact_against_loop_reference_and_autoawq_formula(G):
    rng = np.random.default_rng(G)
    qw, qz, s = random_awq(rng, 2 * G, 24, G)
    ours = Q.awq_dequantize(qw, qz, s, G)
    assert ours.shape == (24, 2 * G) and ours.dtype == np.float32
    np.testing.assert_array_equal(ours, loop_reference(qw, qz, s, G))
    qw, qz, s = random_awq(rng, 4 * G, 64, G)
    np.testing.assert_array_equal(Q.awq_dequantize(qw, qz, s, G), autoawq_formula(qw, qz, s, G))


def test_awq_pack_unpack_round_trip_bit_exact():
    rng = np.random.default_rng(1)
    codes = rng.integers(0, 16, size=(96, 40), dtype=np.uint8)
    packed = Q.awq_pack(codes)
    assert packed.dtype == np.int32 and packed.shape == (96, 5)
    np.testing.assert_array_equal(Q.awq_unpack(packed), codes)
    words = rng.integers(-(1 << 31), 1 << 31, size=(7, 3), dtype=np.int64).astype(np.int32)  # every bit pattern
    np.testing.assert_array_equal(Q.awq_pack(Q.awq_unpack(words)), words)
    # the interleave itself: codes 0..7 in one group land in nibbles by AWQ_ORDER
    word = int(Q.awq_pack(np.arange(8, dtype=np.uint8)[None, :]).view(np.uint32)[0, 0])
    assert [(word >> (4 * k)) & 0xF for k in range(8)] == [0, 2, 4, 6, 1, 3, 5, 7]


@pytest.mark.parametrize("G", [32, 128])
def test_awq_row_repack_round_trip_and_same_weights(G):
    rng = np.random.default_rng(2)
    qw, qz, s = random_awq(rng, 3 * G, 48, G)
    rows = Q.awq_to_rows(qw, qz, s, G)
    assert rows.shape == (48, 3 * G) and rows.qweight.dtype == np.uint32 and rows.qweight.shape == (48, 3 * G // 8)
    back = Q.rows_to_awq(rows)
    for a, b in zip(back, (qw, qz, s)):
        np.testing.assert_array_equal(a.view(np.uint8), np.ascontiguousarray(b).view(np.uint8))
    np.testing.assert_array_equal(rows.dequantize(), Q.awq_dequantize(qw, qz, s, G))
    # row-major words hold consecutive input positions, low nibble first
    codes = Q.awq_unpack(qw).T
    assert int(rows.qweight[5, 2]) == sum(int(codes[5, 16 + i]) << (4 * i) for i in range(8))


def test_pack_rows_round_trip():
    codes = np.random.default_rng(3).integers(0, 16, size=(9, 64), dtype=np.uint8)
    np.testing.assert_array_equal(Q.unpack_rows(Q.pack_rows(codes)), codes)


def random_gguf_blocks(rng, kind, N, K):
    """Raw GGUF block bytes of an [N, K] tensor: valid fp16 scales (and mins), random codes."""
    nb = N * K // 32
    d = (rng.standard_normal(nb) * 0.01).astype(np.float16).view(np.uint8).reshape(nb, 2)
    if kind == "q8_0":
        return np.concatenate([d, rng.integers(0, 256, (nb, 32), dtype=np.uint8)], axis=1).reshape(-1)
    qs = rng.integers(0, 256, (nb, 16), dtype=np.uint8)
    if kind == "q4_0":
        return np.concatenate([d, qs], axis=1).reshape(-1)
    m = (rng.standard_normal(nb) * 0.01).astype(np.float16).view(np.uint8).reshape(nb, 2)
    return np.concatenate([d, m, qs], axis=1).reshape(-1)


@pytest.mark.parametrize("kind,ggml,deq", [("q4_0", 2, dequant_q4_0), ("q4_1", 3, dequant_q4_1), ("q8_0", 8, dequant_q8_0)])
def test_gguf_blocks_to_rows_dequantize_exactly_as_the_block_reference(kind, ggml, deq):
    rng = np.random.default_rng(ggml)
    N, K = 12, 96
    raw = random_gguf_blocks(rng, kind, N, K)
    w = Q.gguf_to_rows(raw, ggml, N, K)
    assert w.source == kind and w.shape == (N, K)
    np.testing.assert_array_equal(w.dequantize(), deq(raw).reshape(N, K))
    perm = rng.permutation(N)
    np.testing.assert_array_equal(w.take_rows(perm).dequantize(), deq(raw).reshape(N, K)[perm])
    fused = Q.stack_rows([w, w.take_rows(perm)])
    np.testing.assert_array_equal(fused.dequantize(), np.concatenate([w.dequantize(), w.dequantize()[perm]]))


def test_stack_rows_of_mixed_formats_falls_back_to_float32():
    rng = np.random.default_rng(4)
    a = Q.gguf_to_rows(random_gguf_blocks(rng, "q4_0", 4, 64), 2, 4, 64)
    b = Q.gguf_to_rows(random_gguf_blocks(rng, "q8_0", 4, 64), 8, 4, 64)
    out = Q.stack_rows([a, b])
    assert isinstance(out, np.ndarray)
    np.testing.assert_array_equal(out, np.concatenate([a.dequantize(), b.dequantize()]))


def test_smollm2_gguf_kept_quantized_equals_dequantized_at_load(smollm2):
    q = load("smollm2-135m", keep_quantized=True)
    kept = [n for n, t in q.tensors.items() if isinstance(t, Q.QuantWeight)]
    assert len(kept) == 7 * q.config.num_hidden_layers
    assert not isinstance(q.tensors["model.embed_tokens.weight"], Q.QuantWeight)  # embeddings stay dense
    for name in kept[:14] + kept[-7:]:  # both q/k (row permutation) and the MLP
        np.testing.assert_array_equal(q.tensors[name].dequantize(), smollm2.tensors[name])


# ---------------------------------------------------------------------- tiny AWQ models end to end
def last_logits(runner, ids):
    batch = build_step_batch([(ids, 0, list(range(-(-len(ids) // BS))), True)], BS)
    return runner.execute(batch)[0]


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def tiny_pair(request, tmp_path_factory):
    d = tmp_path_factory.mktemp("awq")
    src = write_tiny_model(d / "dense", request.param)
    return src, write_awq_checkpoint(src, d / "awq", group_size=32)


def test_awq_checkpoint_is_detected_and_shown(tiny_pair):
    _, awq = tiny_pair
    src = resolve(str(awq))
    assert src.quantization["group_size"] == 32
    assert src.quant_label().startswith("awq 4-bit, group 32")


def test_tiny_awq_model_runs_the_dense_math_on_its_exact_dequantized_weights(tiny_pair):
    dense_dir, awq_dir = tiny_pair
    ids = [5, 17, 42, 99, 3, 250, 7, 11]
    loaded = load(str(awq_dir))  # dequantized at load
    kept = load(str(awq_dir), keep_quantized=True)  # QuantWeight, dequantized by build_weights for the CPU
    # the dequantized weights equal the AutoAWQ formula applied to the file's tensors
    from safetensors.numpy import load_file

    raw = load_file(str(awq_dir / "model.safetensors"))
    p = "model.layers.1.mlp.down_proj"
    np.testing.assert_array_equal(loaded.tensors[p + ".weight"],
                                  autoawq_formula(raw[p + ".qweight"], raw[p + ".qzeros"], raw[p + ".scales"], 32))
    assert isinstance(kept.tensors[p + ".weight"], Q.QuantWeight)
    a = last_logits(ModelRunner(loaded, num_blocks=4), ids)
    b = last_logits(ModelRunner(kept, num_blocks=4), ids)
    np.testing.assert_array_equal(a, b)
    # the same forward as the dense model with the dequantized weights swapped in (and the rest rounded to the
    # fp16 that the AWQ file stores)
    ref = load(str(dense_dir))
    ref.tensors = {k: loaded.tensors[k] if k.endswith("proj.weight") else v.astype(np.float16).astype(np.float32)
                   for k, v in ref.tensors.items()}
    np.testing.assert_array_equal(a, last_logits(ModelRunner(ref, num_blocks=4), ids))
    # and close to the unquantized model: 4-bit round-to-nearest in groups of 32 leaves ~8% relative error per
    # weight matrix; this random 3-layer model (init std 0.2) amplifies it to ~35% on the logits
    dense = load(str(dense_dir))
    for k, v in dense.tensors.items():
        if k.endswith("proj.weight"):
            assert np.linalg.norm(loaded.tensors[k] - v) / np.linalg.norm(v) < 0.1, k
    d = last_logits(ModelRunner(dense, num_blocks=4), ids)
    rel = float(np.linalg.norm(a - d) / np.linalg.norm(d))
    assert rel < 0.6, rel


def test_other_quantization_methods_are_a_clear_error(tmp_path):
    cfg = {"model_type": "llama", "vocab_size": 10, "hidden_size": 8, "intermediate_size": 16, "num_hidden_layers": 1,
           "num_attention_heads": 2}
    for qc, words in (({"quant_method": "gptq", "bits": 4}, "gptq"),
                      ({"quant_method": "awq", "bits": 4, "version": "gemv", "group_size": 128}, "gemv"),
                      ({"quant_method": "awq", "bits": 8, "group_size": 128}, "bits 8")):
        (tmp_path / "config.json").write_text(json.dumps({**cfg, "quantization_config": qc}))
        with pytest.raises(UserError, match=words):
            resolve(str(tmp_path))


def test_synth_quant_awq_writes_a_checkpoint_that_loads_and_runs(tmp_path):
    from llmrs.bench.checkpoint import write_checkpoint

    info = write_checkpoint("smollm2-135m", tmp_path, quant="awq", group_size=64, overrides={"num_hidden_layers": 2})
    assert info["quant"] == "awq"
    cfg = json.loads((tmp_path / "config.json").read_text())
    assert cfg["quantization_config"] == {"quant_method": "awq", "bits": 4, "group_size": 64, "zero_point": True,
                                          "version": "gemm", "modules_to_not_convert": None}
    from safetensors.numpy import load_file

    t = load_file(str(tmp_path / "model.safetensors"))
    assert t["model.layers.0.mlp.down_proj.qweight"].shape == (1536, 576 // 8)
    assert t["model.layers.0.mlp.down_proj.qzeros"].shape == (1536 // 64, 576 // 8)
    assert t["model.layers.0.mlp.down_proj.scales"].shape == (1536 // 64, 576)
    assert t["model.layers.0.mlp.down_proj.qweight"].dtype == np.int32
    loaded = load(str(tmp_path), keep_quantized=True)
    w = loaded.tensors["model.layers.1.self_attn.q_proj.weight"]
    assert isinstance(w, Q.QuantWeight) and w.shape == (576, 576)
    std = float(w.dequantize().std())
    assert 0.015 < std < 0.025, std  # about the bf16 synth's 0.02
    logits = last_logits(ModelRunner(loaded, num_blocks=2), [1, 2, 3, 4, 5])
    assert logits.shape == (49152,) and np.isfinite(logits).all()
    with pytest.raises(UserError, match="group size 128"):
        write_checkpoint("smollm2-135m", tmp_path / "x", quant="awq")


def test_gpu_weight_bytes_counts_packed_4bit_weights_not_bf16(tiny_pair, monkeypatch):
    """The KV sizing on a GPU subtracts what the weights really take: ~4.25-bit packed linears (twice where the
    matvec's rows stay beside the 4-bit GEMM's copy) instead of 2 bytes a parameter."""
    from llmrs.engine.llm_engine import gpu_weight_bytes

    dense_dir, awq_dir = tiny_pair
    dense, kept = load(str(dense_dir)), load(str(awq_dir), keep_quantized=True)
    c = dense.config
    vectors = sum(t.size for t in dense.tensors.values() if t.ndim == 1)
    assert gpu_weight_bytes(dense) == 2 * (c.num_parameters() - vectors) + 4 * vectors
    from llmrs.backends.cuda.quant_linear import supported

    linear = [t for t in kept.tensors.values() if isinstance(t, Q.QuantWeight)]
    assert linear and gpu_weight_bytes(kept) == gpu_weight_bytes(dense) - sum(  # the GEMM's copy where it applies
        2 * t.N * t.K - (1 + supported(t.N, t.K, t.group_size)) * t.nbytes for t in linear)
    # where the GEMV takes one token the row form is released: one copy. By default that is every shape; under a
    # size rule (GEMV_ONE_TOKEN_MIN_WEIGHTS) where N / 32 >= 4 x the GPU's SMs, K >= 4 N, or the matrix is large
    # (every shape with GEMV_ONE_TOKEN_K_PER_N = 0)
    from types import SimpleNamespace

    import llmrs.backends.cuda.quant_linear as q4gemm
    from tests.model.test_quant_marlin import make_weight

    rng = np.random.default_rng(0)
    big, small = make_weight("awq", 256, 256, 128, rng), make_weight("awq", 128, 256, 128, rng)  # 8 / 4 tiles
    long_k = make_weight("awq", 64, 256, 128, rng)  # K = 4 N (a down projection's shape)
    model = SimpleNamespace(tensors={"a": big, "b": small, "c": long_k}, config=None)
    one_copy = big.nbytes + small.nbytes + long_k.nbytes
    assert gpu_weight_bytes(model) == 2 * one_copy  # no GPU figure: both copies
    assert gpu_weight_bytes(model, num_sms=2) == gpu_weight_bytes(model, num_sms=132) == one_copy  # the default
    monkeypatch.setattr(q4gemm, "GEMV_ONE_TOKEN_MIN_WEIGHTS", 1 << 62)  # the size rule: no matrix is large
    monkeypatch.setattr(q4gemm, "GEMV_ONE_TOKEN_K_PER_N", 0.0)
    assert gpu_weight_bytes(model, num_sms=2) == gpu_weight_bytes(model, num_sms=3) == one_copy
    monkeypatch.setattr(q4gemm, "GEMV_ONE_TOKEN_K_PER_N", 4.0)
    assert gpu_weight_bytes(model, num_sms=2) == big.nbytes + 2 * small.nbytes + long_k.nbytes
    assert gpu_weight_bytes(model, num_sms=3) == 2 * (big.nbytes + small.nbytes) + long_k.nbytes


def test_synthetic_awq_preset_resolves_to_the_preset_with_awq_quantization():
    """`llmrs serve --synthetic qwen2.5-7b-awq`: the preset's shapes, AWQ 4-bit group 128 (drawn packed on the
    GPU by the runner); a bad preset stays a clear error."""
    from llmrs.model.loader import SYNTHETIC_PREFIX, resolve
    from llmrs.model.presets import preset_config

    src = resolve(SYNTHETIC_PREFIX + "qwen2.5-7b-awq")
    assert src.kind == "synthetic" and src.config == preset_config("qwen2.5-7b")
    assert src.quantization["group_size"] == 128 and src.quant_label().startswith("awq 4-bit, group 128")
    assert resolve(SYNTHETIC_PREFIX + "qwen2.5-7b").quantization is None
    with pytest.raises(UserError):
        resolve(SYNTHETIC_PREFIX + "no-such-model-awq")


def test_gpu_kv_sizing_asks_the_device_and_subtracts_the_copies_it_keeps(tiny_pair, monkeypatch):
    """kv_blocks on a GPU (faked here: the CPU runs this): memory from the driver, the SM count for the 4-bit copies
    (gpu_weight_bytes(loaded, num_sms)), what is left after the weights and the reserve in KV blocks."""
    from types import SimpleNamespace

    import llmrs.backends.cuda.backend as cuda_backend
    import llmrs.engine.llm_engine as E

    total = 8 << 30
    fake = SimpleNamespace(cuda=SimpleNamespace(Device=lambda: SimpleNamespace(attributes={"MultiProcessorCount": 2}),
                                                runtime=SimpleNamespace(memGetInfo=lambda: (total, total))))
    monkeypatch.setattr(cuda_backend, "_import_cupy", lambda: fake)
    monkeypatch.setattr(E, "resolve_device", lambda device: "cuda")
    _, awq_dir = tiny_pair
    kept = load(str(awq_dir), keep_quantized=True)
    cfg = EngineConfig(device="cuda", gpu_memory_utilization=0.5, max_model_len=64)
    per_block = cuda_backend.CUDABackend.kv_bytes_per_block(kept.config, cfg.block_size)
    fit = int((0.5 * total - E.gpu_weight_bytes(kept, 2) - (1 << 30)) // per_block)
    assert E.kv_blocks(kept, cfg) == min(fit, E.max_kv_blocks(kept.config, cfg))
