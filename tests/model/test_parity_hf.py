"""The numpy reference against Hugging Face transformers: last-token logits within 1e-3, greedy tokens equal."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from llmrs.engine.batch import build_step_batch
from llmrs.model.loader import load
from llmrs.engine.runner import ModelRunner, stream_generate
from llmrs.engine.sampling import SamplingParams

N_NEW = 32


def hf_last_logits(model, ids: list[int]) -> np.ndarray:
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0, -1].float().numpy()


def hf_greedy(model, ids: list[int], n: int = N_NEW) -> list[int]:
    """Plain argmax loop over transformers' KV cache (generate() would mask EOS under min_new_tokens)."""
    out, past, inp = [], None, torch.tensor([ids])
    with torch.no_grad():
        for _ in range(n):
            res = model(inp, past_key_values=past, use_cache=True)
            past = res.past_key_values
            tok = int(res.logits[0, -1].argmax())
            out.append(tok)
            inp = torch.tensor([[tok]])
    return out


def ours_greedy(runner: ModelRunner, ids: list[int], n: int = N_NEW) -> list[int]:
    params = SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)
    return [o.token_ids[0] for o in stream_generate(runner, ids, params)]


def ours_last_logits(runner: ModelRunner, ids: list[int]) -> np.ndarray:
    batch = build_step_batch([(ids, 0, list(range(-(-len(ids) // 16))), True)], 16)
    return runner.execute(batch)[0]


def check_parity(runner, hf_model, prompts_ids):
    for ids in prompts_ids:
        ours, ref = ours_last_logits(runner, ids), hf_last_logits(hf_model, ids)
        err = float(np.abs(ours - ref).max())
        assert err < 1e-3, f"max abs logit error {err} for prompt {ids[:8]}..."
        assert ours_greedy(runner, ids) == hf_greedy(hf_model, ids)


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_tiny_random_model_matches_transformers(arch, tiny_llama, tiny_qwen2):
    from transformers import AutoModelForCausalLM

    path = tiny_llama if arch == "llama" else tiny_qwen2
    loaded = load(str(path))
    assert loaded.config.model_type == arch
    assert loaded.config.attention_bias == (arch == "qwen2")
    assert loaded.config.tie_word_embeddings == (arch == "llama")
    if arch == "llama":
        assert loaded.config.rope_scaling["rope_type"] == "llama3"
    runner = ModelRunner(loaded, num_blocks=32)
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    tok = loaded.tokenizer
    prompts = [tok.encode(t) for t in ("Hello world!", "The quick brown fox jumps over the lazy dog. " * 3, "🙂")]
    prompts.append(tok.encode_chat([{"role": "user", "content": "Paged attention?"}]))
    # long enough for llama3 rope scaling to matter (positions beyond original_max_position_embeddings=64)
    prompts.append(tok.encode("Unicode: café, naïve, Zürich. " * 8))
    assert len(prompts[-1]) > 64
    check_parity(runner, hf, prompts)


@pytest.fixture(scope="module")
def hf_smollm2(smollm2_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    d, f = str(smollm2_path.parent), smollm2_path.name
    model = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(d, gguf_file=f)
    return model, tok


@pytest.mark.slow
def test_smollm2_gguf_matches_transformers(smollm2, hf_smollm2):
    hf_model, hf_tok = hf_smollm2
    runner = ModelRunner(smollm2, num_blocks=64)
    tok = smollm2.tokenizer
    raw = ["The capital of France is", "def fibonacci(n):", "Once upon a time, in a small village,"]
    chats = [
        [{"role": "user", "content": "What is the tallest mountain in the world?"}],
        [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Name three colors."},
         {"role": "assistant", "content": "Red, green, blue."}, {"role": "user", "content": "Two more?"}],
    ]
    prompts = [tok.encode(t) for t in raw] + [tok.encode_chat(c) for c in chats]
    # the prompts we feed are exactly transformers' own encodings
    for t, ids in zip(raw, prompts):
        assert ids == hf_tok(t)["input_ids"]
    for c, ids in zip(chats, prompts[len(raw):]):
        assert ids == hf_tok.apply_chat_template(c, add_generation_prompt=True, tokenize=True, return_dict=False)
    check_parity(runner, hf_model, prompts)
