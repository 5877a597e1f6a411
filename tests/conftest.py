"""Shared fixtures: tiny real checkpoints written by the tests, and the embedded SmolLM2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

CHAT_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
CORPUS = [
    "The quick brown fox jumps over the lazy dog. Hello world! Numbers 12345 and symbols #@%.",
    "Paged attention stores keys and values in fixed-size blocks; continuous batching keeps the GPU busy.",
    "Unicode: café, naïve, Zürich, 東京, Привет, emoji 🙂🚀 and more text for the byte-level tokenizer.",
] * 20


def write_tiny_tokenizer(out: Path) -> None:
    """A byte-level BPE trained on a small corpus, saved as tokenizer.json + tokenizer_config.json."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    tk.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tk.train_from_iterator(CORPUS, trainer)
    tk.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps({
        "bos_token": "<|endoftext|>", "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
        "chat_template": CHAT_TEMPLATE, "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": 256,
    }))


def write_tiny_model(out: Path, arch: str, seed: int = 0, **overrides) -> Path:
    """Random tiny Llama or Qwen2 checkpoint saved by transformers itself (safetensors + config.json)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    out.mkdir(parents=True, exist_ok=True)
    write_tiny_tokenizer(out)
    common = dict(
        vocab_size=400, hidden_size=64, intermediate_size=160, num_hidden_layers=3, num_attention_heads=8,
        num_key_value_heads=2, max_position_embeddings=256, rms_norm_eps=1e-6, initializer_range=0.2,
        bos_token_id=0, eos_token_id=2,
    )
    if arch == "llama":
        common.update(rope_theta=50000.0, tie_word_embeddings=True,
                      rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                    "high_freq_factor": 4.0, "original_max_position_embeddings": 64})
        common.update(overrides)
        cfg, cls = LlamaConfig(**common), LlamaForCausalLM
    else:
        common.update(rope_theta=1000000.0, tie_word_embeddings=False)
        common.update(overrides)
        cfg, cls = Qwen2Config(**common), Qwen2ForCausalLM
    torch.manual_seed(seed)
    model = cls(cfg).to(torch.float32)
    with torch.no_grad():  # random norms and biases too, so every weight matters
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
            elif name.endswith("bias"):
                p.copy_(0.1 * torch.randn_like(p))
    model.save_pretrained(out, safe_serialization=True)
    (out / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 1]}))
    return out


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("tiny") / "llama", "llama")


@pytest.fixture(scope="session")
def tiny_qwen2(tmp_path_factory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("tiny") / "qwen2", "qwen2")


@pytest.fixture(scope="session")
def smollm2_path() -> Path:
    from llmrs.model.loader import embedded_model_path

    return embedded_model_path("smollm2-135m")


@pytest.fixture(scope="session")
def smollm2():
    """The embedded model, loaded once for the session (LoadedModel)."""
    from llmrs.model.loader import load

    return load("smollm2-135m")
