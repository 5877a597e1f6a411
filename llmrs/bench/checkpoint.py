"""Checkpoints written for benchmarks and tests: a real model's exact shapes with random weights
(`llmrs synth --out`), and an AWQ copy of an unquantized checkpoint.

- `write_checkpoint(preset, out)`: a Hugging Face-style directory any engine can load: config.json,
  generation_config.json, bf16 safetensors sharded at ~4 GB with model.safetensors.index.json, and the synthetic
  byte-level BPE tokenizer (llmrs.model.synthetic: exactly vocab_size entries, the preset's special token ids real
  special tokens). `quant="awq"`: an AutoAWQ-format checkpoint instead (4-bit GEMM packing, llmrs.model.quant):
  every linear as qweight int32 [in, out/8] (random bits: every pattern is 8 valid codes), qzeros int32 (zero
  points 7 or 8) and scales fp16 (0.02 / 4.61 with 10% jitter, so (q - z) * s has about the bf16 weights'
  spread); the rest fp16; config.json with quantization_config (torch_dtype float16, as AutoAWQ writes).
  Weights are N(0, 0.02^2), norms 1, biases N(0, 0.02^2), as the GPU draws of llmrs.model.synthetic.
- `write_awq_checkpoint(src, out)`: an unquantized checkpoint quantized round-to-nearest to AutoAWQ's format.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import shutil
import struct
from pathlib import Path
from typing import Any

import numpy as np

from llmrs.engine.config import ModelConfig
from llmrs.errors import UserError
from llmrs.model.presets import preset_config, preset_repo
from llmrs.model.quant import AWQ_GROUP_SIZE, LINEAR_SUFFIXES, awq_pack, awq_quantize
from llmrs.model.synthetic import STD, write_tokenizer
from llmrs.model.weights import bf16_bits, load_safetensors_weights

SHARD_BYTES = 4 << 30


# ---------------------------------------------------------------------- synthetic checkpoint
def tensor_shapes(c: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor of the checkpoint with its Hugging Face name and shape, in file order."""
    h, i, q, kv, v = c.hidden_size, c.intermediate_size, c.q_size, c.kv_size, c.vocab_size
    out: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (v, h)}
    for n in range(c.num_hidden_layers):
        p = f"model.layers.{n}."
        out.update({p + "input_layernorm.weight": (h,), p + "self_attn.q_proj.weight": (q, h),
                    p + "self_attn.k_proj.weight": (kv, h), p + "self_attn.v_proj.weight": (kv, h)})
        if c.attention_bias:
            out.update({p + "self_attn.q_proj.bias": (q,), p + "self_attn.k_proj.bias": (kv,),
                        p + "self_attn.v_proj.bias": (kv,)})
        out.update({p + "self_attn.o_proj.weight": (h, q), p + "post_attention_layernorm.weight": (h,),
                    p + "mlp.gate_proj.weight": (i, h), p + "mlp.up_proj.weight": (i, h),
                    p + "mlp.down_proj.weight": (h, i)})
    out["model.norm.weight"] = (h,)
    if not c.tie_word_embeddings:
        out["lm_head.weight"] = (v, h)
    return out


def _bf16_random(name: str, shape: tuple[int, ...], rng: np.random.Generator) -> bytes:
    if name.endswith("norm.weight"):
        return np.full(shape, 0x3F80, dtype=np.uint16).tobytes()  # 1.0
    x = rng.standard_normal(shape, dtype=np.float32) * np.float32(STD)
    return bf16_bits(x).tobytes()


_DTYPE_BYTES = {"BF16": 2, "F16": 2, "I32": 4}
AWQ_SCALE = STD / math.sqrt(255 / 12)  # codes uniform on 0..15 have std sqrt(255/12) = 4.61


def _awq_random(name: str, shape: tuple[int, ...], rng: np.random.Generator) -> bytes:
    """Random AWQ tensors (see the module docstring) and the fp16 rest of an AWQ checkpoint."""
    if name.endswith(".qweight"):
        return rng.integers(0, 1 << 32, size=shape, dtype=np.uint64).astype(np.uint32).tobytes()
    if name.endswith(".qzeros"):
        return awq_pack(rng.integers(7, 9, size=(shape[0], shape[1] * 8), dtype=np.uint8)).tobytes()
    if name.endswith(".scales"):
        jitter = 1.0 + 0.1 * rng.standard_normal(shape, dtype=np.float32)
        return (np.float32(AWQ_SCALE) * jitter).astype(np.float16).tobytes()
    if name.endswith("norm.weight"):
        return np.ones(shape, dtype=np.float16).tobytes()
    return (rng.standard_normal(shape, dtype=np.float32) * np.float32(STD)).astype(np.float16).tobytes()


