"""The model cost model: parameters by component, bytes and FLOPs of a decode step and of a prefill load.

Decode streams every weight matrix once per step (shared by all sequences of the batch) and re-reads each
sequence's KV cache; it gathers only one embedding row per token, so the embedding table is NOT streamed
(unless it is tied to the output layer, which is streamed). FLOPs are 2 per weight per token for the
projections and the output layer, plus attention: QK^T and PV are 2 * 2 * num_heads * head_dim FLOPs per
token of context, per layer.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from llmrs.engine.config import ModelConfig
from llmrs.roofline.formats import WeightFormat, lm_head_format

# component roles: streamed = read whole every step; gathered = one row per token
STREAMED, GATHERED = "streamed", "gathered"


@dataclass(slots=True)
class Component:
    """One group of weights: how many parameters, at how many bits, and how a decode step touches it."""

    name: str
    params: int
    bits: float
    role: str

    @property
    def bytes(self) -> float:
        return self.params * self.bits / 8


@dataclass(slots=True)
class StepCost:
    """Bytes and FLOPs of one engine step, split so a table can say where the bytes come from."""

    weight_bytes: float
    kv_read_bytes: float
    kv_write_bytes: float
    gather_bytes: float
    flops: float

    @property
    def bytes(self) -> float:
        return self.weight_bytes + self.kv_read_bytes + self.kv_write_bytes + self.gather_bytes

    @property
    def intensity(self) -> float:
        return self.flops / self.bytes if self.bytes else math.inf


@dataclass(slots=True)
class ModelCost:
    """Costs of one model in one weight format. Build it with `ModelCost.build`."""

    config: ModelConfig
    weight_format: str
    lm_head_format: str
    compute_dtype: str
    components: list[Component] = field(default_factory=list)
    kv_dtype_bytes: float = 2.0

    @classmethod
    def build(cls, config: ModelConfig, fmt: WeightFormat, head: WeightFormat | None = None,
              kv_dtype_bytes: float = 2.0, bits_override: dict[str, float] | None = None,
              compute_dtype: str | None = None) -> "ModelCost":
        """Components of a Llama/Qwen2 checkpoint. `bits_override` (component -> bits) comes from a real
        file (GGUF tensor types) when there is one. The embedding table is stored like the output layer."""
        c = config
        head = head or lm_head_format(fmt)
        h, v, L = c.hidden_size, c.vocab_size, c.num_hidden_layers
        comps = [
            Component("attention q,k,v,o", L * (h * (c.q_size + 2 * c.kv_size) + c.q_size * h), fmt.bits_per_weight,
                      STREAMED),
            Component("mlp gate,up,down", L * 3 * h * c.intermediate_size, fmt.bits_per_weight, STREAMED),
            Component("norms", (2 * L + 1) * h, 16, STREAMED),
        ]
        if c.attention_bias:
            comps.append(Component("qkv bias", L * (c.q_size + 2 * c.kv_size), 16, STREAMED))
        if c.tie_word_embeddings:
            comps.append(Component("embedding = lm_head (tied)", v * h, head.bits_per_weight, STREAMED))
        else:
            comps.append(Component("embedding", v * h, head.bits_per_weight, GATHERED))
            comps.append(Component("lm_head", v * h, head.bits_per_weight, STREAMED))
        for comp in comps:
            if bits_override and comp.name in bits_override:
                comp.bits = bits_override[comp.name]
        return cls(config=c, weight_format=fmt.name, lm_head_format=head.name,
                   compute_dtype=compute_dtype or fmt.compute_dtype, components=comps,
                   kv_dtype_bytes=kv_dtype_bytes)

    # ------------------------------------------------------------------ sizes
    @property
    def num_parameters(self) -> int:
        return sum(c.params for c in self.components)

    def component(self, prefix: str) -> Component:
        return next(c for c in self.components if c.name.startswith(prefix))

    @property
    def checkpoint_bytes(self) -> float:
        """Bytes of every weight of the checkpoint (tied tensors counted once)."""
        return sum(c.bytes for c in self.components)

    @property
    def streamed_bytes(self) -> float:
        """Bytes a decode step must stream whatever the batch: every weight but the gathered embedding."""
        return sum(c.bytes for c in self.components if c.role == STREAMED)

    @property
    def matmul_params(self) -> int:
        """Parameters of the per-layer projections (2 FLOPs each per token)."""
        return self.component("attention").params + self.component("mlp").params

    @property
    def lm_head_params(self) -> int:
        return self.config.vocab_size * self.config.hidden_size

    @property
    def embed_row_bytes(self) -> float:
        emb = next(c for c in self.components if c.name.startswith("embedding"))
        return self.config.hidden_size * emb.bits / 8

    @property
    def kv_bytes_per_token(self) -> float:
        """K and V of every layer for one token: 2 * layers * kv_heads * head_dim * dtype bytes."""
        c = self.config
        return 2 * c.num_hidden_layers * c.num_key_value_heads * c.head_dim * self.kv_dtype_bytes

    # ------------------------------------------------------------------ FLOPs
    def attention_flops(self, context: int) -> float:
        """FLOPs of one query token attending to `context` tokens: QK^T + PV over all layers and heads."""
        c = self.config
        return 4.0 * c.num_hidden_layers * c.q_size * context

    def flops_per_token(self, context: int, logits: bool = True) -> float:
        """FLOPs to compute one token: projections, attention over `context` tokens, and the logits row."""
        f = 2.0 * self.matmul_params + self.attention_flops(context)
        return f + (2.0 * self.lm_head_params if logits else 0.0)

    # ------------------------------------------------------------------ steps
    def decode_step(self, batch: int, context: int) -> StepCost:
        """One decode step of `batch` sequences, each attending to `context` tokens (its own included)."""
        return StepCost(
            weight_bytes=self.streamed_bytes,
            kv_read_bytes=batch * context * self.kv_bytes_per_token,
            kv_write_bytes=batch * self.kv_bytes_per_token,
            gather_bytes=batch * self.embed_row_bytes,
            flops=batch * self.flops_per_token(context),
        )

    def prefill(self, prompts: int, prompt_len: int, max_batched_tokens: int = 2048,
                logits_all: bool = False) -> StepCost:
        """A whole prompt load: every prompt token through the projections, causal attention, and logits for
        each prompt's last token only (what an engine samples); `logits_all` computes them for every token.
        Weights are streamed once per engine step of `max_batched_tokens`."""
        tokens = prompts * prompt_len
        causal_ctx = prompt_len * (prompt_len + 1) / 2  # sum of context lengths over one prompt's tokens
        flops = tokens * 2.0 * self.matmul_params + prompts * self.attention_flops(1) * causal_ctx
        flops += (tokens if logits_all else prompts) * 2.0 * self.lm_head_params
        steps = math.ceil(tokens / max(1, max_batched_tokens))
        return StepCost(
            weight_bytes=steps * self.streamed_bytes,
            kv_read_bytes=tokens * self.kv_bytes_per_token,  # flash attention reads each K/V tile once
            kv_write_bytes=tokens * self.kv_bytes_per_token,
            gather_bytes=tokens * self.embed_row_bytes,
            flops=flops,
        )
