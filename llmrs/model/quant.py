"""Quantized linear weights: AWQ (AutoAWQ GEMM packing) and GGUF Q4_0 / Q4_1 / Q8_0, in one row-major form.

Formats as stored (w = the weight, q = the integer code):

- AWQ, 4-bit, zero point, group size G along the input dim (AutoAWQ "gemm" version), in safetensors:
  `qweight` int32 [in, out/8], `qzeros` int32 [in/G, out/8], `scales` fp16 [in/G, out];
  w[o, i] = (q[i, o] - z[i // G, o]) * s[i // G, o]. Eight 4-bit codes per int32 along the *output* dim,
  interleaved: nibble k (bits 4k..4k+3) of column c holds output 8c + AWQ_ORDER[k] (AWQ_ORDER =
  [0, 2, 4, 6, 1, 3, 5, 7]; unpacking reads nibbles 0..7 and reorders by AWQ_REVERSE_ORDER =
  [0, 4, 1, 5, 2, 6, 3, 7], as AutoAWQ's `unpack_awq` / `reverse_awq_order` and vLLM's awq dequant do).
- GGUF blocks of 32 along each row (layouts at the top of weights.py): Q4_0 w = d * (q - 8),
  Q4_1 w = d * q + m, Q8_0 w = d * q (q int8).

`QuantWeight` is every one of them repacked once at load into rows (HF layout [N out, K in], rows
independent, so q/k/v and gate/up fuse by stacking rows, and llama.cpp's q/k row permutation is a row take):

    kind "q4": qweight uint32 [N, K/8]; word j of row n holds k = 8j .. 8j+7, code of k = 8j+i in bits 4i..4i+3
               (natural order: one 16-byte load = 32 consecutive weights of one row, the matvec's unit)
               scales fp16 [N, K/G]; zeros fp16 [N, K/G]:
                 mode "zero": w = (q - z) * s   (AWQ: z its zero point; Q4_0: zeros None, z = 8)
                 mode "min":  w = q * s + m     (Q4_1: zeros holds m)
    kind "q8": qweight int8 [N, K], scales fp16 [N, K/32], w = q * s (Q8_0)

Bytes per weight on the GPU: AWQ 4 + 32/G (fp16 s + fp16 z per group: 4.25 at G = 128), Q4_0 4.5,
Q4_1 5, Q8_0 8.5 (the values of llmrs/roofline/formats.py).

`dequantize()` is exact float32 (the CPU reference): every product above is exact in float32 (a <= 5-bit
integer times an fp16), and Q4_1's one addition rounds as numpy rounds it. NOTE: AutoAWQ / vLLM dequantize
in fp16, which rounds (q - z) * s to 11 bits; ours keeps the exact value.

AWQ checkpoints that llmrs writes (llmrs.bench.checkpoint.write_awq_checkpoint) are quantized by round-to-nearest
(`awq_quantize`: min/max per group), not by AWQ's activation-aware scale search: the format is identical, the
accuracy of a real AWQ model is not claimed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from llmrs.errors import UserError

AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)  # nibble k of a packed int32 holds column 8c + AWQ_ORDER[k]
AWQ_REVERSE_ORDER = (0, 4, 1, 5, 2, 6, 3, 7)  # column j of a group of 8 sits in nibble AWQ_REVERSE_ORDER[j]
AWQ_GROUP_SIZE = 128
LINEAR_SUFFIXES = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                   "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")
_SHIFTS = np.arange(0, 32, 4, dtype=np.uint32)


# ---------------------------------------------------------------------- AWQ (AutoAWQ GEMM packing)
def awq_pack(codes: np.ndarray) -> np.ndarray:
    """4-bit codes [rows, cols] (cols % 8 == 0) -> int32 [rows, cols/8] in AutoAWQ's interleaved order."""
    rows, cols = codes.shape
    assert cols % 8 == 0, cols
    c = codes.astype(np.uint32).reshape(rows, cols // 8, 8)
    assert int(c.max(initial=0)) < 16, "codes must be 4-bit"
    out = np.zeros((rows, cols // 8), dtype=np.uint32)
    for k, col in enumerate(AWQ_ORDER):
        out |= c[:, :, col] << np.uint32(4 * k)
    return out.view(np.int32)


def awq_unpack(packed: np.ndarray) -> np.ndarray:
    """int32 [rows, cols/8] (AutoAWQ order) -> uint8 codes [rows, cols]."""
    u = np.ascontiguousarray(packed).view(np.uint32)
    nib = (u[:, :, None] >> _SHIFTS) & np.uint32(0xF)  # nib[..., k] = nibble k
    return nib[:, :, list(AWQ_REVERSE_ORDER)].reshape(u.shape[0], -1).astype(np.uint8)


def awq_dequantize(qweight: np.ndarray, qzeros: np.ndarray, scales: np.ndarray, group_size: int) -> np.ndarray:
    """Exact float32 weight in HF layout [out, in] from AutoAWQ tensors."""
    q = awq_unpack(qweight).astype(np.float32)  # [in, out]
    z = np.repeat(awq_unpack(qzeros).astype(np.float32), group_size, axis=0)
    s = np.repeat(np.asarray(scales, dtype=np.float16).astype(np.float32), group_size, axis=0)
    return np.ascontiguousarray(((q - z) * s).T)


def awq_quantize(w: np.ndarray, group_size: int = AWQ_GROUP_SIZE) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Round-to-nearest 4-bit with a zero point per group (AutoAWQ's pseudo-quantizer without the activation-aware
    scale search): w [out, in] float -> (qweight int32 [in, out/8], qzeros int32 [in/G, out/8], scales fp16 [in/G, out])."""
    out_f, in_f = w.shape
    if in_f % group_size or out_f % 8:
        raise UserError(f"AWQ needs in % group_size == 0 and out % 8 == 0 (shape {w.shape}, group {group_size})")
    g = np.asarray(w, dtype=np.float32).T.reshape(in_f // group_size, group_size, out_f)
    mx, mn = g.max(axis=1), g.min(axis=1)
    scales = (np.maximum(mx - mn, 1e-5) / 15.0).astype(np.float16)
    s = scales.astype(np.float32)
    zeros = np.clip(-np.round(mn / s), 0, 15)
    q = np.clip(np.round(g / s[:, None, :]) + zeros[:, None, :], 0, 15).reshape(in_f, out_f)
    return awq_pack(q.astype(np.uint8)), awq_pack(zeros.astype(np.uint8)), scales


# ---------------------------------------------------------------------- the row-major form
def pack_rows(codes: np.ndarray) -> np.ndarray:
    """4-bit codes [N, K] (K % 8 == 0) -> uint32 [N, K/8], code k = 8j + i in bits 4i of word j."""
    N, K = codes.shape
    c = codes.astype(np.uint32).reshape(N, K // 8, 8)
    return np.bitwise_or.reduce(c << _SHIFTS, axis=2).astype(np.uint32)


def unpack_rows(words: np.ndarray) -> np.ndarray:
    """uint32 [N, K/8] -> uint8 codes [N, K]."""
    return ((words[:, :, None] >> _SHIFTS) & np.uint32(0xF)).reshape(words.shape[0], -1).astype(np.uint8)


class _QuantLayout:
    """What a quantized weight's layout implies, shared by the host (QuantWeight) and GPU (DeviceQuantWeight) forms."""

    __slots__ = ()
    source: str
    N: int
    K: int
    qweight: Any
    scales: Any
    zeros: Any

    @property
    def kind(self) -> str:
        return "q8" if self.source == "q8_0" else "q4"

    @property
    def mode(self) -> str:
        return "min" if self.source == "q4_1" else "zero"

    @property
    def shape(self) -> tuple[int, int]:
        return (self.N, self.K)

    @property
    def nbytes(self) -> int:
        return int(self.qweight.nbytes + self.scales.nbytes + (0 if self.zeros is None else self.zeros.nbytes))


@dataclass(slots=True)
class QuantWeight(_QuantLayout):
    """One quantized linear weight, logical shape [N out, K in] (see the module docstring for the layouts)."""

    source: str  # "awq" | "q4_0" | "q4_1" | "q8_0"
    N: int
    K: int
    group_size: int
    qweight: np.ndarray
    scales: np.ndarray  # fp16 [N, K/G]
    zeros: np.ndarray | None = None  # fp16 [N, K/G] or None


    def codes(self) -> np.ndarray:
        """The integer codes [N, K] (uint8 for q4, int8 for q8)."""
        return self.qweight if self.kind == "q8" else unpack_rows(self.qweight)

    def dequantize(self) -> np.ndarray:
        """Exact float32 [N, K]."""
        G = self.group_size
        q = self.codes().astype(np.float32)
        s = np.repeat(self.scales.astype(np.float32), G, axis=1)
        if self.kind == "q8":
            return s * q
        if self.mode == "min":
            return s * q + np.repeat(self.zeros.astype(np.float32), G, axis=1)
        z = np.float32(8.0) if self.zeros is None else np.repeat(self.zeros.astype(np.float32), G, axis=1)
        return (q - z) * s

    def take_rows(self, rows: np.ndarray) -> "QuantWeight":
        z = None if self.zeros is None else self.zeros[rows]
        return QuantWeight(self.source, len(rows), self.K, self.group_size, self.qweight[rows], self.scales[rows], z)


def stack_rows(parts: list[Any]) -> Any:
    """Fuse linear weights by rows (q/k/v, gate/up): one QuantWeight when all share a format, else float32."""
    first = parts[0]
    same = all(isinstance(p, QuantWeight) and (p.source, p.K, p.group_size) == (first.source, first.K, first.group_size)
               for p in parts)
    if not same:
        return np.concatenate([p.dequantize() if isinstance(p, QuantWeight) else p for p in parts])
    zeros = None if first.zeros is None else np.concatenate([p.zeros for p in parts])
    return QuantWeight(first.source, sum(p.N for p in parts), first.K, first.group_size,
                       np.concatenate([p.qweight for p in parts]), np.concatenate([p.scales for p in parts]), zeros)


def awq_to_rows(qweight: np.ndarray, qzeros: np.ndarray, scales: np.ndarray, group_size: int) -> QuantWeight:
    """AutoAWQ tensors -> QuantWeight (the repacking done once at load)."""
    K, N = qweight.shape[0], qweight.shape[1] * 8
    if K % group_size or K % 32 or group_size % 32:
        raise UserError(f"AWQ weight [{N}, {K}]: in-features must be a multiple of the group size {group_size}, "
                        f"and the group size of 32")
    if qzeros.shape != (K // group_size, N // 8) or scales.shape != (K // group_size, N):
        raise UserError(f"AWQ weight [{N}, {K}]: qzeros {qzeros.shape} / scales {scales.shape} do not match "
                        f"group size {group_size}")
    codes = awq_unpack(qweight).T  # [N, K]
    zeros = awq_unpack(qzeros).T.astype(np.float16)
    return QuantWeight("awq", N, K, group_size, pack_rows(np.ascontiguousarray(codes)),
                       np.ascontiguousarray(np.asarray(scales, dtype=np.float16).T), np.ascontiguousarray(zeros))


def rows_to_awq(w: QuantWeight) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The inverse of awq_to_rows (for the round-trip test and for writing checkpoints)."""
    assert w.source == "awq"
    return (awq_pack(w.codes().T), awq_pack(w.zeros.astype(np.uint8).T),
            np.ascontiguousarray(w.scales.T))


GGUF_QUANT_SOURCES = {2: "q4_0", 3: "q4_1", 8: "q8_0"}  # GGML type id -> source


def gguf_to_rows(raw: np.ndarray, ggml_type: int, N: int, K: int) -> QuantWeight:
    """A GGUF Q4_0 / Q4_1 / Q8_0 tensor's raw block bytes (rows of K/32 blocks) -> QuantWeight."""
    source = GGUF_QUANT_SOURCES[ggml_type]
    bsz = {"q4_0": 18, "q4_1": 20, "q8_0": 34}[source]
    b = np.ascontiguousarray(raw, dtype=np.uint8).reshape(N, K // 32, bsz)
    d = b[:, :, 0:2].copy().view(np.float16).reshape(N, K // 32)
    if source == "q8_0":
        q = b[:, :, 2:].copy().view(np.int8).reshape(N, K)
        return QuantWeight(source, N, K, 32, q, d)
    off = 2 if source == "q4_0" else 4
    qs = b[:, :, off:off + 16]
    codes = np.concatenate([qs & 0x0F, qs >> 4], axis=2).reshape(N, K)  # qs[j]: weight j low, j + 16 high
    m = b[:, :, 2:4].copy().view(np.float16).reshape(N, K // 32) if source == "q4_1" else None
    return QuantWeight(source, N, K, 32, pack_rows(codes), d, m)


# ---------------------------------------------------------------------- checkpoints
def awq_config(config: dict[str, Any]) -> dict[str, Any] | None:
    """config.json's quantization_config when it is AWQ we can run (None when unquantized); UserError otherwise."""
    qc = config.get("quantization_config")
    if not qc:
        return None
    method = str(qc.get("quant_method", "?")).lower()
    if method != "awq":
        raise UserError(f"quantization {method!r} is not supported (llmrs runs AWQ 4-bit checkpoints, GGUF Q4_0/"
                        f"Q4_1/Q8_0, and unquantized bf16/fp16/fp32)")
    bits, version = int(qc.get("bits", qc.get("w_bit", 4))), str(qc.get("version", "gemm")).lower()
    zero_point, G = bool(qc.get("zero_point", True)), int(qc.get("group_size", qc.get("q_group_size", 128)))
    if bits != 4 or version != "gemm" or not zero_point or G <= 0 or G % 32:
        raise UserError(f"AWQ variant not supported (bits {bits}, version {version}, zero_point {zero_point}, "
                        f"group_size {G}): llmrs runs 4-bit GEMM-packed AWQ with zero points, group size a "
                        f"multiple of 32")
    return {"quant_method": "awq", "bits": 4, "group_size": G, "zero_point": True, "version": "gemm"}


def awq_tensors(tensors: dict[str, np.ndarray], group_size: int, keep_quantized: bool) -> dict[str, Any]:
    """Replace every `X.qweight / X.qzeros / X.scales` triple by `X.weight`: a QuantWeight (keep_quantized) or
    its exact float32 dequantization. Everything else passes unchanged."""
    out: dict[str, Any] = {}
    for name, t in tensors.items():
        if name.endswith((".qzeros", ".scales")) and name.rsplit(".", 1)[0] + ".qweight" in tensors:
            continue
        if not name.endswith(".qweight"):
            out[name] = t
            continue
        p = name[: -len(".qweight")]
        if p + ".qzeros" not in tensors or p + ".scales" not in tensors:
            raise UserError(f"AWQ tensor {name} has no matching .qzeros / .scales")
        qw = awq_to_rows(tensors[name], tensors[p + ".qzeros"], tensors[p + ".scales"], group_size)
        out[p + ".weight"] = qw if keep_quantized else qw.dequantize()
    return out


# ---------------------------------------------------------------------- on the GPU
@dataclass(slots=True)
class DeviceQuantWeight(_QuantLayout):
    """A QuantWeight's arrays on the GPU (CUDABackend.upload_quantized), read by llmrs/kernels_cu/matvec_q4.cu:
    qweight uint32 [N, K/8] (q4) or int8 [N, K] (q8); scales / zeros as raw fp16 words (uint16)."""

    source: str
    N: int
    K: int
    group_size: int
    qweight: Any  # None once the backend dropped the row form (cuda_q4gemm.row_form_needed): marlin holds it
    scales: Any
    zeros: Any | None
    marlin: Any = None  # the same weight reordered for the 4-bit GEMM (cuda_q4gemm.MarlinWeight), or None

    @property
    def nbytes(self) -> int:
        """The format's packed bytes (codes + scales + zeros), from whichever copy the GPU holds."""
        # NOTE: _QuantLayout's by name: zero-argument super() fails in a slots dataclass (the class is rebuilt)
        return int(self.marlin.nbytes) if self.qweight is None else _QuantLayout.nbytes.fget(self)

    @property
    def gpu_nbytes(self) -> int:
        """Bytes the GPU holds for it: the row form and / or the GEMM's reordered copy."""
        row = 0 if self.qweight is None else self.nbytes
        return row + (0 if self.marlin is None else int(self.marlin.nbytes))


# ---------------------------------------------------------------------- Marlin-style GEMM layout (gemm_q4.cu)
# qweight uint32 [N/32, K/32, 32 lanes, 4 words]: lane L (g = L // 4, t = L % 4) of the 32 x 32 tile (nb, kb)
# holds in word i, nibble j the code of W[n, k] with n = 32 nb + 8 i + g and
# k = 32 kb + 16 (j >> 2) + 8 ((j >> 1) & 1) + 2 t + (j & 1): its mma.m16n8k16 B fragments (b0 = nibbles 0, 1;
# b1 = 2, 3 of the first k16 step, 4..7 the second) for four n8 tiles, in one 16-byte load.
# Written with `xp` (numpy or cupy): the backend reorders on the GPU, the tests on the CPU.
_MARLIN_FWD = (0, 3, 2, 6, 1, 4, 5, 7)  # (nb, i, g, kb, a, b, t, c) -> (nb, kb, g, t, i, a, b, c), j = 4a + 2b + c
_MARLIN_INV = (0, 4, 2, 1, 5, 6, 3, 7)
FP16_EIGHT = 0x4800  # fp16 8.0: Q4_0's implicit zero point


def marlin_reorder(qweight: Any, xp: Any = np) -> Any:
    """Row form uint32 [N, K/8] (natural nibble order) -> Marlin form uint32 [N/32, K/32, 32, 4]. N, K % 32 == 0."""
    N, K = qweight.shape[0], qweight.shape[1] * 8
    assert N % 32 == 0 and K % 32 == 0, (N, K)
    codes = xp.empty((N, K // 8, 8), dtype=xp.uint8)
    for j in range(8):  # nibble by nibble: temporaries of 4 bytes per 8 codes, not per code
        codes[:, :, j] = ((qweight >> np.uint32(4 * j)) & np.uint32(0xF)).astype(xp.uint8)
    tiles = xp.ascontiguousarray(codes.reshape(N // 32, 4, 8, K // 32, 2, 2, 4, 2).transpose(_MARLIN_FWD))
    tiles = tiles.reshape(-1, 8)
    out = xp.zeros(tiles.shape[0], dtype=xp.uint32)
    for j in range(8):
        out |= tiles[:, j].astype(xp.uint32) << np.uint32(4 * j)
    return out.reshape(N // 32, K // 32, 32, 4)


def marlin_unreorder(packed: Any, xp: Any = np) -> Any:
    """The inverse of marlin_reorder: uint32 [N/32, K/32, 32, 4] -> row form uint32 [N, K/8]."""
    NB, KB = packed.shape[0], packed.shape[1]
    flat = packed.reshape(-1)
    tiles = xp.empty((flat.shape[0], 8), dtype=xp.uint8)
    for j in range(8):
        tiles[:, j] = ((flat >> np.uint32(4 * j)) & np.uint32(0xF)).astype(xp.uint8)
    codes = xp.ascontiguousarray(tiles.reshape(NB, KB, 8, 4, 4, 2, 2, 2).transpose(_MARLIN_INV))
    codes = codes.reshape(NB * 32, KB * 4, 8)
    out = xp.zeros(codes.shape[:2], dtype=xp.uint32)
    for j in range(8):
        out |= codes[:, :, j].astype(xp.uint32) << np.uint32(4 * j)
    return out


def marlin_scales(scales: Any, zeros: Any | None, xp: Any = np) -> Any:
    """fp16 scales [N, K/G] and zeros / mins [N, K/G] (raw fp16 words or float16; None: Q4_0, z = 8) ->
    uint32 [K/G, N], s in the low half and z (or m) in the high half: one 4-byte word per group and column."""
    s = xp.ascontiguousarray(scales).view(xp.uint16).astype(xp.uint32)
    z = (xp.full(s.shape, FP16_EIGHT, dtype=xp.uint32) if zeros is None
         else xp.ascontiguousarray(zeros).view(xp.uint16).astype(xp.uint32))
    return xp.ascontiguousarray((s | (z << np.uint32(16))).T)