def awq_tensor_entries(c: ModelConfig, group_size: int) -> list[tuple[str, tuple[int, ...], str]]:
    """(name, shape, dtype) of an AWQ checkpoint with the shapes of `c`, in file order."""
    out = []
    for name, shape in tensor_shapes(c).items():
        p = name[: -len(".weight")]
        if name.endswith(".weight") and p.endswith(LINEAR_SUFFIXES):
            o, i = shape
            if group_size < 32 or group_size % 32 or i % group_size or o % 8:
                raise UserError(f"{name} [{o}, {i}]: AWQ needs in-features divisible by the group size "
                                f"{group_size} (a multiple of 32) and out-features by 8; try --group-size 64 or 32")
            out += [(p + ".qweight", (i, o // 8), "I32"), (p + ".qzeros", (i // group_size, o // 8), "I32"),
                    (p + ".scales", (i // group_size, o), "F16")]
        else:
            out.append((name, shape, "F16"))
    return out


def _write_safetensors(path: Path, tensors: list[tuple[str, tuple[int, ...], str]], rng: np.random.Generator) -> None:
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    off = 0
    for name, shape, dtype in tensors:
        n = _DTYPE_BYTES[dtype] * math.prod(shape)
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [off, off + n]}
        off += n
    raw = json.dumps(header, separators=(",", ":")).encode()
    # NOTE: ljust, not `+= b" " * n`: an in-process `ptx-check` (llmrs/ptx/compile.py `_log`) lets NVRTC write
    # into the interpreter's shared one-byte b" " object, after which b" " * n is NULs (an invalid header)
    raw = raw.ljust(len(raw) + (-len(raw) % 8))
    tmp = path.with_name(path.name + ".partial")  # renamed when complete: a failed write leaves no truncated file
    try:
        with tmp.open("wb") as f:
            f.write(struct.pack("<Q", len(raw)))
            f.write(raw)
            for name, shape, dtype in tensors:
                f.write(_bf16_random(name, shape, rng) if dtype == "BF16" else _awq_random(name, shape, rng))
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def clear_checkpoint(out: Path) -> list[str]:
    """Remove an earlier checkpoint's weights from `out` before a new one is written there: every *.safetensors,
    model.safetensors.index.json (the loader prefers an index, so a stale one would serve the old shards) and the
    config.json, rewritten last (a write that fails leaves no loadable half-checkpoint). Only a folder that
    `llmrs synth` wrote (config.json with "synthetic_like") or one with no config.json is cleared; another model's
    checkpoint is a UserError, never deleted. Returns the names removed."""
    from llmrs.errors import UserError

    cfg = out / "config.json"
    if cfg.exists():
        try:
            doc = json.loads(cfg.read_text())
            ours = isinstance(doc, dict) and "synthetic_like" in doc
        except (OSError, ValueError):
            ours = False
        if not ours:
            raise UserError(f"--out {out}: holds a model checkpoint that llmrs synth did not write (its config.json); "
                            "give a new or empty folder")
    stale = sorted({*out.glob("*.safetensors"), *out.glob("*.safetensors.partial"),
                    *[p for p in (out / "model.safetensors.index.json", cfg) if p.exists()]})
    for f in stale:
        f.unlink()
    return [f.name for f in stale]


def hf_config(c: ModelConfig, repo: str) -> dict[str, Any]:
    arch = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "mistral": "MistralForCausalLM"}[c.model_type]
    d = {
        "architectures": [arch], "model_type": c.model_type, "vocab_size": c.vocab_size,
        "hidden_size": c.hidden_size, "intermediate_size": c.intermediate_size,
        "num_hidden_layers": c.num_hidden_layers, "num_attention_heads": c.num_attention_heads,
        "num_key_value_heads": c.num_key_value_heads, "head_dim": c.head_dim, "rms_norm_eps": c.rms_norm_eps,
        "rope_theta": c.rope_theta, "max_position_embeddings": c.max_position_embeddings,
        "tie_word_embeddings": c.tie_word_embeddings, "bos_token_id": c.bos_token_id,
        "eos_token_id": c.eos_token_ids[0] if len(c.eos_token_ids) == 1 else c.eos_token_ids,
        "torch_dtype": "bfloat16", "hidden_act": "silu", "synthetic_like": repo,
    }
    if c.model_type == "llama":
        d["attention_bias"] = c.attention_bias
    if c.rope_scaling:
        d["rope_scaling"] = c.rope_scaling
    return d


def write_checkpoint(preset: str, out: Path, seed: int = 0, progress: Any = None, quant: str | None = None,
                     group_size: int = 128, overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """Write the synthetic checkpoint (bf16, or quant="awq"); returns a summary (files, bytes, parameters, and the
    earlier checkpoint's files `removed`: see clear_checkpoint). `overrides` replaces config fields (tests shrink a
    preset with it)."""
    c = preset_config(preset)
    if overrides:
        c = dataclasses.replace(c, **overrides)
    if quant not in (None, "awq"):
        raise UserError(f"--quant {quant!r}: the synthetic checkpoint formats are bf16 (default) and awq")
    if quant == "awq":
        entries = awq_tensor_entries(c, group_size)
    else:
        entries = [(name, shape, "BF16") for name, shape in tensor_shapes(c).items()]
    out.mkdir(parents=True, exist_ok=True)
    removed = clear_checkpoint(out)
    rng = np.random.default_rng(seed)
    shards: list[list[tuple[str, tuple[int, ...], str]]] = [[]]
    size = 0
    for name, shape, dtype in entries:
        n = _DTYPE_BYTES[dtype] * math.prod(shape)
        if shards[-1] and size + n > SHARD_BYTES:
            shards.append([])
            size = 0
        shards[-1].append((name, shape, dtype))
        size += n
    total = sum(_DTYPE_BYTES[d] * math.prod(s) for _, s, d in entries)
    files = []
    if len(shards) == 1:
        files.append("model.safetensors")
    else:
        files = [f"model-{k + 1:05d}-of-{len(shards):05d}.safetensors" for k in range(len(shards))]
    weight_map = {}
    for fname, shard in zip(files, shards):
        _write_safetensors(out / fname, shard, rng)
        weight_map.update({name: fname for name, _, _ in shard})
        if progress:
            progress(fname)
    if len(files) > 1:
        (out / "model.safetensors.index.json").write_text(json.dumps(
            {"metadata": {"total_size": total}, "weight_map": weight_map}, indent=1))
    cfg = hf_config(c, preset_repo(preset))
    if quant == "awq":
        cfg["torch_dtype"] = "float16"
        cfg["quantization_config"] = {"quant_method": "awq", "bits": 4, "group_size": group_size,
                                      "zero_point": True, "version": "gemm", "modules_to_not_convert": None}
    (out / "config.json").write_text(json.dumps(cfg, indent=1))
    (out / "generation_config.json").write_text(json.dumps({"eos_token_id": c.eos_token_ids,
                                                            "bos_token_id": c.bos_token_id}))
    write_tokenizer(c, out)
    return {"preset": preset, "out": str(out), "files": files, "bytes": total, "parameters": c.num_parameters(),
            "quant": quant or "bf16", "removed": removed}


# ---------------------------------------------------------------------- AWQ copy of a checkpoint
def _save(path: Path, tensors: dict[str, np.ndarray]) -> None:
    from safetensors.numpy import save_file

    save_file({k: np.ascontiguousarray(v) for k, v in tensors.items()}, str(path), metadata={"format": "pt"})


def write_awq_checkpoint(src: Path, out: Path, group_size: int = AWQ_GROUP_SIZE) -> Path:
    """Quantize an unquantized HF checkpoint directory to an AutoAWQ-format one (round-to-nearest, see the module
    docstring): linears -> qweight/qzeros/scales, everything else fp16; config.json gets quantization_config.
    Tokenizer and generation files are copied."""
    src, out = Path(src), Path(out)
    out.mkdir(parents=True, exist_ok=True)
    tensors, _ = load_safetensors_weights(src)
    written: dict[str, np.ndarray] = {}
    for name, t in tensors.items():
        p = name[: -len(".weight")] if name.endswith(".weight") else None
        if p is not None and p.endswith(LINEAR_SUFFIXES):
            qw, qz, s = awq_quantize(t, group_size)
            written.update({p + ".qweight": qw, p + ".qzeros": qz, p + ".scales": s})
        else:
            written[name] = t.astype(np.float16)
    _save(out / "model.safetensors", written)
    cfg = json.loads((src / "config.json").read_text())
    cfg["torch_dtype"] = "float16"
    cfg["quantization_config"] = {"quant_method": "awq", "bits": 4, "group_size": group_size, "zero_point": True,
                                  "version": "gemm", "modules_to_not_convert": None}
    (out / "config.json").write_text(json.dumps(cfg, indent=1))
    for f in src.iterdir():
        if f.name != "config.json" and f.suffix in (".json", ".jinja", ".txt", ".model") and "safetensors" not in f.name:
            shutil.copy(f, out / f.name)
    return out
