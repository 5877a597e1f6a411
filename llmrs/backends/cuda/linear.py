"""The CUDA backend's linear layers and the norms / SiLU x up that feed them: the bf16 matvec (decode) or cuBLAS
gemmEx (bf16 x bf16 -> f32 or bf16), the paired-row matvecs with RoPE + KV write or SiLU x up fused (and the
RMSNorm folded in), and quantized weights (the 4-bit GEMV / GEMM of quant_linear.py, the 4-/8-bit matvec, or a
dequantized bf16 scratch for cuBLAS). Which form runs is dispatch.py's rules; these methods launch it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from llmrs.backends.cuda.dispatch import (MATVEC_ROWS_PER_BLOCK, NORM_STAGE_MAX_K, gemm_rows, matvec_nt,
                                          norm_threads)
from llmrs.backends.cuda.kernels import MATVEC_ROWS_R, NULL
from llmrs.backends.cuda.quant_linear import gemm_takes
from llmrs.model.quant import DeviceQuantWeight

if TYPE_CHECKING:
    from llmrs.backends.cuda.batch import DeviceBatch

CUDA_R_32F, CUDA_R_16BF, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT = 0, 14, 68, -1
CUBLAS_OP_N, CUBLAS_OP_T = 0, 1


def room_bytes(a: Any) -> int:
    """Bytes of device memory from a's first element to the end of the allocation it lies in."""
    return int(a.data.mem.size - (a.data.ptr - a.data.mem.ptr))


