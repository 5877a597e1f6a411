"""Checkpoint readers: safetensors directories and GGUF files -> canonical (Hugging Face) tensor names.

Everything leaves here as float32 numpy arrays with Hugging Face layouts, so the forward pass is written
once. GGUF specifics handled here:
- block quantization (Q8_0, Q4_0, Q4_1) dequantized exactly, with our own numpy code (the 4-bit GPU issue
  reuses the block layouts documented below);
- llama.cpp's converter permutes the rows of Llama's q/k projections (it interleaves the two rotary halves
  of each head for its own RoPE kernel); `unpermute_qk` undoes that so the math matches the HF layout.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np

from llmrs.errors import UserError

# ------------------------------------------------------------------ GGUF block formats
# Each block covers 32 weights of one row. Little-endian.
#   Q8_0: f16 d, int8 q[32]                    x = d * q
#   Q4_0: f16 d, uint8 qs[16]                  x = d * (nibble - 8)
#   Q4_1: f16 d, f16 m, uint8 qs[16]           x = d * nibble + m
# In Q4_*, qs[j] holds weight j in its low nibble and weight j + 16 in its high nibble.
QK = 32
GGML_F32, GGML_F16, GGML_Q4_0, GGML_Q4_1, GGML_Q8_0, GGML_BF16 = 0, 1, 2, 3, 8, 30


def dequant_q8_0(raw: np.ndarray) -> np.ndarray:
    blocks = raw.reshape(-1, 34)
    d = blocks[:, :2].copy().view(np.float16).astype(np.float32)
    q = blocks[:, 2:].copy().view(np.int8).astype(np.float32)
    return (d * q).reshape(-1)


def _nibbles(qs: np.ndarray) -> np.ndarray:
    lo = qs & 0x0F
    hi = qs >> 4
    return np.concatenate([lo, hi], axis=1).astype(np.float32)


def dequant_q4_0(raw: np.ndarray) -> np.ndarray:
    blocks = raw.reshape(-1, 18)
    d = blocks[:, :2].copy().view(np.float16).astype(np.float32)
    return (d * (_nibbles(blocks[:, 2:]) - 8.0)).reshape(-1)


def dequant_q4_1(raw: np.ndarray) -> np.ndarray:
    blocks = raw.reshape(-1, 20)
    d = blocks[:, 0:2].copy().view(np.float16).astype(np.float32)
    m = blocks[:, 2:4].copy().view(np.float16).astype(np.float32)
    return (d * _nibbles(blocks[:, 4:]) + m).reshape(-1)


def bf16_to_f32(raw_u16: np.ndarray) -> np.ndarray:
    return (raw_u16.astype(np.uint32) << 16).view(np.float32)


_DEQUANT = {GGML_Q8_0: dequant_q8_0, GGML_Q4_0: dequant_q4_0, GGML_Q4_1: dequant_q4_1}


def unpermute_qk(w: np.ndarray, n_head: int) -> np.ndarray:
    """Undo llama.cpp's q/k row permutation (rows of each head: [r0, r_half, r1, r_half+1, ...] -> HF order)."""
    rows = w.shape[0]
    hd = rows // n_head
    return w.reshape(n_head, hd // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


_GGUF_NAMES = [
    (r"token_embd\.weight", "model.embed_tokens.weight"),
    (r"output_norm\.weight", "model.norm.weight"),
    (r"output\.weight", "lm_head.weight"),
    (r"blk\.(\d+)\.attn_norm\.weight", "model.layers.{}.input_layernorm.weight"),
    (r"blk\.(\d+)\.ffn_norm\.weight", "model.layers.{}.post_attention_layernorm.weight"),
    (r"blk\.(\d+)\.attn_q\.(weight|bias)", "model.layers.{}.self_attn.q_proj.{}"),
    (r"blk\.(\d+)\.attn_k\.(weight|bias)", "model.layers.{}.self_attn.k_proj.{}"),
    (r"blk\.(\d+)\.attn_v\.(weight|bias)", "model.layers.{}.self_attn.v_proj.{}"),
    (r"blk\.(\d+)\.attn_output\.weight", "model.layers.{}.self_attn.o_proj.weight"),
    (r"blk\.(\d+)\.ffn_gate\.weight", "model.layers.{}.mlp.gate_proj.weight"),
    (r"blk\.(\d+)\.ffn_up\.weight", "model.layers.{}.mlp.up_proj.weight"),
    (r"blk\.(\d+)\.ffn_down\.weight", "model.layers.{}.mlp.down_proj.weight"),
]


def gguf_to_hf_name(name: str) -> str | None:
    for pattern, target in _GGUF_NAMES:
        m = re.fullmatch(pattern, name)
        if m:
            return target.format(*m.groups())
    return None


class GGUFFile:
    """A parsed GGUF file: metadata as plain Python values, tensors dequantized on request."""

    def __init__(self, path: Path):
        from gguf import GGUFReader

        self.path = Path(path)
        try:
            self.reader = GGUFReader(str(path))
        except Exception as e:  # the reader raises assorted errors on truncated / corrupt files
            raise UserError(f"{path}: not a readable GGUF file ({type(e).__name__}: {e})") from None
        self.metadata: dict = {}
        for key, field in self.reader.fields.items():
            if key in ("tokenizer.ggml.tokens", "tokenizer.ggml.merges", "tokenizer.ggml.token_type"):
                continue
            try:
                self.metadata[key] = field.contents()
            except Exception:
                continue
        self.tensors = {t.name: t for t in self.reader.tensors}

    def string_array(self, key: str) -> list[str]:
        field = self.reader.fields.get(key)
        return [] if field is None else list(field.contents())

    def int_array(self, key: str) -> list[int]:
        field = self.reader.fields.get(key)
        return [] if field is None else [int(x) for x in field.contents()]

    def tensor_f32(self, name: str) -> np.ndarray:
        t = self.tensors[name]
        shape = tuple(int(x) for x in reversed(t.shape))  # GGUF lists dims fastest-first
        kind = int(t.tensor_type)
        data = np.asarray(t.data)
        if kind == GGML_F32:
            out = data.view(np.float32).reshape(-1)
        elif kind == GGML_F16:
            out = data.view(np.float16).astype(np.float32).reshape(-1)
        elif kind == GGML_BF16:
            out = bf16_to_f32(data.view(np.uint16).reshape(-1))
        elif kind in _DEQUANT:
            out = _DEQUANT[kind](data.view(np.uint8).reshape(-1))
        else:
            raise UserError(f"{self.path}: tensor {name} has unsupported GGUF type {t.tensor_type.name}")
        if out.size != int(np.prod(shape)):
            raise UserError(f"{self.path}: tensor {name} is truncated")
        return out.reshape(shape)

    def tensor_dtypes(self) -> dict[str, int]:
        """Bytes by GGUF tensor type name (for `llmrs info`)."""
        out: dict[str, int] = {}
        for t in self.reader.tensors:
            out[t.tensor_type.name] = out.get(t.tensor_type.name, 0) + int(t.n_bytes)
        return out


def load_gguf_weights(gf: GGUFFile, n_head: int, n_kv_head: int, arch: str,
                      keep_quantized: bool = False) -> dict[str, np.ndarray]:
    """HF-named tensors. With keep_quantized, Q4_0 / Q4_1 / Q8_0 linear weights stay quantized
    (llmrs.engine.quant.QuantWeight, rows in HF order); embeddings and the output layer are always float32."""
    from llmrs.engine.quant import GGUF_QUANT_SOURCES, LINEAR_SUFFIXES, gguf_to_rows

    weights: dict[str, np.ndarray] = {}
    for name in gf.tensors:
        hf = gguf_to_hf_name(name)
        if hf is None:
            continue  # e.g. rope_freqs: recomputed from the config
        t = gf.tensors[name]
        heads = n_head if ".self_attn.q_proj." in hf else n_kv_head if ".self_attn.k_proj." in hf else 0
        if keep_quantized and int(t.tensor_type) in GGUF_QUANT_SOURCES and hf[: -len(".weight")].endswith(LINEAR_SUFFIXES):
            N, K = (int(x) for x in reversed(t.shape))
            w = gguf_to_rows(np.asarray(t.data).view(np.uint8).reshape(-1), int(t.tensor_type), N, K)
            if arch == "llama" and heads:  # the q/k row permutation, applied to whole rows of blocks
                w = w.take_rows(unpermute_qk(np.arange(N)[:, None], heads)[:, 0])
            weights[hf] = w
            continue
        w = gf.tensor_f32(name)
        if arch == "llama" and heads:
            w = unpermute_qk(w, heads)
        weights[hf] = w
    return weights


# ------------------------------------------------------------------ safetensors
def safetensors_files(model_dir: Path) -> list[Path]:
    index = model_dir / "model.safetensors.index.json"
    if index.exists():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError) as e:
            raise UserError(f"{index}: malformed index ({e})") from None
        files = sorted({model_dir / f for f in weight_map.values()})
        missing = [f.name for f in files if not f.exists()]
        if missing:
            raise UserError(f"{model_dir}: shard(s) listed in the index are missing: {', '.join(missing)}")
        return files
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise UserError(f"{model_dir}: no *.safetensors files")
    return files


