"""Turn the user's MODEL argument into a `ModelCost`: a preset name, a Hugging Face directory, or a .gguf.

A .gguf file carries its real tensor types, so its costs use the bytes actually stored per component
(e.g. Q4_1 matrices, Q6_K output, f32 norms) instead of a nominal format; a Hugging Face directory's
format comes from `quantization_config` (AWQ, GPTQ, FP8) or its `torch_dtype`.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llmrs.engine.config import ModelConfig
from llmrs.errors import UserError
from llmrs.roofline.cost import ModelCost
from llmrs.roofline.formats import GGUF_TYPE_TO_FORMAT, WeightFormat, get_format, lm_head_format
from llmrs.model.presets import PRESETS, preset_config


@dataclass(slots=True)
class ModelSource:
    """What MODEL named: its config, a label, the format its checkpoint is stored in, and real bits if known."""

    label: str
    config: ModelConfig
    default_format: str
    bits_override: dict[str, float] | None = None
    lm_head_format: str | None = None


def resolve_model(model: str) -> ModelSource:
    """Preset, HF directory (or its config.json), or .gguf file -> ModelSource; UserError otherwise."""
    p = Path(model).expanduser()
    if p.suffix == ".gguf":
        if not p.is_file():
            raise UserError(f"{model}: no such GGUF file")
        return _from_gguf(p)
    if p.is_dir() or (p.is_file() and p.name.endswith(".json")):
        cfg_path = p / "config.json" if p.is_dir() else p
        if not cfg_path.is_file():
            raise UserError(f"{model}: no config.json in this directory")
        return _from_hf(cfg_path, label=p.name if p.is_dir() else p.parent.name)
    try:
        cfg = preset_config(model)
    except UserError:
        raise UserError(
            f"unknown model {model!r}: not a preset ({', '.join(PRESETS)}), a model directory or a .gguf file"
        ) from None
    return ModelSource(label=model.lower(), config=cfg, default_format="bf16")


def build_cost(src: ModelSource, fmt: str | None = None, head_fmt: str | None = None, kv_dtype_bytes: float = 2.0,
               compute_dtype: str | None = None) -> ModelCost:
    """ModelCost for a source; an explicit --format replaces a GGUF file's real per-tensor bits."""
    weights: WeightFormat = get_format(fmt or src.default_format)
    head = lm_head_format(weights, head_fmt or (src.lm_head_format if fmt is None else None))
    override = src.bits_override if fmt is None and head_fmt is None else None
    return ModelCost.build(src.config, weights, head, kv_dtype_bytes=kv_dtype_bytes, bits_override=override,
                           compute_dtype=compute_dtype)


def _from_hf(cfg_path: Path, label: str) -> ModelSource:
    cfg = ModelConfig.from_json_file(cfg_path, to_run=False)  # (shapes only: a window changes no shape)
    raw = json.loads(cfg_path.read_text())
    q = raw.get("quantization_config") or {}
    method = str(q.get("quant_method", "")).lower()
    if method in ("awq", "gptq"):
        bits = int(q.get("bits", 4))
        if bits != 4:
            raise UserError(f"{cfg_path}: {method} with {bits} bits is not modelled (4-bit only)")
        fmt = method
    elif method in ("fp8", "compressed-tensors") and "fp8" in json.dumps(q).lower():
        fmt = "fp8"
    elif method:
        raise UserError(f"{cfg_path}: quantization method {method!r} is not modelled; pass --format")
    else:
        fmt = {"bfloat16": "bf16", "float16": "fp16", "float32": "f32"}.get(cfg.torch_dtype, "bf16")
    return ModelSource(label=label, config=cfg, default_format=fmt)


def _gguf_component(name: str) -> str | None:
    """Map a GGUF tensor name to a cost-model component."""
    if name == "token_embd.weight":
        return "embedding"
    if name == "output.weight":
        return "lm_head"
    if "norm" in name:
        return "norms"
    if name.startswith("blk.") and name.endswith(".bias") and "attn_" in name:
        return "qkv bias"
    if ".attn_" in name:
        return "attention q,k,v,o"
    if ".ffn_" in name:
        return "mlp gate,up,down"
    return None


def _field_value(field: Any) -> Any:
    try:
        return field.contents()
    except Exception:  # very old gguf: scalar in parts[data[0]]
        return field.parts[field.data[0]].tolist()[0]


def _from_gguf(path: Path) -> ModelSource:
    try:
        import gguf  # noqa: F401
    except ImportError:
        raise UserError("reading .gguf needs the `gguf` package") from None
    from llmrs.model.weights import open_gguf

    reader = open_gguf(path)  # UserError for a truncated or corrupt file
    md: dict[str, Any] = {}
    for key, f in reader.fields.items():
        if key.startswith("tokenizer.ggml.") and key not in ("tokenizer.ggml.bos_token_id",
                                                               "tokenizer.ggml.eos_token_id"):
            continue
        md[key] = _field_value(f)
    tokens = reader.fields.get("tokenizer.ggml.tokens")
    names = {t.name for t in reader.tensors}
    emb = next((t for t in reader.tensors if t.name == "token_embd.weight"), None)
    vocab = len(tokens.data) if tokens is not None else (int(emb.shape[-1]) if emb is not None else 0)
    cfg = ModelConfig.from_gguf_metadata(md, vocab_size=vocab, has_output="output.weight" in names)
    sums: dict[str, list[int]] = {}
    matmul_types: Counter[str] = Counter()
    head_type = None
    for t in reader.tensors:
        comp = _gguf_component(t.name)
        if comp is None:
            continue
        s = sums.setdefault(comp, [0, 0])
        s[0] += int(t.n_elements)
        s[1] += int(t.n_bytes)
        tname = getattr(t.tensor_type, "name", str(t.tensor_type))
        if comp.startswith(("attention", "mlp")):
            matmul_types[tname] += int(t.n_elements)
        if t.name == ("output.weight" if "output.weight" in names else "token_embd.weight"):
            head_type = tname
    bits = {comp: 8 * b / n for comp, (n, b) in sums.items() if n}
    if cfg.tie_word_embeddings and "embedding" in bits:
        bits["embedding = lm_head (tied)"] = bits.pop("embedding")
    main = matmul_types.most_common(1)[0][0] if matmul_types else "BF16"
    fmt = GGUF_TYPE_TO_FORMAT.get(main)
    if fmt is None:  # k-quants etc.: a nominal format for the label; the real bits come from bits_override
        fmt = "q4_0"
    return ModelSource(label=path.name, config=cfg, default_format=fmt, bits_override=bits,
                       lm_head_format=GGUF_TYPE_TO_FORMAT.get(head_type or "", None))
