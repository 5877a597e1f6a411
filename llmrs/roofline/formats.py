"""Weight storage formats: bits per weight, including the per-group scale/zero overhead.

Bits per weight decide the bytes a decode step streams, so they decide the memory-bound floor. The overhead
of a group format is (bits of its scale + zero) / group size: AWQ's fp16 scale + fp16 zero per 128 weights
adds 32/128 = 0.25 bit, giving 4.25.
"""

from __future__ import annotations

from dataclasses import dataclass

from llmrs.errors import UserError


@dataclass(slots=True, frozen=True)
class WeightFormat:
    """A storage format for matrix weights and the datatype its GEMM runs in on tensor cores."""

    name: str
    bits_per_weight: float
    description: str
    compute_dtype: str = "bf16"  # which tensor roof bounds its math (4-bit codes are unpacked to 16-bit)
    default_lm_head: str | None = None  # format of the output layer when the checkpoint keeps it apart

    @property
    def bytes_per_weight(self) -> float:
        return self.bits_per_weight / 8


FORMATS: dict[str, WeightFormat] = {f.name: f for f in [
    WeightFormat("f32", 32, "float32"),
    WeightFormat("bf16", 16, "bfloat16"),
    WeightFormat("fp16", 16, "float16", compute_dtype="fp16"),
    WeightFormat("fp8", 8, "FP8 e4m3, one scale per tensor (negligible)", compute_dtype="fp8",
                 default_lm_head="bf16"),
    WeightFormat("q8_0", 8.5, "GGUF Q8_0: 8-bit, fp16 scale per 32 (8 + 16/32)"),
    WeightFormat("q6_k", 6.5625, "GGUF Q6_K: 6-bit k-quant, 210 bytes per 256 weights"),
    WeightFormat("q5_1", 6, "GGUF Q5_1: 5-bit, fp16 scale + fp16 min per 32 (5 + 32/32)"),
    WeightFormat("q5_k", 5.5, "GGUF Q5_K: 5-bit k-quant, 176 bytes per 256 weights"),
    WeightFormat("q5_0", 5.5, "GGUF Q5_0: 5-bit, fp16 scale per 32 (5 + 16/32)"),
    WeightFormat("q4_k", 4.5, "GGUF Q4_K: 4-bit k-quant, 144 bytes per 256 weights"),
    WeightFormat("q3_k", 3.4375, "GGUF Q3_K: 3-bit k-quant, 110 bytes per 256 weights"),
    WeightFormat("q2_k", 2.625, "GGUF Q2_K: 2-bit k-quant, 84 bytes per 256 weights"),
    WeightFormat("q4_f32", 6, "4-bit, f32 scale + f32 offset per 32 (4 + 64/32): llm-rs's format"),
    WeightFormat("q4_1", 5, "GGUF Q4_1: 4-bit, fp16 scale + fp16 min per 32 (4 + 32/32)"),
    WeightFormat("q4_0", 4.5, "GGUF Q4_0: 4-bit, fp16 scale per 32 (4 + 16/32)"),
    WeightFormat("awq", 4.25, "AWQ 4-bit, fp16 scale + fp16 zero per 128 (4 + 32/128); lm_head kept in bf16",
                 compute_dtype="fp16", default_lm_head="bf16"),
    WeightFormat("gptq", 4.25, "GPTQ 4-bit, group 128 (fp16 scale + zero); lm_head kept in bf16",
                 compute_dtype="fp16", default_lm_head="bf16"),
]}

# GGUF tensor type name (gguf.GGMLQuantizationType) -> our format, for display
GGUF_TYPE_TO_FORMAT = {"F32": "f32", "BF16": "bf16", "F16": "fp16", "Q8_0": "q8_0", "Q6_K": "q6_k",
                       "Q4_1": "q4_1", "Q4_0": "q4_0", "Q5_0": "q5_0", "Q5_1": "q5_1", "Q5_K": "q5_k",
                       "Q4_K": "q4_k", "Q3_K": "q3_k", "Q2_K": "q2_k"}


def get_format(name: str) -> WeightFormat:
    """Look a format up by name (case-insensitive; 'awq-4bit', 'int4' aliases); UserError when unknown."""
    key = name.strip().lower().replace("-", "_")
    key = {"bfloat16": "bf16", "float16": "fp16", "half": "fp16", "float32": "f32", "fp32": "f32",
           "awq_4bit": "awq", "int4": "awq", "w4a16": "awq"}.get(key, key)
    if key not in FORMATS:
        raise UserError(f"unknown weight format {name!r}; known: {', '.join(FORMATS)}")
    return FORMATS[key]


def lm_head_format(weights: WeightFormat, override: str | None = None) -> WeightFormat:
    """Format of the output layer: the override, else the format's convention, else the weights' own."""
    if override:
        return get_format(override)
    return get_format(weights.default_lm_head) if weights.default_lm_head else weights
