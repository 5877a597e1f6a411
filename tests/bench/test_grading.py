"""A bench run graded against the roofline (llmrs.bench.grading), checked against figures worked out by hand."""

import pytest

from llmrs.bench.grading import grade, match_preset, run_shape
from llmrs.bench.records import RequestResult
from llmrs.roofline.gpus import get_gpu
from llmrs.roofline.model_source import build_cost, resolve_model


def _run() -> list[RequestResult]:
    """4 completed requests of 100 prompt tokens and 51 output tokens, first token at 0.1 s, done at 1.1 s (a
    second of decode each), and one failed request (no known work: left out)."""
    ok = [RequestResult(idx=i, success=True, start=0.0, end=1.1, ttft=0.1, latency=1.1, chunks=51,
                        prompt_tokens=100, output_tokens=51) for i in range(4)]
    return ok + [RequestResult(idx=4, success=False, error="HTTP 500", start=0.0, end=0.5, input_len=100)]


def test_the_run_shape_is_littles_law_over_the_decode_intervals():
    s = run_shape(_run(), duration_s=2.0)
    assert s.completed == 4 and s.input_tokens == 400 and s.output_tokens == 204
    assert s.mean_decode_batch == pytest.approx(4 * 1.0 / 2.0)  # 4 s of decode over a 2 s run
    assert s.mean_context == pytest.approx(100 + 51 / 2)  # halfway through each request's output
    assert s.mean_tpot_s == pytest.approx(1.0 / 50)


def test_qwen_0_5b_on_an_h100_by_hand():
    """qwen2.5-0.5b, bf16 (hidden 896, 24 layers, 14 query heads and 2 KV heads of 64, MLP 4864, tied 151,936-row
    embedding) on an H100 SXM's 3,350 GB/s:
    streamed parameters = 24*(896*(896+2*128) + 896*896) [q,k,v,o] + 24*3*896*4864 [mlp] + 49*896 [norms]
    + 24*(896+2*128) [qkv bias] + 151936*896 [embedding = lm_head] = 494,032,768 -> 988,065,536 bytes at bf16;
    KV per token = 2*24*2*64*2 = 12,288 bytes. Mean batch 2, context round(125.5) = 126: per sequence 126*12,288
    (KV read) + 12,288 (KV write) + 896*2 (embedding row) = 1,562,368 bytes; a step reads 988,065,536 +
    2*1,562,368 = 991,190,272 bytes -> 0.295878 ms at 3.35 TB/s (memory-bound: ~2 GFLOP a step against
    ~990 TFLOP/s). Ideal at batch 2: 2 / 0.295878 ms = 6,759.5 tok/s; the run made 204 / 2 s = 102 tok/s.
    MBU: 991,190,272 bytes per 20 ms TPOT = 49.56 GB/s, 1.479% of 3,350 GB/s."""
    cost = build_cost(resolve_model("qwen2.5-0.5b"))
    g = grade(run_shape(_run(), duration_s=2.0), cost, get_gpu("h100-sxm", with_measured=False),
              model_label="qwen2.5-0.5b", model_source="preset")
    assert g["graded"] and g["gpu"] == "h100-sxm" and g["ceilings"] == "datasheet" and g["bandwidth_gbs"] == 3350
    assert g["decode_step_bytes"] == pytest.approx(991_190_272)
    assert g["decode_bound"] == "memory"
    assert g["decode_floor_ms"] == pytest.approx(0.295878, rel=1e-5)
    assert g["ideal_output_tok_s"] == pytest.approx(6759.5, rel=1e-4)
    assert g["output_tok_s"] == pytest.approx(102.0)
    assert g["fraction_of_ideal"] == pytest.approx(102.0 / 6759.5, rel=1e-4)
    assert g["mbu"] == pytest.approx(0.014794, rel=1e-4)
    # prefill: 4 prompts of 100 tokens: 2*357,826,560 per token [projections] + causal attention 4*24*896 per
    # (query, key) pair over 100*101/2 pairs + one 2*136,134,656 logits row each
    prefill = 4 * (100 * 2 * 357_826_560 + 4 * 24 * 896 * 5050 + 2 * 136_134_656)
    assert g["prefill_flops"] == pytest.approx(prefill)
    peak = get_gpu("h100-sxm", with_measured=False).peak_flops("bf16")
    assert g["mfu_prefill"] == pytest.approx(prefill / 2.0 / peak)
    assert g["mfu"] > g["mfu_prefill"]


def test_measured_ceilings_are_used_when_asked_and_stored():
    gpu = get_gpu("h100-sxm", with_measured=False)
    gpu.measured_bandwidth_gbs, gpu.measured_bf16_tflops = 2939.2, 700.0
    cost = build_cost(resolve_model("qwen2.5-0.5b"))
    shape = run_shape(_run(), duration_s=2.0)
    g = grade(shape, cost, gpu, measured=True)
    assert g["ceilings"] == "measured" and g["bandwidth_gbs"] == pytest.approx(2939.2)
    assert g["decode_floor_ms"] == pytest.approx(991_190_272 / 2939.2e9 * 1e3, rel=1e-6)
    assert grade(shape, cost, gpu)["bandwidth_gbs"] == 3350


def test_a_run_with_nothing_completed_is_not_graded():
    g = grade(run_shape(_run()[4:], duration_s=1.0), build_cost(resolve_model("qwen2.5-0.5b")),
              get_gpu("h200", with_measured=False))
    assert g["graded"] is False and "no request completed" in g["why"]


@pytest.mark.parametrize("model_id, expected", [
    ("Qwen/Qwen2.5-7B-Instruct", ("qwen2.5-7b", None)),
    ("synthetic:qwen2.5-7b", ("qwen2.5-7b", None)),
    ("synthetic:qwen2.5-7b-awq", ("qwen2.5-7b", "awq")),
    ("Qwen/Qwen2.5-1.5B-Instruct-AWQ", ("qwen2.5-1.5b", "awq")),
    ("meta-llama/Llama-3.1-8B-Instruct", ("llama-3.1-8b", None)),
    ("qwen2.5-14b", ("qwen2.5-14b", None)),
    ("gpt2", None),
    ("qwen2.5-7bx", None),
])
def test_served_model_ids_are_matched_to_presets(model_id, expected):
    assert match_preset(model_id) == expected
