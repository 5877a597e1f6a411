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
from typing import Any

import numpy as np

from llmrs.errors import UserError

# ------------------------------------------------------------------ GGUF block formats
# Each block covers 32 weights of one row. Little-endian.
#   Q8_0: f16 d, int8 q[32]                    x = d * q
#   Q4_0: f16 d, uint8 qs[16]                  x = d * (nibble - 8)
#   Q4_1: f16 d, f16 m, uint8 qs[16]           x = d * nibble + m
#   Q5_0: f16 d, u32 qh, uint8 qs[16]          x = d * (q - 16), q = nibble | bit j of qh << 4
#   Q5_1: f16 d, f16 m, u32 qh, uint8 qs[16]   x = d * q + m
# In Q4_* / Q5_*, qs[j] holds weight j in its low nibble and weight j + 16 in its high nibble.
# The k-quants (llama.cpp's Q2_K .. Q6_K, what Q4_K_M / Q5_K_M / Q6_K files are made of) cover 256 weights a
# "super-block" of 16-weight or 32-weight sub-blocks, each with its own quantized scale (and min):
#   Q2_K (84 B):  uint8 scales[16] (scale | min << 4), uint8 qs[64] (2 bits), f16 d, f16 dmin
#   Q3_K (110 B): uint8 hmask[32] (3rd bit), uint8 qs[64] (2 bits), uint8 scales[12] (16 x 6 bits), f16 d
#   Q4_K (144 B): f16 d, f16 dmin, uint8 scales[12] (8 x 6-bit scale + 6-bit min), uint8 qs[128]
#   Q5_K (176 B): f16 d, f16 dmin, uint8 scales[12], uint8 qh[32] (5th bit), uint8 qs[128]
#   Q6_K (210 B): uint8 ql[128] (low 4 bits), uint8 qh[64] (high 2 bits), int8 scales[16], f16 d
# decoded below as llama.cpp's dequantize_row_* decodes them (tests/model/test_gguf.py: equal to gguf-py's reference).
# Only GGUF loading reads them: they are expanded at load (f32 here, bf16 on the GPU), not kept quantized.
QK = 32
GGML_F32, GGML_F16, GGML_Q4_0, GGML_Q4_1, GGML_Q8_0, GGML_BF16 = 0, 1, 2, 3, 8, 30
GGML_Q5_0, GGML_Q5_1, GGML_Q2_K, GGML_Q3_K, GGML_Q4_K, GGML_Q5_K, GGML_Q6_K = 6, 7, 10, 11, 12, 13, 14


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


def _f16(blocks: np.ndarray, at: int) -> np.ndarray:
    """The f16 at byte `at` of each block, as an f32 column [n, 1]."""
    return blocks[:, at:at + 2].copy().view(np.float16).astype(np.float32)


def _q5_codes(blocks: np.ndarray, qh_at: int, qs_at: int) -> np.ndarray:
    """[n, 32] 5-bit codes of Q5_0 / Q5_1 blocks: nibble | (bit j of the u32 qh) << 4."""
    qh = blocks[:, qh_at:qh_at + 4].copy().view("<u4")  # [n, 1]
    high = ((qh >> np.arange(32, dtype=np.uint32)) & 1).astype(np.uint8) << 4
    return _nibbles(blocks[:, qs_at:qs_at + 16]) + high.astype(np.float32)


def dequant_q5_0(raw: np.ndarray) -> np.ndarray:
    blocks = raw.reshape(-1, 22)
    return (_f16(blocks, 0) * (_q5_codes(blocks, 2, 6) - 16.0)).reshape(-1)


def dequant_q5_1(raw: np.ndarray) -> np.ndarray:
    blocks = raw.reshape(-1, 24)
    return (_f16(blocks, 0) * _q5_codes(blocks, 4, 8) + _f16(blocks, 2)).reshape(-1)


def _nibble_planes(qs: np.ndarray) -> np.ndarray:
    """Q4_K / Q5_K: [n, 4, 32] bytes -> [n, 8, 32] (each 32-byte chunk's low nibbles, then its high nibbles)."""
    return np.stack([qs & 0x0F, qs >> 4], axis=2).reshape(-1, 8, 32)


def _crumb_planes(q: np.ndarray) -> np.ndarray:
    """Q2_K / Q3_K / Q6_K: [n, 2, 32] bytes -> [n, 2, 4, 32], plane j = bits 2j, 2j + 1 of each byte."""
    return np.stack([(q >> (2 * j)) & 3 for j in range(4)], axis=2)


