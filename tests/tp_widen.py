"""Write a model with its heads widened for tensor parallelism (llmrs.engine.tp.widen_heads) as a Hugging
Face-style directory: the GPU machine's server suite at TP=2 runs on SmolLM2 this way (its 3 KV heads do not
divide by 2), so the suite sees a real model's peaked distributions, not a random one's near ties.

    python -m tests.tp_widen smollm2-135m /tmp/smollm2-tp2 --tp 2
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def write_widened(spec: str, out: Path, n: int) -> Path:
    from safetensors.numpy import save_file

    from llmrs.model.loader import load
    from llmrs.engine.tp import widen_heads

    m = load(spec, keep_quantized=False)
    c, tensors = widen_heads(m.config, m.tensors, n)
    out.mkdir(parents=True, exist_ok=True)
    save_file({k: v.astype("float32") for k, v in tensors.items()}, str(out / "model.safetensors"))
    cfg = {"architectures": ["LlamaForCausalLM" if c.model_type == "llama" else "Qwen2ForCausalLM"],
           "model_type": c.model_type, "vocab_size": c.vocab_size, "hidden_size": c.hidden_size,
           "intermediate_size": c.intermediate_size, "num_hidden_layers": c.num_hidden_layers,
           "num_attention_heads": c.num_attention_heads, "num_key_value_heads": c.num_key_value_heads,
           "head_dim": c.head_dim, "rms_norm_eps": c.rms_norm_eps, "rope_theta": c.rope_theta,
           "rope_scaling": c.rope_scaling, "max_position_embeddings": c.max_position_embeddings,
           "tie_word_embeddings": c.tie_word_embeddings, "attention_bias": c.attention_bias,
           "bos_token_id": c.bos_token_id, "eos_token_id": c.eos_token_ids, "torch_dtype": "float32"}
    (out / "config.json").write_text(json.dumps(cfg, indent=1))
    tok = m.tokenizer
    tok.tk.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps({
        "bos_token": tok.bos_token, "eos_token": tok.eos_token, "chat_template": tok.chat_template,
        **tok.special_tokens, "tokenizer_class": "PreTrainedTokenizerFast"}))
    return out


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("out", type=Path)
    ap.add_argument("--tp", type=int, default=2)
    a = ap.parse_args()
    print(write_widened(a.model, a.out, a.tp))
