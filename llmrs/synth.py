"""Synthetic models: a real model's exact shapes with random weights, for benchmarks without downloads.

- `write_checkpoint(preset, out)`: a Hugging Face-style directory any engine can load: config.json,
  generation_config.json, bf16 safetensors sharded at ~4 GB with model.safetensors.index.json, and a
  byte-level BPE tokenizer.json whose vocabulary has exactly vocab_size entries (256 bytes, then two- and
  three-character merges; the preset's special token ids are real special tokens).
  `quant="awq"`: an AutoAWQ-format checkpoint instead (4-bit GEMM packing, llmrs.model.quant): every linear
  as qweight int32 [in, out/8] (random bits: every pattern is 8 valid codes), qzeros int32 (zero points 7 or 8)
  and scales fp16 (0.02 / 4.61 with 10% jitter, so (q - z) * s has about the bf16 weights' spread); the
  rest fp16; config.json with quantization_config (torch_dtype float16, as AutoAWQ writes).
- `gpu_weights(config, backend)`: the same kind of weights drawn directly on the GPU (no files, no host
  copies), for `llmrs synth --decode-bench` and for engine paths that take `--synthetic`.
- `decode_benchmark(preset)`: single-stream decode on the CUDA backend, as a fraction of the bandwidth floor.

Weights are N(0, 0.02^2) (transformers' initializer_range), norms 1, biases N(0, 0.02^2): realistic scale
for timing, meaningless text.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import struct
import time
from pathlib import Path
from typing import Any

import numpy as np

from llmrs.engine.config import ModelConfig
from llmrs.model.decoder import LayerWeights, ModelWeights
from llmrs.roofline.presets import preset_config, preset_repo

STD = 0.02
SHARD_BYTES = 4 << 30
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


# ---------------------------------------------------------------------- checkpoint on disk
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
    from llmrs.backends.cuda import bf16_bits  # pure numpy, no CuPy needed

    if name.endswith("norm.weight"):
        return np.full(shape, 0x3F80, dtype=np.uint16).tobytes()  # 1.0
    x = rng.standard_normal(shape, dtype=np.float32) * np.float32(STD)
    return bf16_bits(x).tobytes()


_DTYPE_BYTES = {"BF16": 2, "F16": 2, "I32": 4}
AWQ_SCALE = STD / math.sqrt(255 / 12)  # codes uniform on 0..15 have std sqrt(255/12) = 4.61


def _awq_random(name: str, shape: tuple[int, ...], rng: np.random.Generator) -> bytes:
    """Random AWQ tensors (see the module docstring) and the fp16 rest of an AWQ checkpoint."""
    from llmrs.model.quant import awq_pack

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
    from llmrs.model.quant import LINEAR_SUFFIXES
    from llmrs.errors import UserError

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
    # NOTE: ljust, not `+= b" " * n`: an in-process `ptx-check` (roofline/ptx/compile.py `_log`) lets NVRTC write
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


def synthetic_vocab(size: int, special_ids: dict[int, str]) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """A byte-level BPE vocabulary of exactly `size` ids: the 256 byte symbols, then 2- and 3-symbol merges of the
    printable ASCII symbols (bytes 0x20-0x7e), with `special_ids` (id -> text) placed at their ids.

    Every token but the 128 single bytes above 0x7f decodes to complete text on its own. Random weights sample
    tokens about uniformly; with merges over all 256 bytes (before), about half of them ended inside a UTF-8
    character, the server held such a first token back until the next one completed it, and a benchmark's TTFT
    median carried an extra decode step that a real model's English output does not."""
    from llmrs.model.tokenizer import _bytes_to_unicode

    byte_of = _bytes_to_unicode()  # ByteLevel symbol -> byte
    alphabet = sorted(byte_of)
    ascii_ = [ch for ch in alphabet if 0x20 <= byte_of[ch] <= 0x7E]
    vocab: dict[str, int] = {}
    merges: list[tuple[str, str]] = []
    free = (i for i in range(size) if i not in special_ids)
    for ch in alphabet:
        vocab[ch] = next(free)
    need = size - len(special_ids) - len(alphabet)
    pairs = [(a, b) for a in ascii_ for b in ascii_]
    for a, b in pairs[:need]:
        vocab[a + b] = next(free)
        merges.append((a, b))
    need -= min(need, len(pairs))
    k = 0
    while need > 0:  # 3-symbol tokens (ab)+c: every 2-symbol token exists by now
        a, b = pairs[k // len(ascii_)]
        ch = ascii_[k % len(ascii_)]
        vocab[a + b + ch] = next(free)
        merges.append((a + b, ch))
        need -= 1
        k += 1
    for i, text in special_ids.items():
        vocab[text] = i
    assert len(vocab) == size, (len(vocab), size)
    return vocab, merges


def write_tokenizer(c: ModelConfig, out: Path) -> None:
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    eos = c.eos_token_ids[0] if c.eos_token_ids else c.vocab_size - 1
    ids = sorted({eos, *(c.eos_token_ids or []), *([c.bos_token_id] if c.bos_token_id is not None else [])})
    specials: dict[int, str] = {}
    names = iter(SPECIALS + [f"<|special_{k}|>" for k in range(len(ids))])
    for i in ids:
        specials[i] = "<|im_end|>" if i == eos else next(n for n in names if n != "<|im_end|>")
    vocab, merges = synthetic_vocab(c.vocab_size, specials)
    tk = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    tk.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in specials.values()])
    tk.save(str(out / "tokenizer.json"))
    bos = specials.get(c.bos_token_id) if c.bos_token_id is not None else None
    (out / "tokenizer_config.json").write_text(json.dumps({
        "bos_token": bos, "eos_token": specials[eos], "chat_template": CHAT_TEMPLATE,
        "tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": c.max_position_embeddings,
    }, indent=1))


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
    import dataclasses

    from llmrs.errors import UserError

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


