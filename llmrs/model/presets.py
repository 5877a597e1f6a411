"""Exact shapes of the models llmrs is benchmarked on, so no download is needed to reason about them.

`preset_config("qwen2.5-7b")` returns the `ModelConfig` that the model's own config.json gives. Used by the engine
(`synthetic:PRESET` models), `llmrs roofline --model qwen2.5-7b` and `llmrs synth` (random weights with a real
model's shapes).
Values are copied from each model's Hugging Face config.json (the -Instruct variants' token ids).
"""

from __future__ import annotations

from typing import Any

from llmrs.engine.config import ModelConfig
from llmrs.errors import UserError

_QWEN = dict(model_type="qwen2", attention_bias=True, rms_norm_eps=1e-6, rope_theta=1_000_000.0,
             max_position_embeddings=32768, bos_token_id=151643, eos_token_ids=[151645, 151643])
_LLAMA31 = dict(model_type="llama", attention_bias=False, rms_norm_eps=1e-5, rope_theta=500_000.0,
                max_position_embeddings=131072, bos_token_id=128000, eos_token_ids=[128001, 128008, 128009],
                rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                              "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
                vocab_size=128256, tie_word_embeddings=False, head_dim=128)

# name -> (Hugging Face repo, ModelConfig fields)
PRESETS: dict[str, tuple[str, dict[str, Any]]] = {
    "qwen2.5-0.5b": ("Qwen/Qwen2.5-0.5B-Instruct", dict(
        _QWEN, vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
        num_attention_heads=14, num_key_value_heads=2, head_dim=64, tie_word_embeddings=True)),
    "qwen2.5-1.5b": ("Qwen/Qwen2.5-1.5B-Instruct", dict(
        _QWEN, vocab_size=151936, hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
        num_attention_heads=12, num_key_value_heads=2, head_dim=128, tie_word_embeddings=True)),
    "qwen2.5-3b": ("Qwen/Qwen2.5-3B-Instruct", dict(
        _QWEN, vocab_size=151936, hidden_size=2048, intermediate_size=11008, num_hidden_layers=36,
        num_attention_heads=16, num_key_value_heads=2, head_dim=128, tie_word_embeddings=True)),
    "qwen2.5-7b": ("Qwen/Qwen2.5-7B-Instruct", dict(
        _QWEN, vocab_size=152064, hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
        num_attention_heads=28, num_key_value_heads=4, head_dim=128, tie_word_embeddings=False)),
    "qwen2.5-14b": ("Qwen/Qwen2.5-14B-Instruct", dict(
        _QWEN, vocab_size=152064, hidden_size=5120, intermediate_size=13824, num_hidden_layers=48,
        num_attention_heads=40, num_key_value_heads=8, head_dim=128, tie_word_embeddings=False)),
    "qwen2.5-32b": ("Qwen/Qwen2.5-32B-Instruct", dict(
        _QWEN, vocab_size=152064, hidden_size=5120, intermediate_size=27648, num_hidden_layers=64,
        num_attention_heads=40, num_key_value_heads=8, head_dim=128, tie_word_embeddings=False)),
    "qwen2.5-72b": ("Qwen/Qwen2.5-72B-Instruct", dict(
        _QWEN, vocab_size=152064, hidden_size=8192, intermediate_size=29568, num_hidden_layers=80,
        num_attention_heads=64, num_key_value_heads=8, head_dim=128, tie_word_embeddings=False)),
    "llama-3.1-8b": ("meta-llama/Llama-3.1-8B-Instruct", dict(
        _LLAMA31, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
        num_attention_heads=32, num_key_value_heads=8)),
    "llama-3.1-70b": ("meta-llama/Llama-3.1-70B-Instruct", dict(
        _LLAMA31, hidden_size=8192, intermediate_size=28672, num_hidden_layers=80,
        num_attention_heads=64, num_key_value_heads=8)),
    "smollm2-135m": ("HuggingFaceTB/SmolLM2-135M-Instruct", dict(
        model_type="llama", vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
        num_attention_heads=9, num_key_value_heads=3, head_dim=64, tie_word_embeddings=True,
        attention_bias=False, rms_norm_eps=1e-5, rope_theta=100_000.0, max_position_embeddings=8192,
        bos_token_id=1, eos_token_ids=[2])),
}


def preset_names() -> list[str]:
    return list(PRESETS)


def preset_repo(name: str) -> str:
    """The Hugging Face repo a preset's shapes come from."""
    return PRESETS[_canonical(name)][0]


def preset_config(name: str) -> ModelConfig:
    """A fresh ModelConfig with the preset's exact shapes; UserError for an unknown name."""
    fields = PRESETS[_canonical(name)][1]
    return ModelConfig(**{k: (list(v) if isinstance(v, list) else dict(v) if isinstance(v, dict) else v)
                          for k, v in fields.items()})


def _canonical(name: str) -> str:
    key = name.strip().lower().replace("_", "-")
    key = key.removesuffix("-instruct")
    for prefix in ("qwen/", "meta-llama/", "huggingfacetb/"):
        key = key.removeprefix(prefix)
    if key not in PRESETS:
        raise UserError(f"unknown model preset {name!r}; presets: {', '.join(PRESETS)}")
    return key