class LinearOps:
    """The linear-layer launches, mixed into CUDABackend (module docstring)."""

    def _cast_bf16(self, x: Any, out: Any) -> None:
        n = x.size
        self.k.cast_f32_bf16((min(65535, -(-n // 1024)),), (256,), (x, out, np.int64(n)))  # 4 a thread

    def _rms_norm(self, x: Any, w: Any, eps: float, out: Any, rows: Any = None, n_rows: int | None = None) -> None:
        H = x.shape[1]
        n = x.shape[0] if n_rows is None else n_rows
        threads = norm_threads(H)
        with self._span("rms_norm", "rms_norm", n, H):
            self.k.rms_norm((n,), (threads,), (x, NULL if rows is None else rows, w, out, np.int32(H), np.float32(eps)))

    def _linear(self, x: Any, w: Any, bias: Any | None, out: Any, accumulate: bool = False,
                name: str = "linear", out_bf16: bool = False, preload: bool = False) -> None:
        """out (=|+=) x @ w.T (+ bias). x f32 [T, K] contiguous, w bf16 [N, K], out f32 [T, N] contiguous.
        x may already be bf16 words (uint16) where `_gemm_takes_bf16(w, T)`: the GEMM then reads it uncast.
        out_bf16: `out` holds bf16 words (uint16), written by cuBLAS (f32 accumulate, one rounding at the store);
        only on that same GEMM path, without bias or accumulate. preload: a projection whose kernel may load its
        whole rows before the previous kernel is done (o after the attention): `matvec_rows` at one token."""
        x_bf16 = x.dtype == np.uint16
        assert not x_bf16 or self._gemm_takes_bf16(w, x.shape[0]), "bf16 activations only on the bf16 GEMM path"
        assert not out_bf16 or (self._gemm_out_bf16(w, x.shape[0]) and bias is None and not accumulate
                                and out.dtype == np.uint16), "a bf16 output only from the plain bf16 GEMM"
        if isinstance(w, DeviceQuantWeight):
            return self._linear_quant(x, w, bias, out, accumulate, name, out_bf16)
        T, K = x.shape
        N = w.shape[0]
        assert w.shape[1] == K and out.shape == (T, N)
        if T <= self.matvec_max_tokens:
            nt = matvec_nt(T)
            splits = self._matvec_splits(N, K)
            if (preload and T == 1 and self.matvec_rows and splits == 1 and K % 8 == 0
                    and K <= 256 * MATVEC_ROWS_R[-1]):
                r = next(r for r in MATVEC_ROWS_R if K <= 256 * r)  # 16-byte chunks a lane
                with self._span("matvec", name, T, N, K, accumulate, bias is not None):
                    getattr(self.k, f"matvec_rows_bf16_r{r}")(
                        (-(-N // MATVEC_ROWS_PER_BLOCK),), (32 * MATVEC_ROWS_PER_BLOCK,),
                        (w, x, NULL if bias is None else bias, out, np.int32(N), np.int32(K),
                         np.int32(1 if accumulate else 0)))
                return
            grid = (-(-N * splits // MATVEC_ROWS_PER_BLOCK), -(-T // nt))
            fn = getattr(self.k, f"matvec_bf16_t{nt}")
            with self._span("matvec", name, T, N, K, accumulate, bias is not None):
                fn(grid, (32 * MATVEC_ROWS_PER_BLOCK,),
                   (w, x, NULL if bias is None else bias, out, np.int32(N), np.int32(K), np.int32(T),
                    np.int32(1 if accumulate else 0), np.int32(splits)))
            return
        if x_bf16:
            xb = x
        else:
            xb = self._buf("gemm_x", (T, K), np.uint16)
            with self._span("cast", "cast_bf16 " + name, T * K):
                self._cast_bf16(x, xb)
        M = T  # the rows cuBLAS computes: gemm_rows(T) where both buffers have room (the padding rows unread)
        if self.gemm_pad_rows:
            Tp = gemm_rows(T)
            if Tp != T and room_bytes(xb) >= Tp * K * 2 and room_bytes(out) >= Tp * N * out.itemsize:
                M = Tp
        with self._span("gemm", name, T, N, K, accumulate, False, 2 if out_bf16 else 4):
            # row-major out[T, N] = x[T, K] @ w[N, K]^T  <=>  column-major out^T[N, T] = w^T' ... (op(A) = W^T view)
            gemm = self.cublas.gemmEx if self._raw_gemm is None else self._raw_gemm
            gemm(self._handle, CUBLAS_OP_T, CUBLAS_OP_N, N, M, K,
                 self._one_ptr, w.data.ptr, CUDA_R_16BF, K, xb.data.ptr, CUDA_R_16BF, K,
                 self._one_ptr if accumulate else self._zero_ptr, out.data.ptr,
                 CUDA_R_16BF if out_bf16 else CUDA_R_32F, N, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT)
        if bias is not None:
            n = T * N
            with self._span("add_bias", "add_bias " + name, T, N):
                self.k.add_bias((min(65535, -(-n // 256)),), (256,), (out, bias, np.int32(T), np.int32(N)))

    def _matvec_pair(self, epi: str, x: Any, w: Any, out: Any, bias: Any = None, db: DeviceBatch | None = None,
                     layer: int = 0, norm: tuple[Any, float] | None = None) -> None:
        """matvec.cu's paired-row kernels: "silu" (gate_up -> act [T, I] = silu(gate) * up) or "rope" (qkv + bias
        -> q rotated in `out`, k rotated and v into layer's cache); the same bits as `_linear` + silu_mul /
        rope_write_kv. With norm = (weight, eps), x is the residual stream and the RMSNorm before the projection is
        folded into it (the *_norm_* kernels: rms_norm's math by linearity, f32 rounding apart)."""
        T, K = x.shape
        N = w.shape[0]
        nt = matvec_nt(T)
        grid = (-(-(N // 2) // MATVEC_ROWS_PER_BLOCK), -(-T // nt))  # a pair a warp, 4 warps a block
        block = (32 * MATVEC_ROWS_PER_BLOCK,)
        tag = "norm_" if norm is not None else ""
        g, eps = (norm[0], np.float32(norm[1])) if norm is not None else (NULL, np.float32(0.0))
        # one token with the norm folded: the block stages x * g in K * 4 bytes of shared memory (matvec.cu
        # pair_norm_staged; the same condition as there)
        smem = 4 * K if norm is not None and nt == 1 and K % 8 == 0 and K <= NORM_STAGE_MAX_K else 0
        label = ("norm+" if norm is not None else "") + ("gate_up+silu" if epi == "silu" else "qkv+rope")
        if epi == "silu":
            args = (w, x, g, eps, out, np.int32(N), np.int32(K), np.int32(T)) if norm is not None else (
                w, x, out, np.int32(N), np.int32(K), np.int32(T))
            with self._span("matvec", label, T, N, K, False, False):
                self.k.fns[f"matvec_silu_{tag}bf16_t{nt}"](grid, block, args, shared_mem=smem)
            return
        c = self.config
        with self._span("matvec", label, T, N, K, False, bias is not None):
            self.k.fns[f"matvec_rope_{tag}bf16_t{nt}"](
                grid, block, (w, x, g, eps, NULL if bias is None else bias, out, np.int32(N), np.int32(K),
                              np.int32(T), db.positions, self.inv_freq, db.slots, self.k_cache[layer],
                              self.v_cache[layer], np.int32(c.num_attention_heads), np.int32(c.num_key_value_heads),
                              np.int32(c.head_dim), np.int32(self.block_size)), shared_mem=smem)

    def _linear_quant(self, x: Any, w: DeviceQuantWeight, bias: Any | None, out: Any, accumulate: bool,
                      name: str, out_bf16: bool = False) -> None:
        """_linear over a quantized weight: up to quant_matvec_max_tokens tokens the 4-bit GEMV (gemm_q4.cu's
        gemv_q4, where QuantLinearOps.gemv_takes) or the 4-/8-bit matvec (matvec_q4.cu) streams the packed weight; up
        to GEMV_MAX_TOKENS the GEMV; where quant_linear.gemm_takes the Marlin-style 4-bit GEMM (gemm_q4.cu, weights
        decoded to the same bf16 values --dequantize holds); above, the weight is dequantized into a bf16 scratch
        (bit-exact with the --dequantize weights) for cuBLAS."""
        T, K = x.shape
        N, G = w.N, w.group_size
        assert w.K == K and out.shape == (T, N)
        # 4-bit up to GEMV_MAX_TOKENS: the tensor-core GEMV over the GEMM's layout (gemm_q4.cu) where it is the
        # faster one, and always for a weight held only in that layout (QuantLinearOps.weight_on_gemv); the row-major
        # matvec for 8-bit, for one token of a smaller N, and for shapes the layout lacks (or without `q4_gemv`)
        if self.weight_on_gemv(w, T) and self.gemv_q4(x, w.marlin, bias, out, accumulate, name, w.nbytes):
            return
        if T <= self.quant_matvec_max_tokens:
            assert w.qweight is not None, f"{name}: only the reordered 4-bit copy is held; gemv_q4 refused {x.shape}"
            nt = matvec_nt(T)
            grid = (-(-N // MATVEC_ROWS_PER_BLOCK), -(-T // nt))
            b, acc = NULL if bias is None else bias, np.int32(1 if accumulate else 0)
            with self._span("matvec_q", name, T, N, K, accumulate, bias is not None, w.nbytes):
                if w.kind == "q8":
                    self.k.fns[f"matvec_q8_t{nt}"](grid, (32 * MATVEC_ROWS_PER_BLOCK,),
                                                   (w.qweight, w.scales, x, b, out, np.int32(N), np.int32(K),
                                                    np.int32(T), acc))
                else:
                    fn = self.k.fns[f"matvec_{'q4m' if w.mode == 'min' else 'q4z'}_t{nt}"]
                    fn(grid, (32 * MATVEC_ROWS_PER_BLOCK,),
                       (w.qweight, w.scales, NULL if w.zeros is None else w.zeros, x, b, out, np.int32(N),
                        np.int32(K), np.int32(T), np.int32(G), acc))
            return
        # the Marlin-style 4-bit GEMM (gemm_q4.cu); beyond quant_linear.gemm_takes dequantize + cuBLAS is faster.
        # x arrives as bf16 words where the wgmma form runs (`_gemm_takes_bf16`): the GEMM reads it uncast
        if gemm_takes(T, N, K, self.k.wgmma, self.k.wgmma_t256):
            assert not out_bf16, f"{name}: the 4-bit GEMM writes f32"
            if x.dtype == np.uint16:
                assert self.gemm_q4(x, w.marlin, bias, out, accumulate, name=name), f"{name}: bf16 x, no GEMM layout"
                return
            if self.linear_q4(x, w.marlin, bias, out, accumulate, name):
                return
        wb = self._buf("dequant_w", (N, K), np.uint16)
        grid = (min(65535, -(-(N * K // 8) // 256)),)  # a word (8 weights) a thread
        with self._span("dequant", name, N, K, w.nbytes):
            if w.marlin is not None:
                # from the GEMM layout wherever there is one: its kernel stores whole 16-byte runs (H200, the 7B's
                # down: 49 us a layer against the row form's 78)
                self.dequant_marlin(w.marlin, wb)
            elif w.kind == "q8":
                self.k.dequant_q8_bf16(grid, (256,), (w.qweight, w.scales, wb, np.int32(N), np.int32(K)))
            else:  # DQ_WORDS (4) words a thread a pass
                self.k.dequant_q4_bf16((min(65535, -(-grid[0] // 4)),), (256,),
                                       (w.qweight, w.scales, NULL if w.zeros is None else w.zeros, wb, np.int32(N),
                                        np.int32(K), np.int32(G), np.int32(1 if w.mode == "min" else 0)))
        self._linear(x, wb, bias, out, accumulate, name, out_bf16)

    def _rms_norm_bf16(self, x: Any, w: Any, eps: float, out: Any, y: Any = None, rows: Any = None,
                       n_rows: int | None = None) -> None:
        """rms_norm (or, with y, add_rms_norm: x += y first) into bf16 words `out` [n, H] (uint16): the bits
        cast_f32_bf16 makes of the f32 kernel's output (the same expression, block size and rounding)."""
        H = x.shape[1]
        n = x.shape[0] if n_rows is None else n_rows
        threads = norm_threads(H)
        assert out.dtype == np.uint16 and out.shape == (n, H)
        if y is None:
            with self._span("rms_norm", "rms_norm_bf16", n, H, 2):
                self.k.rms_norm_bf16((n,), (threads,), (x, NULL if rows is None else rows, w, out, np.int32(H),
                                                        np.float32(eps)))
        else:
            assert rows is None
            with self._span("rms_norm", "add_rms_norm_bf16", n, H, 2):
                self.k.add_rms_norm_bf16((n,), (threads,), (x, y, w, out, np.int32(H), np.float32(eps)))

    def _norm_for(self, lin: Any, x: Any, w: Any, eps: float, y: Any = None) -> Any:
        """The input of the linear over `lin`: rms_norm(x) (after x += y when y is given) in the "h" workspace
        (f32), or in "h_bf16" as bf16 words when `_gemm_takes_bf16` (no cast before the GEMM)."""
        T, H = x.shape
        if self._gemm_takes_bf16(lin, T):
            out = self._buf("h_bf16", (T, H), np.uint16)
            self._rms_norm_bf16(x, w, eps, out, y=y)
        else:
            out = self._buf("h", (T, H))
            if y is None:
                self._rms_norm(x, w, eps, out)
            else:
                self._add_rms_norm(x, y, w, eps, out)
        return out

    def _silu_mul_for(self, lin: Any, gu: Any) -> Any:
        """silu(gate) * up of gu [T, 2I], the input of the linear over `lin` (down): f32 in "act", or bf16 words
        in "act_bf16" when `_gemm_takes_bf16` (no cast before the GEMM). gu is f32, or bf16 words from a gate/up GEMM
        with a bf16 output (`_gate_up_bf16`, which has checked that down takes bf16: silu_mul_bf16_bf16)."""
        T, I = gu.shape[0], gu.shape[1] // 2
        gu_bf16 = gu.dtype == np.uint16
        if gu_bf16 or self._gemm_takes_bf16(lin, T):
            act = self._buf("act_bf16", (T, I), np.uint16)
            name = "silu_mul_bf16_bf16" if gu_bf16 else "silu_mul_bf16"
            with self._span("silu_mul", name, T, I, 2, *((2,) if gu_bf16 else ())):
                n = max(1, I // 16) if I % 8 == 0 else I // 4 if I % 4 == 0 else I  # threads a row (elementwise.cu)
                self.k.fns[name]((min(65535, -(-n // 256)), min(65535, T)), (256,),
                                 (gu, act, np.int32(T), np.int32(I)))
        else:
            act = self._buf("act", (T, I))
            n_el = T * I
            with self._span("silu_mul", "silu_mul", T, I):
                self.k.silu_mul((min(65535, -(-n_el // 256)),), (256,), (gu, act, np.int32(T), np.int32(I)))
        return act

    def _add_rms_norm(self, x: Any, y: Any, w: Any, eps: float, out: Any) -> None:
        """x += y (the residual), out = rms_norm(x): one launch."""
        T, H = x.shape
        with self._span("rms_norm", "add_rms_norm", T, H):
            self.k.add_rms_norm((T,), (norm_threads(H),), (x, y, w, out, np.int32(H), np.float32(eps)))