def load_safetensors_weights(model_dir: Path) -> tuple[dict[str, np.ndarray], dict[str, int]]:
    """All tensors of the checkpoint as float32, and bytes per stored dtype."""
    from safetensors import safe_open

    weights: dict[str, np.ndarray] = {}
    dtype_bytes: dict[str, int] = {}
    for f in safetensors_files(model_dir):
        header = _read_safetensors_header(f)
        for name, meta in header.items():
            if name.startswith("__"):
                continue
            dt = meta["dtype"]
            start, end = meta["data_offsets"]
            dtype_bytes[dt] = dtype_bytes.get(dt, 0) + end - start
        try:
            with safe_open(str(f), framework="numpy") as sf:
                for name in sf.keys():
                    if header[name]["dtype"] == "BF16":
                        weights[name] = _bf16_tensor(f, header, name)
                    elif header[name]["dtype"] in ("I32", "I64", "I16", "I8", "U8"):
                        weights[name] = sf.get_tensor(name)  # integers stay integers (AWQ's packed qweight)
                    else:
                        weights[name] = sf.get_tensor(name).astype(np.float32)
        except UserError:
            raise
        except Exception as e:
            raise UserError(f"{f}: cannot read safetensors file ({type(e).__name__}: {e})") from None
    return weights, dtype_bytes