# ---------------------------------------------------------------------- weights on the GPU
class GpuDraws:
    """The random draws of synthetic GPU weights, in call order from one generator: `mat` a bf16 matrix of
    N(0, STD) values, `vec` an f32 vector holding bf16-rounded ones. gpu_weights and tp_nccl.synthetic_shard (which
    slices each matrix as soon as it is drawn) make the same calls in the same order, so TP=N holds TP=1's weights."""

    def __init__(self, backend: Any, seed: int = 0):
        self.backend, self.cp = backend, backend.cp
        self.rs = backend.cp.random.RandomState(seed)

    def mat(self, rows: int, cols: int) -> Any:
        x = self.rs.standard_normal((rows, cols), dtype=self.cp.float32)
        x *= STD
        w = self.backend.upload_bf16(x)
        del x
        return w

    def vec(self, n: int) -> Any:
        from llmrs.backends.cuda import round_bf16

        cp = self.cp
        return cp.asarray(round_bf16(cp.asnumpy(self.rs.standard_normal((n,), dtype=cp.float32) * STD)))


def synthetic_weights(loaded: Any, backend: Any) -> ModelWeights:
    """gpu_weights for a synthetic LoadedModel (no tensors): packed AWQ 4-bit linears where its source says so
    ("synthetic:PRESET-awq"), bf16 otherwise."""
    q = loaded.source.quantization
    return gpu_weights(loaded.config, backend, quant="awq" if q else None, group_size=q["group_size"] if q else 128)


