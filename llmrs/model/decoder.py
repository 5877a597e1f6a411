"""The Llama / Qwen2 decoder, written once over a Backend.

One step of the math per line, so the reference is easy to check against the paper and transformers:

    x = embed(tokens)
    for each layer:
        h = rms_norm(x) ; q, k, v = split(h @ Wqkv + b) ; q, k = rope(q, k, positions)
        write k, v into their paged cache slots ; a = attention(q, cache, block tables)
        x = x + a @ Wo
        h = rms_norm(x) ; x = x + (silu(h @ Wgate) * (h @ Wup)) @ Wdown
    logits = rms_norm(x[sample_rows]) @ Wlm_head

The backend decides storage (float32 numpy, bf16 on the GPU) and how each op runs; q/k/v and gate/up are
stored fused so each is one matrix product.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from collections.abc import Callable
from typing import Any

import numpy as np

from llmrs.backends.base import Backend
from llmrs.engine.batch import StepBatch
from llmrs.engine.config import ModelConfig
from llmrs.errors import UserError


@dataclass(slots=True)
class LayerWeights:
    input_norm: Any
    qkv: Any  # [q_size + 2 * kv_size, hidden]
    qkv_bias: Any | None
    o: Any  # [hidden, q_size]
    post_norm: Any
    gate_up: Any  # [2 * intermediate, hidden]
    down: Any  # [hidden, intermediate]


@dataclass(slots=True)
class ModelWeights:
    embed: Any
    layers: list[LayerWeights]
    norm: Any
    lm_head: Any


def rope_inv_freq(config: ModelConfig) -> np.ndarray:
    """Inverse frequencies of the rotary embedding (float32, as transformers computes them), incl. llama3 scaling."""
    d = config.head_dim
    inv_freq = (1.0 / (config.rope_theta ** (np.arange(0, d, 2, dtype=np.int64).astype(np.float32) / d))).astype(
        np.float32
    )
    rs = config.rope_scaling
    if rs and rs.get("rope_type") == "freq_factors":  # a GGUF's rope_freqs.weight: theta_i / factor_i (llama.cpp)
        return (inv_freq / np.asarray(rs["freq_factors"], dtype=np.float32)).astype(np.float32)
    if rs and rs.get("rope_type", rs.get("type")) == "llama3":
        factor = float(rs["factor"])
        low, high = float(rs.get("low_freq_factor", 1.0)), float(rs.get("high_freq_factor", 4.0))
        old_len = float(rs.get("original_max_position_embeddings", 8192))
        low_wavelen, high_wavelen = old_len / low, old_len / high
        wavelen = 2 * math.pi / inv_freq
        scaled = np.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
        smooth = (old_len / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
        inv_freq = np.where(medium, smoothed, scaled).astype(np.float32)
    return inv_freq


def check_weights(config: ModelConfig, tensors: dict[str, np.ndarray]) -> None:
    """Every tensor the forward pass needs is present with the shape the config implies."""
    h, i, q, kv, v = (config.hidden_size, config.intermediate_size, config.q_size, config.kv_size,
                      config.vocab_size)
    expect = {"model.embed_tokens.weight": (v, h), "model.norm.weight": (h,)}
    if not config.tie_word_embeddings:
        expect["lm_head.weight"] = (v, h)
    for n in range(config.num_hidden_layers):
        p = f"model.layers.{n}."
        expect.update({
            p + "input_layernorm.weight": (h,), p + "post_attention_layernorm.weight": (h,),
            p + "self_attn.q_proj.weight": (q, h), p + "self_attn.k_proj.weight": (kv, h),
            p + "self_attn.v_proj.weight": (kv, h), p + "self_attn.o_proj.weight": (h, q),
            p + "mlp.gate_proj.weight": (i, h), p + "mlp.up_proj.weight": (i, h), p + "mlp.down_proj.weight": (h, i),
        })
        if config.attention_bias:
            expect.update({p + "self_attn.q_proj.bias": (q,), p + "self_attn.k_proj.bias": (kv,),
                           p + "self_attn.v_proj.bias": (kv,)})
    for name, shape in expect.items():
        if name not in tensors:
            raise UserError(f"checkpoint is missing tensor {name}")
        if tuple(tensors[name].shape) != shape:
            raise UserError(f"tensor {name} has shape {tuple(tensors[name].shape)}, config implies {shape}")


def build_weights(config: ModelConfig, tensors: dict[str, np.ndarray], backend: Backend) -> ModelWeights:
    """Fuse q/k/v and gate/up, hand every tensor to the backend (which converts and uploads it).

    Quantized linear weights (llmrs.model.quant.QuantWeight) go to `backend.upload_quantized` (the CPU backend
    dequantizes them, exactly, to float32; the GPU keeps them packed); embeddings and lm_head are always dense."""
    from llmrs.model.quant import QuantWeight, stack_rows

    check_weights(config, tensors)

    def up(w: Any) -> Any:
        return backend.upload_quantized(w) if isinstance(w, QuantWeight) else backend.upload(w)

    def dense(w: Any) -> Any:
        return w.dequantize() if isinstance(w, QuantWeight) else w

    def cat(parts: list[Any]) -> Any:
        return stack_rows(parts) if any(isinstance(x, QuantWeight) for x in parts) else np.concatenate(parts)

    layers = []
    for n in range(config.num_hidden_layers):
        p = f"model.layers.{n}."
        t = tensors
        qkv = cat([t[p + "self_attn.q_proj.weight"], t[p + "self_attn.k_proj.weight"],
                   t[p + "self_attn.v_proj.weight"]])
        bias = None
        if config.attention_bias:
            bias = up(np.concatenate([t[p + "self_attn.q_proj.bias"], t[p + "self_attn.k_proj.bias"],
                                      t[p + "self_attn.v_proj.bias"]]))
        gate_up = cat([t[p + "mlp.gate_proj.weight"], t[p + "mlp.up_proj.weight"]])
        layers.append(LayerWeights(
            input_norm=up(t[p + "input_layernorm.weight"]), qkv=up(qkv), qkv_bias=bias,
            o=up(t[p + "self_attn.o_proj.weight"]), post_norm=up(t[p + "post_attention_layernorm.weight"]),
            gate_up=up(gate_up), down=up(t[p + "mlp.down_proj.weight"]),
        ))
    embed = up(dense(tensors["model.embed_tokens.weight"]))
    lm_head = embed if config.tie_word_embeddings else up(dense(tensors["lm_head.weight"]))
    return ModelWeights(embed=embed, layers=layers, norm=up(tensors["model.norm.weight"]), lm_head=lm_head)


class Model:
    """The decoder over a backend: forward(StepBatch) -> logits of the sampled rows [S, vocab]."""

    def __init__(self, config: ModelConfig, weights: ModelWeights, backend: Backend):
        self.config = config
        self.w = weights
        self.backend = backend

    def forward(self, batch: StepBatch) -> np.ndarray:
        B, w = self.backend, self.w
        x = self.decoder_layers(B.embedding(w.embed, batch.token_ids), batch)
        x = B.gather_rows(x, batch.sample_rows)
        x = B.rms_norm(x, w.norm, self.config.rms_norm_eps)
        return B.to_host(B.linear(x, w.lm_head))

    def decoder_layers(self, x: Any, batch: StepBatch, reduce: Callable[[Any], Any] = lambda t: t) -> Any:
        """Every decoder layer over the residual stream `x`. `reduce` sums the o_proj and down_proj outputs
        across tensor-parallel ranks (their rows are sharded); one device needs nothing."""
        c, B = self.config, self.backend
        eps = c.rms_norm_eps
        for n, layer in enumerate(self.w.layers):
            h = B.rms_norm(x, layer.input_norm, eps)
            qkv = B.linear(h, layer.qkv, layer.qkv_bias)
            q, k, v = qkv[:, : c.q_size], qkv[:, c.q_size : c.q_size + c.kv_size], qkv[:, c.q_size + c.kv_size :]
            q, k = B.rope(q, k, batch.positions)
            B.write_kv(n, k, v, batch.slot_mapping)
            a = B.attention(n, q, batch)
            x = B.add(x, reduce(B.linear(a, layer.o)))
            h = B.rms_norm(x, layer.post_norm, eps)
            x = B.add(x, reduce(B.linear(B.silu_mul(B.linear(h, layer.gate_up)), layer.down)))
        return x