def _read_safetensors_header(path: Path) -> dict:
    size = path.stat().st_size
    with open(path, "rb") as fh:
        head = fh.read(8)
        if len(head) < 8:
            raise UserError(f"{path}: truncated safetensors file (no header)")
        n = int.from_bytes(head, "little")
        if n > size - 8:
            raise UserError(f"{path}: truncated safetensors file (header says {n} bytes)")
        try:
            header = json.loads(fh.read(n))
        except json.JSONDecodeError:
            raise UserError(f"{path}: corrupt safetensors header") from None
    data_len = max((m["data_offsets"][1] for k, m in header.items() if not k.startswith("__")), default=0)
    if 8 + n + data_len > size:
        raise UserError(f"{path}: truncated safetensors file ({size} bytes, header needs {8 + n + data_len})")
    header["__header_len__"] = n
    return header


def _bf16_tensor(path: Path, header: dict, name: str) -> np.ndarray:
    """numpy has no bfloat16: read the raw uint16 and widen (exact)."""
    meta = header[name]
    start, end = meta["data_offsets"]
    offset = 8 + header["__header_len__"] + start
    raw = np.fromfile(path, dtype=np.uint16, count=(end - start) // 2, offset=offset)
    return bf16_to_f32(raw).reshape(meta["shape"])
