"""Synthetic models the engine serves (`synthetic:PRESET`, `llmrs serve --synthetic`): a preset's exact shapes
(llmrs.model.presets) with random weights drawn directly on the GPU (no files, no host copies) and a byte-level BPE
tokenizer whose vocabulary has exactly vocab_size entries.

Weights are N(0, 0.02^2) (transformers' initializer_range), norms 1, biases N(0, 0.02^2): realistic scale for
timing, meaningless text. The same draws written to disk as a checkpoint: llmrs.bench.checkpoint (`llmrs synth`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from llmrs.engine.config import ModelConfig
from llmrs.errors import UserError
from llmrs.model.decoder import LayerWeights, ModelWeights
from llmrs.model.quant import DeviceQuantWeight
from llmrs.model.tokenizer import _bytes_to_unicode
from llmrs.model.weights import round_bf16

STD = 0.02
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


# ---------------------------------------------------------------------- tokenizer
def synthetic_vocab(size: int, special_ids: dict[int, str]) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """A byte-level BPE vocabulary of exactly `size` ids: the 256 byte symbols, then 2- and 3-symbol merges of the
    printable ASCII symbols (bytes 0x20-0x7e), with `special_ids` (id -> text) placed at their ids.

    Every token but the 128 single bytes above 0x7f decodes to complete text on its own. Random weights sample
    tokens about uniformly: with merges over all 256 bytes about half of them would end inside a UTF-8 character,
    the server would hold such a first token back until the next one completed it, and a benchmark's TTFT median
    would carry an extra decode step that a real model's English output does not."""
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
    cp = backend.cp
    draws = GpuDraws(backend, seed)
    if quant not in (None, "awq"):
        raise UserError(f"quant {quant!r}: synthetic GPU weights are bf16 (default) or awq")

    def qmat(rows: int, cols: int) -> Any:
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