def gpu_weights(c: ModelConfig, backend: Any, seed: int = 0, quant: str | None = None,
                group_size: int = 128) -> ModelWeights:
    """Random weights drawn on the GPU in the backend's storage (bf16 matrices, f32 vectors); q/k/v and
    gate/up already fused, as build_weights would give. quant="awq": the linear layers as packed 4-bit weights
    (random codes, zero point 8, one scale giving about the bf16 draws' spread) in the form
    CUDABackend.upload_quantized gives (add_gemm_layout: the 4-bit GEMM's reordered copy, the row form only where
    read); embeddings and lm_head bf16."""
    from llmrs.errors import UserError

    cp = backend.cp
    draws = GpuDraws(backend, seed)
    if quant not in (None, "awq"):
        raise UserError(f"quant {quant!r}: synthetic GPU weights are bf16 (default) or awq")

    def qmat(rows: int, cols: int) -> Any:
        from llmrs.model.quant import DeviceQuantWeight

        if cols % group_size or group_size % 32:
            raise UserError(f"--group-size {group_size} must be a multiple of 32 dividing {cols}")
        words = draws.rs.randint(0, 1 << 16, size=(rows, cols // 4), dtype=cp.int32).astype(cp.uint16)
        qweight = cp.ascontiguousarray(words.view(cp.uint32))  # [rows, cols / 8]: 8 random 4-bit codes a word
        fp16 = lambda v: cp.full((rows, cols // group_size), v, dtype=cp.float16).view(cp.uint16)  # noqa: E731
        return backend.add_gemm_layout(DeviceQuantWeight("awq", rows, cols, group_size, qweight, fp16(STD / 4.6),
                                                         fp16(8.0)))

    lin = qmat if quant == "awq" else draws.mat
    h, i = c.hidden_size, c.intermediate_size
    n_qkv = c.q_size + 2 * c.kv_size
    ones = cp.full((h,), 1.0, dtype=cp.float32)  # the norms (read-only: one array serves them all)
    layers = [LayerWeights(input_norm=ones, qkv=lin(n_qkv, h), qkv_bias=draws.vec(n_qkv) if c.attention_bias else None,
                           o=lin(h, c.q_size), post_norm=ones, gate_up=lin(2 * i, h), down=lin(h, i))
              for _ in range(c.num_hidden_layers)]
    embed = draws.mat(c.vocab_size, h)
    lm_head = embed if c.tie_word_embeddings else draws.mat(c.vocab_size, h)
    return ModelWeights(embed=embed, layers=layers, norm=ones, lm_head=lm_head)


@dataclasses.dataclass
class SingleStream:
    """A synthetic preset on the GPU with one sequence's prompt prefilled (`single_stream`)."""

    config: ModelConfig
    backend: Any
    model: Any
    table: list[int]  # the sequence's block table (every block of the cache)
    state: Any  # its greedy SamplingState
    bs: int  # block size
    tok: int  # the token sampled after the prompt
    build_s: float  # seconds to draw the weights on the GPU
    prefill_s: float  # seconds of the prompt's (eager) prefill and its sample


def single_stream(preset: str, prompt_len: int, decode_tokens: int, quant: str | None = None,
                  group_size: int = 128) -> SingleStream:
    """The CUDA backend and synthetic weights of `preset`, a KV cache for one sequence of prompt_len +
    decode_tokens tokens, and a random prompt (seed 0) prefilled and sampled greedily: the set-up of the
    single-stream decode bench and of scripts/ablate_decode.py."""
    from llmrs.backends.cuda import CUDABackend, CUDAModel
    from llmrs.engine.batch import build_step_batch
    from llmrs.engine.sampling import SamplingParams, SamplingState, make_generator

    c = preset_config(preset)
    bs = 16
    blocks = -(-(prompt_len + decode_tokens) // bs)
    backend = CUDABackend(c, num_blocks=blocks, block_size=bs)
    t0 = time.perf_counter()
    model = CUDAModel(c, gpu_weights(c, backend, quant=quant, group_size=group_size), backend)
    backend.synchronize()
    build_s = time.perf_counter() - t0
    table = list(range(blocks))
    prompt = np.random.default_rng(0).integers(0, c.vocab_size, prompt_len).tolist()
    state = SamplingState(SamplingParams(temperature=0.0), make_generator(0), prompt, [], [])
    t0 = time.perf_counter()
    logits = model.forward_device(build_step_batch([(prompt, 0, table, True)], bs))
    tok = backend.sample(logits, [state])[0].token_id
    return SingleStream(c, backend, model, table, state, bs, tok, build_s, time.perf_counter() - t0)


def run_ahead_intervals(model: Any, backend: Any, state: Any, prompt_len: int, table: list[int], bs: int,
                        warmup: int, steps: int) -> list[float]:
    """Seconds between consecutive tokens of `steps` single-stream decode steps after `warmup`, the engine's way
    (async scheduling, stream_generate's run-ahead): each step is launched before the previous step's token is
    back, its input fed on the device; positions prompt_len on (the same KV reads each call)."""
    from llmrs.engine.batch import build_step_batch

    feed = np.zeros(1, dtype=np.int32)
    cached, prev, times = prompt_len, None, []
    pending = None
    for k in range(warmup + steps + 1):
        batch = build_step_batch([([0], cached, table, True)], bs)
        batch.feed = feed
        nxt = backend.sample_launch(model.forward_device(batch), [state])
        cached += 1
        if pending is not None:
            pending.wait()
            now = time.perf_counter()
            if prev is not None and k > warmup:
                times.append(now - prev)
            prev = now
        pending = nxt
    pending.wait()
    return times


def decode_benchmark(preset: str, prompt_len: int = 128, steps: int = 128, warmup: int = 8,
                     bandwidth_gbs: float | None = None, quant: str | None = None,
                     group_size: int = 128) -> dict[str, Any]:
    """Single-stream greedy decode of a synthetic `preset` on the GPU: ms/token against the bandwidth floor
    (bytes a batch-1 step must read: every streamed weight + the KV read at the mean context, from the
    roofline cost model). `ms_per_token`: the median interval between tokens with each step launched before the
    previous token is back (how the engine decodes, async scheduling); `ms_per_token_sync`: the median step
    when the host waits for each token before launching the next (what this bench reported before)."""
    from llmrs.engine.batch import build_step_batch
    from llmrs.roofline.cost import ModelCost
    from llmrs.roofline.formats import get_format

    ss = single_stream(preset, prompt_len, warmup + steps + 1, quant, group_size)
    c, backend, model, table, state, bs, tok = ss.config, ss.backend, ss.model, ss.table, ss.state, ss.bs, ss.tok
    build_s, prefill_s = ss.build_s, ss.prefill_s
    cached = prompt_len
    times = []
    for k in range(warmup + steps):
        t = time.perf_counter()
        logits = model.forward_device(build_step_batch([([tok], cached, table, True)], bs))
        tok = backend.sample(logits, [state])[0].token_id  # a device->host copy: the step is finished
        if k >= warmup:
            times.append(time.perf_counter() - t)
        cached += 1
    ms_sync = 1000 * float(np.median(times))
    ahead_times = run_ahead_intervals(model, backend, state, prompt_len, table, bs, warmup, steps)
    ms = 1000 * float(np.median(ahead_times))
    mean_ctx = prompt_len + warmup + steps // 2
    fmt = get_format("bf16" if quant is None else "awq")
    if quant is not None and group_size != 128:
        fmt = dataclasses.replace(fmt, bits_per_weight=4 + 32 / group_size)
    cost = ModelCost.build(c, fmt).decode_step(1, mean_ctx)
    out = {"preset": preset, "weights": quant or "bf16", "prompt_len": prompt_len, "steps": steps, "ms_per_token": round(ms, 4),
           "tok_s": round(1000 / ms, 1), "ms_mean": round(1000 * float(np.mean(ahead_times)), 4),
           "ms_per_token_sync": round(ms_sync, 4),
           "bytes_per_step": cost.bytes, "achieved_gbs": round(cost.bytes / (ms * 1e-3) / 1e9, 1),
           "prefill_ms": round(1000 * prefill_s, 2), "weights_built_s": round(build_s, 2)}
    for label, bw in (("datasheet", 4800.0), ("measured", bandwidth_gbs)):
        if bw:
            floor_ms = cost.bytes / (bw * 1e9) * 1000
            out[f"floor_ms_{label}"] = round(floor_ms, 4)
            out[f"fraction_of_floor_{label}"] = round(floor_ms / ms, 3)
    del model, backend
    return out