def _k_scale_min(sc: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K / Q5_K: the 8 sub-blocks' 6-bit scales and mins packed in 12 bytes -> two [n, 8] float arrays
    (llama.cpp's get_scale_min_k4)."""
    sc = sc.astype(np.uint8)
    lo_s, lo_m = sc[:, 0:4] & 63, sc[:, 4:8] & 63
    hi_s = (sc[:, 8:12] & 0x0F) | ((sc[:, 0:4] >> 6) << 4)
    hi_m = (sc[:, 8:12] >> 4) | ((sc[:, 4:8] >> 6) << 4)
    return (np.concatenate([lo_s, hi_s], axis=1).astype(np.float32),
            np.concatenate([lo_m, hi_m], axis=1).astype(np.float32))


def dequant_q4_k(raw: np.ndarray) -> np.ndarray:
    blocks = raw.reshape(-1, 144)
    scale, mins = _k_scale_min(blocks[:, 4:16])
    dl, ml = _f16(blocks, 0) * scale, _f16(blocks, 2) * mins  # [n, 8]: sub-block j covers weights 32 j ..
    qs = blocks[:, 16:144].reshape(-1, 4, 32)  # 4 chunks of 64 weights: low nibbles, then high nibbles
    q = _nibble_planes(qs).astype(np.float32)
    return (dl[:, :, None] * q - ml[:, :, None]).reshape(-1)


def dequant_q5_k(raw: np.ndarray) -> np.ndarray:
    blocks = raw.reshape(-1, 176)
    scale, mins = _k_scale_min(blocks[:, 4:16])
    dl, ml = _f16(blocks, 0) * scale, _f16(blocks, 2) * mins
    qh = blocks[:, 16:48]  # [n, 32]: bit j is the 5th bit of sub-block j's weight l
    qs = blocks[:, 48:176].reshape(-1, 4, 32)
    low = _nibble_planes(qs)
    high = (qh[:, None, :] >> np.arange(8, dtype=np.uint8)[None, :, None]) & 1
    q = (low + (high << 4)).astype(np.float32)
    return (dl[:, :, None] * q - ml[:, :, None]).reshape(-1)


def dequant_q6_k(raw: np.ndarray) -> np.ndarray:
    blocks = raw.reshape(-1, 210)
    ql = blocks[:, 0:128].reshape(-1, 2, 64)  # two halves of 128 weights
    qh = blocks[:, 128:192].reshape(-1, 2, 32)
    scales = blocks[:, 192:208].copy().view(np.int8).astype(np.float32).reshape(-1, 2, 8)
    d = _f16(blocks, 208)[:, :, None]  # [n, 1, 1]
    # weight 32 i + l of a half (i = 0..3, l = 0..31), as llama.cpp: low 4 bits ql[l] & 15, ql[l + 32] & 15,
    # ql[l] >> 4, ql[l + 32] >> 4 for i = 0, 1, 2, 3; high 2 bits (qh[l] >> 2 i) & 3; scale sc[l / 16 + 2 i]
    lo = np.stack([ql[:, :, :32] & 0x0F, ql[:, :, 32:] & 0x0F, ql[:, :, :32] >> 4, ql[:, :, 32:] >> 4], axis=2)
    hi = _crumb_planes(qh)  # [n, 2, 4, 32]
    q = (lo | (hi << 4)).astype(np.float32) - 32.0
    sc = scales.reshape(-1, 2, 4, 2)  # [n, half, i, l / 16]: sc[l / 16 + 2 i]
    sc = np.repeat(sc, 16, axis=3)  # [n, 2, 4, 32]
    return (d[:, :, :, None] * sc * q).reshape(-1)


def dequant_q2_k(raw: np.ndarray) -> np.ndarray:
    blocks = raw.reshape(-1, 84)
    sc = blocks[:, 0:16]
    qs = blocks[:, 16:80].reshape(-1, 2, 32)  # two halves of 128 weights, 32 bytes each
    d, dmin = _f16(blocks, 80), _f16(blocks, 82)
    dl = (d * (sc & 0x0F).astype(np.float32)).reshape(-1, 2, 4, 2)  # [n, half, shift j, 16-weight group]
    ml = (dmin * (sc >> 4).astype(np.float32)).reshape(-1, 2, 4, 2)
    q = _crumb_planes(qs).reshape(-1, 2, 4, 2, 16).astype(np.float32)
    return (dl[..., None] * q - ml[..., None]).reshape(-1)


def dequant_q3_k(raw: np.ndarray) -> np.ndarray:
    blocks = raw.reshape(-1, 110)
    hmask = blocks[:, 0:32]
    qs = blocks[:, 32:96].reshape(-1, 2, 32)
    a = blocks[:, 96:108].copy().view("<u4")  # [n, 3]
    d = _f16(blocks, 108)
    k1, k2 = np.uint32(0x03030303), np.uint32(0x0F0F0F0F)
    aux = np.stack([(a[:, 0] & k2) | (((a[:, 2] >> 0) & k1) << 4), (a[:, 1] & k2) | (((a[:, 2] >> 2) & k1) << 4),
                    ((a[:, 0] >> 4) & k2) | (((a[:, 2] >> 4) & k1) << 4),
                    ((a[:, 1] >> 4) & k2) | (((a[:, 2] >> 6) & k1) << 4)], axis=1).astype("<u4")
    scales = aux.view(np.int8).astype(np.float32) - 32.0  # [n, 16]
    dl = (d * scales).reshape(-1, 2, 4, 2)  # [n, half, shift j, 16-weight group]
    low = _crumb_planes(qs).reshape(-1, 2, 4, 2, 16)
    # the 3rd bit: bit (4 half + j) of hmask[l] (l = 16 group + position); a clear bit subtracts 4
    bits = np.arange(8, dtype=np.uint8).reshape(2, 4)
    hm = (hmask.reshape(-1, 1, 1, 2, 16) >> bits[None, :, :, None, None]) & 1
    q = low.astype(np.float32) - np.where(hm == 1, 0.0, 4.0).astype(np.float32)
    return (dl[..., None] * q).reshape(-1)


def bf16_to_f32(raw_u16: np.ndarray) -> np.ndarray:
    return (raw_u16.astype(np.uint32) << 16).view(np.float32)


def bf16_bits(a: np.ndarray) -> np.ndarray:
    """The bf16 words (uint16) of float32 values, round to nearest even; NaN stays NaN."""
    u = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)
    r = ((u + np.uint32(0x7FFF) + ((u >> 16) & np.uint32(1))) >> 16).astype(np.uint16)
    nan = (u & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000)
    if nan.any():
        r[nan] = ((u[nan] >> 16) | np.uint32(0x40)).astype(np.uint16)
    return r


def round_bf16(a: np.ndarray) -> np.ndarray:
    """float32 values rounded to the nearest bf16 (ties to even), as float32: what the GPU stores."""
    return bf16_to_f32(bf16_bits(a))


_DEQUANT = {GGML_Q8_0: dequant_q8_0, GGML_Q4_0: dequant_q4_0, GGML_Q4_1: dequant_q4_1, GGML_Q5_0: dequant_q5_0,
            GGML_Q5_1: dequant_q5_1, GGML_Q2_K: dequant_q2_k, GGML_Q3_K: dequant_q3_k, GGML_Q4_K: dequant_q4_k,
            GGML_Q5_K: dequant_q5_k, GGML_Q6_K: dequant_q6_k}


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


class _GGUFTruncated(Exception):
    """A read past the end of a GGUF file (args: the byte it needed)."""


def open_gguf(path: Path) -> Any:
    """gguf.GGUFReader over `path`; a truncated, empty or otherwise unreadable file is a UserError."""
    from gguf import GGUFReader

    class Reader(GGUFReader):
        # NOTE: GGUFReader slices its memmap unchecked, so a file cut short fails later with a reshape error
        # ("cannot reshape array of size ..."); every read goes through _get, and here one past the end says so
        def _get(self, offset: int, dtype: Any, count: int = 1, *args: Any, **kwargs: Any) -> Any:
            end = int(offset) + np.dtype(dtype).itemsize * int(count)
            if end > len(self.data):
                raise _GGUFTruncated(end)
            return super()._get(offset, dtype, count, *args, **kwargs)

    path = Path(path)
    try:
        if path.stat().st_size == 0:
            raise UserError(f"{path}: empty file, not a GGUF model")
        return Reader(str(path))
    except _GGUFTruncated as e:
        raise UserError(f"{path}: truncated GGUF file ({path.stat().st_size:,} bytes; its contents run to at least "
                        f"byte {e.args[0]:,})") from None
    except UserError:
        raise
    except Exception as e:  # the reader raises assorted errors on corrupt files
        raise UserError(f"{path}: not a readable GGUF file ({type(e).__name__}: {e})") from None


class GGUFFile:
    """A parsed GGUF file: metadata as plain Python values, tensors dequantized on request."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.reader = open_gguf(self.path)
        self.metadata: dict = {}
        for key, field in self.reader.fields.items():
            if key in ("tokenizer.ggml.tokens", "tokenizer.ggml.merges", "tokenizer.ggml.token_type",
                       "tokenizer.ggml.scores"):
                continue
            try:
                self.metadata[key] = field.contents()
            except Exception:
                continue
        self.tensors = {t.name: t for t in self.reader.tensors}

    def _array(self, key: str, cast: Any) -> list:
        field = self.reader.fields.get(key)
        return [] if field is None else [cast(x) for x in field.contents()]

    def string_array(self, key: str) -> list[str]:
        return self._array(key, str)

    def int_array(self, key: str) -> list[int]:
        return self._array(key, int)

    def float_array(self, key: str) -> list[float]:
        return self._array(key, float)

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
    (llmrs.model.quant.QuantWeight, rows in HF order); embeddings and the output layer are always float32."""
    from llmrs.model.quant import GGUF_QUANT_SOURCES, LINEAR_SUFFIXES, gguf_to_rows

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
