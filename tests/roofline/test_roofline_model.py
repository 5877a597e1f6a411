"""Presets, formats, and model sources (HF directory, real GGUF files) of the cost model."""

import json

import numpy as np
import pytest

from llmrs.errors import UserError
from llmrs.roofline.cost import ModelCost
from llmrs.roofline.formats import FORMATS, get_format
from llmrs.roofline.model_source import build_cost, resolve_model
from llmrs.model.presets import PRESETS, preset_config, preset_repo

# exact parameter counts of the published checkpoints
KNOWN_PARAMS = {
    "qwen2.5-0.5b": 494_032_768, "qwen2.5-1.5b": 1_543_714_304, "qwen2.5-3b": 3_085_938_688,
    "qwen2.5-7b": 7_615_616_512, "qwen2.5-14b": 14_770_033_664, "qwen2.5-32b": 32_763_876_352,
    "qwen2.5-72b": 72_706_203_648, "llama-3.1-8b": 8_030_261_248, "llama-3.1-70b": 70_553_706_496,
    "smollm2-135m": 134_515_008,
}


@pytest.mark.parametrize("name", sorted(KNOWN_PARAMS))
def test_preset_parameter_count_matches_the_published_checkpoint(name):
    cfg = preset_config(name)
    assert cfg.num_parameters() == KNOWN_PARAMS[name]
    assert build_cost(resolve_model(name)).num_parameters == KNOWN_PARAMS[name]


def test_presets_cover_the_issue_list_and_name_their_repo():
    assert set(PRESETS) == set(KNOWN_PARAMS)
    assert preset_repo("qwen2.5-7b") == "Qwen/Qwen2.5-7B-Instruct"
    assert preset_config("Qwen/Qwen2.5-7B-Instruct").hidden_size == 3584
    assert preset_config("llama-3.1-8b").rope_scaling["rope_type"] == "llama3"


def test_preset_config_returns_independent_copies():
    a = preset_config("qwen2.5-7b")
    a.eos_token_ids.append(1)
    assert preset_config("qwen2.5-7b").eos_token_ids == [151645, 151643]


def test_unknown_preset_is_a_user_error():
    with pytest.raises(UserError, match="unknown model"):
        resolve_model("gpt-5")


@pytest.mark.parametrize("fmt,bits", [("bf16", 16), ("awq", 4.25), ("q4_0", 4.5), ("q4_1", 5), ("q8_0", 8.5),
                                      ("q4_f32", 6)])
def test_bits_per_weight_include_the_group_overhead(fmt, bits):
    assert get_format(fmt).bits_per_weight == bits


def test_awq_keeps_the_output_layer_in_bf16_and_q4_does_not():
    assert build_cost(resolve_model("qwen2.5-7b"), "awq").lm_head_format == "bf16"
    assert build_cost(resolve_model("qwen2.5-7b"), "q4_1").lm_head_format == "q4_1"
    assert build_cost(resolve_model("qwen2.5-7b"), "awq", head_fmt="q8_0").lm_head_format == "q8_0"
    with pytest.raises(UserError):
        get_format("q3_xx")
    assert "awq" in FORMATS


def test_attention_flops_grow_with_context():
    cost = build_cost(resolve_model("qwen2.5-7b"))
    assert cost.attention_flops(400) == 4 * 28 * 3584 * 400
    assert cost.flops_per_token(400) - cost.flops_per_token(0) == cost.attention_flops(400)
    assert cost.flops_per_token(0) == 2 * (cost.matmul_params + cost.lm_head_params)


def test_hf_directory_with_awq_quantization_config(tmp_path):
    cfg = {"model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"], "vocab_size": 152064, "hidden_size": 3584,
           "intermediate_size": 18944, "num_hidden_layers": 28, "num_attention_heads": 28, "num_key_value_heads": 4,
           "torch_dtype": "float16", "quantization_config": {"quant_method": "awq", "bits": 4, "group_size": 128}}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    src = resolve_model(str(tmp_path))
    assert src.default_format == "awq"
    assert build_cost(src).decode_step(1, 0).weight_bytes == pytest.approx(
        build_cost(resolve_model("qwen2.5-7b"), "awq").streamed_bytes)


def test_gguf_file_uses_its_real_tensor_types(tmp_path):
    gguf = pytest.importorskip("gguf")
    h, inter, layers, vocab = 64, 128, 2, 96
    path = tmp_path / "tiny.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(layers)
    w.add_embedding_length(h)
    w.add_feed_forward_length(inter)
    w.add_head_count(4)
    w.add_head_count_kv(2)
    w.add_context_length(256)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_token_list([f"t{i}" for i in range(vocab)])
    rng = np.random.default_rng(0)

    def q8(name, shape):
        data = rng.standard_normal(shape).astype(np.float32)
        w.add_tensor(name, gguf.quants.quantize(data, gguf.GGMLQuantizationType.Q8_0),
                     raw_dtype=gguf.GGMLQuantizationType.Q8_0)

    w.add_tensor("token_embd.weight", rng.standard_normal((vocab, h)).astype(np.float16))
    w.add_tensor("output_norm.weight", np.ones(h, dtype=np.float32))
    for i in range(layers):
        for n, shape in [("attn_q", (h, h)), ("attn_k", (32, h)), ("attn_v", (32, h)), ("attn_output", (h, h)),
                         ("ffn_gate", (inter, h)), ("ffn_up", (inter, h)), ("ffn_down", (h, inter))]:
            q8(f"blk.{i}.{n}.weight", shape)
        w.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(h, dtype=np.float32))
        w.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(h, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()

    src = resolve_model(str(path))
    assert src.config.tie_word_embeddings  # no output.weight
    assert src.default_format == "q8_0"
    cost = build_cost(src)
    assert cost.component("attention").bits == pytest.approx(8.5)
    assert cost.component("norms").bits == 32
    assert cost.component("embedding = lm_head").bits == 16
    assert isinstance(cost, ModelCost)
    assert cost.num_parameters == src.config.num_parameters()
    # an explicit --format replaces the file's real bits with the nominal ones
    assert build_cost(src, "bf16").component("attention").bits == 16
