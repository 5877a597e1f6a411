"""The fused step's dispatch without a GPU, through tools/bench_host_prefill.py's fake backend (CuPy arrays as
metadata, launches and cuBLAS calls counted): what a one-token decode and a 256-token prefill of the Qwen2.5-7B
shape launch, layer by layer, as the backend's rules say (the script stays runnable: it broke once silently when
the backend gained attributes)."""

from llmrs.engine.batch import build_step_batch
from llmrs.model.presets import preset_config
from tools import bench_host_prefill as bhp


def step(preset: str, T: int):
    c = preset_config(preset)
    be, w = bhp.fake_backend(c), bhp.fake_weights(c)
    batch = build_step_batch([(list(range(3, 3 + T)), 0, list(range(-(-T // 16))), True)], 16)
    be._forward_device(w, be.device_batch(batch))
    calls = {n: f.calls for n, f in be.k.fns.items() if f.calls}
    return c.num_hidden_layers, calls, be.gemm_calls[0]


def test_one_token_runs_the_matvecs_and_the_cluster_attention():
    L, calls, gemms = step("qwen2.5-7b", 1)
    assert gemms == 0  # every projection and the lm_head on the matvec
    assert calls["matvec_rope_bf16_t1"] == L and calls["matvec_silu_bf16_t1"] == L  # paired epilogues
    assert calls["matvec_bf16_t1"] == 2 * L + 1  # o, down, lm_head
    assert calls["rms_norm"] == 2 * L + 1  # the 7B does not fold its norms (NORM_FOLD_MAX_K); + the final one
    assert sum(v for n, v in calls.items() if n.startswith("attn_cluster")) == L
    assert calls["embedding_gather"] == 1


def test_one_token_on_the_1_5b_runs_attention_and_o_as_one_kernel():
    L, calls, gemms = step("qwen2.5-1.5b", 1)
    assert gemms == 0
    assert calls["attn_o_cluster8"] == L  # 12 heads x 8 splits, 192 of o's 1536 rows a split
    assert not any(n.startswith("attn_cluster") for n in calls)
    assert calls["matvec_bf16_t1"] == L + 1  # down, lm_head: no o matvec
    assert calls["matvec_rope_norm_bf16_t1"] == L and calls["matvec_silu_norm_bf16_t1"] == L


def test_a_256_token_prefill_runs_cublas_and_the_tensor_core_attention():
    L, calls, gemms = step("qwen2.5-7b", 256)
    assert gemms == 4 * L  # qkv, o, gate_up, down (the lm_head of the one sampled row: the matvec)
    assert sum(v for n, v in calls.items() if n.startswith("prefill_attn")) == L
    assert calls["rope_write_kv"] == L and calls["silu_mul_bf16_bf16"] == L  # gate/up bf16 out, SiLU bf16 to bf16
    assert calls["rms_norm_bf16"] == 2 * L  # the GEMMs' bf16 inputs
    assert not any(n.startswith("matvec_rope") or n.startswith("attn_cluster") for n in calls)


def test_a_small_model_folds_its_norms_into_the_paired_matvecs():
    L, calls, _ = step("qwen2.5-0.5b", 1)
    assert calls["matvec_rope_norm_bf16_t1"] == L and calls["matvec_silu_norm_bf16_t1"] == L
    assert calls.get("rms_norm", 0) == 1  # the final norm only
