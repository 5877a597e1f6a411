"""Model and engine configuration.

`ModelConfig` is the one description of a model's shapes that every part of llmrs reads: the loader, the
forward pass, the KV cache sizing, and the roofline cost model. It is built from a Hugging Face
`config.json` or from GGUF metadata; both paths end in the same fields, with Hugging Face names.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from llmrs.errors import UserError

# model_type -> (architecture family, has q/k/v bias)
SUPPORTED_MODEL_TYPES = {"llama": False, "qwen2": True, "mistral": False}
# GGUF general.architecture -> HF model_type
GGUF_ARCH_TO_MODEL_TYPE = {"llama": "llama", "qwen2": "qwen2"}


@dataclass(slots=True)
class ModelConfig:
    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_scaling: dict[str, Any] | None = None
    max_position_embeddings: int = 2048
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    bos_token_id: int | None = None
    eos_token_ids: list[int] = field(default_factory=list)
    torch_dtype: str = "bfloat16"

    def __post_init__(self) -> None:
        if self.num_attention_heads % self.num_key_value_heads:
            raise UserError(
                f"num_attention_heads ({self.num_attention_heads}) is not a multiple of "
                f"num_key_value_heads ({self.num_key_value_heads})"
            )

    @property
    def q_size(self) -> int:
        return self.num_attention_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_key_value_heads * self.head_dim

    @property
    def num_queries_per_kv(self) -> int:
        return self.num_attention_heads // self.num_key_value_heads

    def num_parameters(self) -> int:
        """Exact parameter count of the checkpoint (tied embeddings counted once)."""
        h, i, q, kv = self.hidden_size, self.intermediate_size, self.q_size, self.kv_size
        per_layer = h * (q + 2 * kv) + q * h + 3 * h * i + 2 * h
        if self.attention_bias:
            per_layer += q + 2 * kv
        total = self.num_hidden_layers * per_layer + self.vocab_size * h + h
        if not self.tie_word_embeddings:
            total += self.vocab_size * h
        return total

    def kv_bytes_per_token(self, dtype_bytes: int = 2) -> int:
        return 2 * self.num_hidden_layers * self.num_key_value_heads * self.head_dim * dtype_bytes

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    # ---------------------------------------------------------------- constructors
    @classmethod
    def from_hf_dict(cls, cfg: dict[str, Any], to_run: bool = True) -> "ModelConfig":
        """`to_run`: the model will be computed, so a field that changes its math and is not implemented is refused
        (`_refuse_unimplemented`); the roofline, which only counts its shapes, passes False."""
        model_type = cfg.get("model_type")
        archs = cfg.get("architectures") or []
        if model_type not in SUPPORTED_MODEL_TYPES:
            raise UserError(
                f"unsupported architecture {model_type!r} ({', '.join(archs) or 'no architectures listed'}); "
                f"llmrs supports: {', '.join(sorted(SUPPORTED_MODEL_TYPES))}"
            )
        if to_run:
            _refuse_unimplemented(cfg, model_type)
        try:
            hidden = int(cfg["hidden_size"])
            n_heads = int(cfg["num_attention_heads"])
            eos = cfg.get("eos_token_id")
            eos_ids = [] if eos is None else ([int(eos)] if isinstance(eos, int) else [int(e) for e in eos])
            # transformers >= 5 writes `rope_parameters` (theta + scaling together); older files `rope_scaling`
            rope_params = cfg.get("rope_parameters") or {}
            rope_theta = cfg.get("rope_theta", rope_params.get("rope_theta", 10000.0))
            rope_scaling = cfg.get("rope_scaling") or (rope_params or None)
            if rope_scaling is not None:
                rope_scaling = dict(rope_scaling)
                rtype = rope_scaling.get("rope_type", rope_scaling.get("type"))
                if rtype not in ("llama3", "default", None):
                    raise UserError(f"unsupported rope_scaling type {rtype!r} (supported: llama3)")
                if rtype in ("default", None):
                    rope_scaling = None
            return cls(
                model_type=model_type,
                vocab_size=int(cfg["vocab_size"]),
                hidden_size=hidden,
                intermediate_size=int(cfg["intermediate_size"]),
                num_hidden_layers=int(cfg["num_hidden_layers"]),
                num_attention_heads=n_heads,
                num_key_value_heads=int(cfg.get("num_key_value_heads") or n_heads),
                head_dim=int(cfg.get("head_dim") or hidden // n_heads),
                rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
                rope_theta=float(rope_theta),
                rope_scaling=rope_scaling,
                max_position_embeddings=int(cfg.get("max_position_embeddings", 2048)),
                tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
                attention_bias=bool(cfg.get("attention_bias", SUPPORTED_MODEL_TYPES[model_type])),
                bos_token_id=cfg.get("bos_token_id"),
                eos_token_ids=eos_ids,
                torch_dtype=str(cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16"),
            )
        except KeyError as e:
            raise UserError(f"config.json is missing the field {e.args[0]!r}") from None

    @classmethod
    def from_json_file(cls, path: Path, to_run: bool = True) -> "ModelConfig":
        try:
            cfg = json.loads(Path(path).read_text())
        except json.JSONDecodeError as e:
            raise UserError(f"{path}: not valid JSON ({e})") from None
        if not isinstance(cfg, dict):
            raise UserError(f"{path}: expected a JSON object, got {type(cfg).__name__}")
        return cls.from_hf_dict(cfg, to_run)

    @classmethod
    def from_gguf_metadata(cls, md: dict[str, Any], vocab_size: int, has_output: bool) -> "ModelConfig":
        arch = md.get("general.architecture")
        if arch not in GGUF_ARCH_TO_MODEL_TYPE:
            raise UserError(
                f"unsupported GGUF architecture {arch!r}; llmrs supports: {', '.join(GGUF_ARCH_TO_MODEL_TYPE)}"
            )

        def get(key: str, default: Any = None) -> Any:
            return md.get(f"{arch}.{key}", default)

        window = get("attention.sliding_window")
        if window not in (None, 0) and int(window) < int(get("context_length", 2048)):
            raise UserError(f"this GGUF's attention uses a sliding window of {window} tokens ({arch}.attention."
                            "sliding_window), which llmrs does not implement yet: every token past the window would "
                            "be computed with full attention, and be wrong")
        try:
            hidden = int(get("embedding_length"))
            n_heads = int(get("attention.head_count"))
            n_kv = int(get("attention.head_count_kv", n_heads))
            head_dim = int(get("attention.key_length", hidden // n_heads))
            eos = md.get("tokenizer.ggml.eos_token_id")
            rope_scaling = None
            if md.get(f"{arch}.rope.scaling.type") not in (None, "none"):
                raise UserError(f"unsupported GGUF rope scaling {md.get(f'{arch}.rope.scaling.type')!r}")
            return cls(
                model_type=GGUF_ARCH_TO_MODEL_TYPE[arch],
                vocab_size=int(get("vocab_size", vocab_size)),
                hidden_size=hidden,
                intermediate_size=int(get("feed_forward_length")),
                num_hidden_layers=int(get("block_count")),
                num_attention_heads=n_heads,
                num_key_value_heads=n_kv,
                head_dim=head_dim,
                rms_norm_eps=float(get("attention.layer_norm_rms_epsilon", 1e-5)),
                rope_theta=float(get("rope.freq_base", 10000.0)),
                rope_scaling=rope_scaling,
                max_position_embeddings=int(get("context_length", 2048)),
                tie_word_embeddings=not has_output,
                attention_bias=SUPPORTED_MODEL_TYPES[GGUF_ARCH_TO_MODEL_TYPE[arch]],
                bos_token_id=md.get("tokenizer.ggml.bos_token_id"),
                eos_token_ids=[] if eos is None else [int(eos)],
            )
        except (TypeError, ValueError) as e:
            raise UserError(f"GGUF metadata incomplete for {arch}: {e}") from None


def _refuse_unimplemented(cfg: dict[str, Any], model_type: str) -> None:
    """A config field that changes the model's math and that llmrs does not implement is a UserError naming it:
    computing the model without it would give wrong tokens, silently (a Mistral with a sliding window of 8
    computed with full attention leaves transformers' tokens after the window). Values that make the field a no-op
    (a window at least the context length, SiLU, no MLP bias) are accepted."""
    def refuse(field_: str, value: Any, what: str) -> None:
        raise UserError(f"config.json sets {field_} = {value!r}: {what}, which llmrs does not implement yet; "
                        "computing the model without it would give wrong tokens")

    window = cfg.get("sliding_window")
    # Qwen2 configs carry a window that is off unless use_sliding_window is true; Mistral's is on wherever it is set
    window_on = window not in (None, 0) and (model_type != "qwen2" or bool(cfg.get("use_sliding_window")))
    context = cfg.get("max_position_embeddings", 2048)
    if window_on and int(window) < int(context):
        refuse("sliding_window", window, "sliding-window attention (each token attends to the last "
                                         f"{window} tokens only)")
    layer_types = cfg.get("layer_types") or []
    if window_on and any(t == "sliding_attention" for t in layer_types) and int(window) < int(context):
        refuse("layer_types", "sliding_attention", "sliding-window attention layers")
    act = cfg.get("hidden_act", cfg.get("hidden_activation", "silu"))
    if act not in ("silu", "swish"):
        refuse("hidden_act", act, "an MLP activation other than SiLU")
    if cfg.get("mlp_bias"):
        refuse("mlp_bias", True, "biases in the MLP projections")
    factor = cfg.get("partial_rotary_factor", 1.0)
    if factor not in (None, 1, 1.0):
        refuse("partial_rotary_factor", factor, "rotary embedding on part of each head")


@dataclass(slots=True)
class EngineConfig:
    """Knobs of the engine that are not part of the model."""

    block_size: int = 16
    kv_cache_tokens: int | None = None  # None: 16,384 on the CPU; on the GPU, sized by gpu_memory_utilization
    gpu_memory_utilization: float = 0.9
    max_num_seqs: int = 64
    # None: the serving default of the device the engine runs on (engine.serving_batched_tokens: 8192 on a GPU of
    # >= 70 GiB other than an A100, as vLLM's API server; else 2048)
    max_num_batched_tokens: int | None = 2048
    max_model_len: int | None = None
    enable_prefix_caching: bool = True
    device: str = "cpu"
    # plan and launch step n+1 before step n's tokens are back (its decode inputs are filled in on the device),
    # so the host's work of a step (detokenizing, streaming, planning) overlaps the GPU's. None: on when the
    # model runs on one GPU; True/False force it (`llmrs serve --async-scheduling/--no-async-scheduling`; on the
    # CPU it only shows that the two schedules agree: the CPU runs each step at once)
    async_scheduling: bool | None = None
    # the CPU backend's BLAS threads in the process that runs it (backends.cpu.limit_threads); None: numpy's own
    # default (every core), as `llmrs generate` wants; `llmrs serve` gives it the cores free when it starts
    cpu_threads: int | None = None


def async_scheduling_default(device: str) -> bool:
    """Whether a runner on `device` that can launch runs ahead when nothing says otherwise: on one GPU."""
    return device == "cuda"
