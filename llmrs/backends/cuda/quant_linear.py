"""The Marlin-style 4-bit GEMM (llmrs/kernels_cu/gemm_q4.cu) for the prefill / batched path of quantized linears.

`QuantLinearOps` (mixed into CUDABackend) holds the launches and the rules that read the backend: `to_marlin(w)`
reorders a DeviceQuantWeight once, on the GPU, into the kernel's layout (a MarlinWeight: one 16-byte load hands each
thread its mma fragments; scales and zeros as one word per group and column); `gemm_q4(x_bf16, mw, bias, out,
accumulate)` runs out[T, N] (=|+=) x @ W^T (+ bias) from it, `linear_q4` does the same from f32 x (cast into the
backend's `gemm_x` buffer first, as the cuBLAS path does), `gemv_q4` / `gemv_q4_pair` are the decode GEMV's forms.
The shape rules that need nothing of the backend stay module functions (`supported`, `gemm_takes`, `tile_rows`...).

The weights the kernel multiplies equal dequant_q4_bf16's bf16 values (see the top of gemm_q4.cu), so the
result equals dequantize + cuBLAS up to the f32 accumulation order.

Shapes: N % 64, K % 64, G a power of two >= 32 and K % G (to_marlin returns None otherwise: keep dequantize +
cuBLAS); any T.
Tiles: 128 columns x 16 MT tokens per block (MT 1 up to 16 tokens, 2 up to 32, 8 from MT8_FROM = 256, else 4);
when those tiles fill less than the GPU, K is split over grid.z (f32 partials, reduced in a fixed order: deterministic).

When: measured on the H200 (AWQ G 128, us; gemm_q4 / dequantize + cuBLAS): qkv 4608x3584 T 64: 50.8 / 73.8, T 192:
48.4 / 74.6, T 256: 64.0 / 73.7; down 3584x18944 T 192: 122.4 / 131.2, T 256: 170.6 / 136.0; gate_up 37888x3584
T 192: 205.6 / 221.9, T 256: 258.7 / 228.6. So the backend takes it for matvec_max_tokens < T <= MAX_TOKENS (192)
and dequantizes + cuBLAS above, where cuBLAS's larger tiles win (each further 64-token tile here re-reads and
re-decodes the weights).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from llmrs.backends.cuda.kernels import (GEMM_Q4_SILU_MT, GEMM_Q4W2_SMEM_BYTES, GEMM_Q4WG_SMEM_BYTES, GEMV_CPG, NULL,
                                         WG_BLOCKS_PER_SM, WG_SPLITS, gemm_q4_smem_bytes, launch_cluster, wg_cluster)
from llmrs.model.quant import DeviceQuantWeight, marlin_reorder, marlin_scales

THREADS = 128
BN = 128  # output columns per block
BK = 64  # k per pipeline stage
MIN_KT_PER_SPLIT = 8  # a K slice of at least 512 keeps the 3-4 stage pipeline worth filling
MAX_SPLITS = 16
MAX_TOKENS = 192  # above, dequantize + cuBLAS is faster (module docstring)
GEMV_MAX_TOKENS = 16  # gemv_q4: x's tokens are the columns of one n8 tile (gemv_q4z / q4m) or two (.._t16)
# The backend's decode path takes gemv_q4 (tensor cores, the Marlin layout) from 2 tokens, and for one token where
# it beats matvec_q4 (row layout, f32 FMA): where the 32-column tiles alone fill the GPU (gate_up), where K is long
# against N (down: K >= 4 N, GEMV_ONE_TOKEN_K_PER_N), and for a matrix of GEMV_ONE_TOKEN_MIN_WEIGHTS or more (the
# 7B's qkv). With the K slices as one cluster and the RoPE + KV write in the GEMV's epilogue (gemv_q4_pair), every
# shape won on the GEMV inside the decode step (H200, decode ms/token: 3B AWQ 1.457 -> 1.330, 0.5B AWQ 0.669 ->
# 0.621), although alone the 3B's o was 3.44 us on matvec_q4 against 3.59: so the size threshold is 0, and every
# 4-bit weight in the GEMM's layout takes the GEMV at one token and holds only that copy.
GEMV_MIN_TOKENS = 2
GEMV_ONE_TOKEN_K_PER_N = 4.0
GEMV_ONE_TOKEN_MIN_WEIGHTS = 0
GEMV_WARPS = 4  # GV_WARPS in gemm_q4.cu: warps per block (a block: one 32-column tile, K split over its warps)
GEMV_DEPTH = 4  # GV_DEPTH: k32 blocks a warp has in flight (its runs are multiples of it)
GEMV_BLOCKS_PER_SM = 4  # resident at once: 128 registers x 128 threads (ptx-check)
GEMV_SEM_TILES = 1 << 16  # per-tile counters of the split-K hand-off: N up to 2M columns
# On sm_90+ a split tile's S blocks are launched as one thread-block cluster (gemm_q4.cu: the partials pushed into
# the first block's shared memory; the same sums in the same order as the hand-off through L2) where 2 <= S <=
# GEMV_CLUSTER_MAX (GV_CLUSTER_MAX); more slices keep the hand-off. The pushes are st.async completing on that
# block's mbarrier. The backend's q4_gemv_cluster (False) keeps the hand-off everywhere. H200 (tools/bench_gemv_q4.py,
# AWQ G128, T = 1, inside a graph, us cluster / L2): 7B qkv S=3 6.32 / 7.30, o S=4 5.33 / 6.33, down S=4 15.42 /
# 16.24; 3B down S=4 7.93 / 8.47 but S=8 9.37 / 7.78 (clusters of 8 blocks wait for two SMs' room), and in the 3B's
# step S=8 clusters lost 2.6 us a layer where the 7B's S <= 4 won 2.1.
GEMV_CLUSTER_MAX = 4


@dataclass(slots=True)
class MarlinWeight:
    """A 4-bit weight [N, K] in gemm_q4.cu's layout: qweight uint32 [N/32, K/32, 32, 4] (quant.marlin_reorder),
    sz uint32 [K/G, N] (quant.marlin_scales: fp16 s low, fp16 z or m high); mode 0 zero point, 1 min."""

    N: int
    K: int
    group_size: int
    mode: int
    qweight: Any
    sz: Any

    @property
    def nbytes(self) -> int:
        return int(self.qweight.nbytes + self.sz.nbytes)


def supported(N: int, K: int, G: int) -> bool:
    """Shapes the reordered layout and its kernels take: G a power of two from 32 (the GEMM's scale row is
    k >> log2 G; AWQ 128, GGUF 32, GPTQ 32 / 64 / 128 all are)."""
    return N % 64 == 0 and K % BK == 0 and G >= 32 and G & (G - 1) == 0 and K % G == 0


def has_gemm_layout(kind: str, N: int, K: int, G: int) -> bool:
    """Whether a quantized weight gets the reordered copy (to_marlin): 4-bit, in a shape the kernels take."""
    return kind == "q4" and supported(N, K, G)


# From MT8_FROM tokens a block takes 8 m16 tiles (128 tokens; `gemm_q4z_m8`: 252 registers, 2 stages, 2 blocks an
# SM) instead of 4: each decoded weight fragment feeds 8 mma instead of 4 and each stage's weights are loaded once
# for 128 tokens. `llmrs ptx-check --sass` (sm_90, main loop): 595 instructions for 128 HMMA against m4's 437 for
# 64. Measured on the H200 (AWQ G128, us MT 8 / MT 4 / dequantize + cuBLAS): qkv 4608x3584 T 192 57.0 / 52.6 /
# 73.3, T 256 61.0 / 65.3 / 76.5; gate_up 37888x3584 T 192 225.9 / 188.4 / 208.6, T 256 226.3 / 239.9 / 202.8, T 512
# 396.2 / 467.9 / 283.7: MT 8 only from 256 tokens (0: never).
MT8_FROM = 256
# Up to MAX_TOKENS every 4-bit weight with the layout takes the GEMM; above, up to MAX_TOKENS_SMALL (MAX_TOKENS: off),
# those of at most SMALL_MAX_WEIGHTS weights too (at T 256 qkv measured 61.0 us against 76.5 for dequantize + cuBLAS,
# but a whole step has not measured it).
MAX_TOKENS_SMALL = MAX_TOKENS
SMALL_MAX_WEIGHTS = 64 << 20


# The Hopper form (gemm_q4.cu's gemm_q4wg{z,m}: wgmma, sm_90a, 128 tokens x 128 columns a block) from WG_FROM tokens up
# to WG_MAX_TOKENS where the backend takes it (Kernels.wgmma: a GPU with sm_90a; kernels.WGMMA); it then also takes
# the token counts above MAX_TOKENS that dequantize + cuBLAS had. Measured on the H200 (probes/bench_gemm_q4_forms.py,
# the 7B's AWQ linears, 28-layer sums in ms at 64 / 128 / 256 / 512 / 1024 tokens): mma.sync 5.76 / 8.21 / 12.14 /
# 22.27 / 42.80, dequantize + cuBLAS 8.95 / 9.08 / 10.00 / 13.92 / 22.40, wgmma 5.71 / 6.27 / 8.88 / 15.48 / 29.00.
# Inside the engine's step (`llmrs profile --synthetic qwen2.5-7b-awq`, with wave_fill_splits) the wgmma form from 33
# tokens lost at 64 (6.156 -> 7.225 ms a step) and won at 96 (8.796 -> 7.617): mma.sync's tiles are 64 tokens
# (tile_rows), so above 64 it decodes each weight twice, the wgmma form once. From 65 tokens, then.
WG_FROM = 65
WG_MAX_TOKENS = 256
WG_TOKENS = 128  # tokens a block


# The 256-token form (gemm_q4.cu's gemm_q4w2{z,m}: two warpgroups, 128 columns x 256 tokens a block, each weight
# decoded once per 256 tokens, one block an SM) above one 128-token tile up to WG_MAX_TOKENS, and from W2_UPPER_FROM
# to W2_MAX_TOKENS (two of its tiles), where the backend has it (Kernels.wgmma_t256). Measured on the H200
# (probes/bench_gemm_q4_forms.py --splits), the 7B's four AWQ linears summed over 28 layers (ms), wgmma (128-token
# tiles) / 256-token form / dequantize + cuBLAS: T 192 8.83 / 7.39 / 10.08, 256 8.70 / 7.23 / 9.86, 320 14.36 / 12.61
# / 11.84, 448 15.14 / 13.09 / 13.52, 512 15.43 / 12.51 / 13.79, 1024 28.87 / 23.07 / 22.10. Its cost goes by
# 256-token tiles, dequantize + cuBLAS's by tokens: between one and two tiles they cross at about 425 tokens.
W2_TOKENS = 256
W2_BLOCKS_PER_SM = 1  # 190 KB of ring a block (kernels.GEMM_Q4W2_SMEM_BYTES)
W2_UPPER_FROM = 424  # exclusive
W2_MAX_TOKENS = 2 * W2_TOKENS
# The 256-token form's K slices where its tiles fill the GPU: at most 2 (H200, the 7B's gate_up at
# 256 tokens, 296 tiles on 132 SMs, us: S 1 149.4, 2 140.5, 3 166.0, 4 179.0; at 512: 247.8 / 249.8 / 328.0 / 351.6)
W2_FILL_MAX_SPLITS = 2
# where the wgmma form's tiles pass half its resident blocks, wave_fill_splits picks its K slices (False: the
# plain rule, for A/Bs)
WG_FILL = True


@dataclass(frozen=True)
class WgForm:
    """A wgmma form's launch shape: tokens and threads a block, its dynamic shared memory, blocks resident an SM, and
    the most K slices wave_fill_splits gives it."""

    kernel: str  # gemm_q4<kernel>{z,m}_s{S}
    tokens: int
    threads: int
    smem: int
    per_sm: int
    fill_max: int


WG_FORM = WgForm("wg", WG_TOKENS, THREADS, GEMM_Q4WG_SMEM_BYTES, WG_BLOCKS_PER_SM, max(WG_SPLITS))
W2_FORM = WgForm("w2", W2_TOKENS, 2 * THREADS, GEMM_Q4W2_SMEM_BYTES, W2_BLOCKS_PER_SM, W2_FILL_MAX_SPLITS)


def in_wgmma_range(T: int, t256: bool = False) -> bool:
    """Token counts the wgmma forms take where the backend has them: WG_FROM <= T <= WG_MAX_TOKENS, and with the
    256-token form (`t256`) W2_UPPER_FROM < T <= W2_MAX_TOKENS too."""
    return WG_FROM <= T <= WG_MAX_TOKENS or (t256 and W2_UPPER_FROM < T <= W2_MAX_TOKENS)


def gemm_takes(T: int, N: int, K: int, wgmma: bool = False, t256: bool = False) -> bool:
    """Whether T tokens of a 4-bit N x K weight with the GEMM layout go through gemm_q4 rather than dequantize +
    cuBLAS (above the GEMV's tokens); `wgmma`: the GPU has the wgmma form (Kernels.wgmma), `t256`: its 256-token
    form too (Kernels.wgmma_t256)."""
    return (T <= MAX_TOKENS or (T <= MAX_TOKENS_SMALL and N * K <= SMALL_MAX_WEIGHTS)
            or (wgmma and in_wgmma_range(T, t256)))


def tile_rows(T: int) -> int:
    """MT: m16 tiles of tokens per block."""
    return 1 if T <= 16 else 2 if T <= 32 else 8 if 0 < MT8_FROM <= T else 4


# The K slices aim at GEMM_BLOCKS_PER_SM blocks an SM, up to MAX_SPLITS. With one an SM the GEMM at 64 tokens ran at
# 66-150 TFLOP/s and streamed its 4-bit weights at 0.3-0.6 TB/s on the H200 (latency-bound, not tensor-bound); at 4 an
# SM the 7B AWQ's 64-sequence step took 7.94 ms against 10.24.
GEMM_BLOCKS_PER_SM = 4


def wave_fill_splits(tiles: int, slots: int, most: int) -> int:
    """The compiled cluster size S (at most `most`, at least 1) that finishes `tiles` tiles on `slots` resident blocks
    in the least time, each block doing 1/S of a tile: the fewest rounds of blocks over S (the smaller S on a tie).
    Where the tiles alone pass half the slots the default rule gives S = 1 and leaves the last round part-empty (the
    7B's gate_up at 128 tokens: 296 tiles on 264 slots of gemm_q4wg, 2 rounds, the second 12% full; S = 4: 5 rounds
    of a quarter tile each, 1.25). WG_FILL = False turns it off (H200, `llmrs profile --synthetic qwen2.5-7b-awq
    --batch 128`: the step 8.94 ms off, 8.48 on)."""
    sizes = [S for S in WG_SPLITS if S <= max(1, most)]
    return min(sizes, key=lambda S: (-(-tiles * S // slots) / S, S))


def gemv_fixed_group(G: int) -> bool:
    """Whether gemv_q4 has forms with the group size G fixed at compile time (GEMV_CPG: G 32 and 128), which the paired
    and norm-carrying forms need."""
    return G in {32 * c for c in GEMV_CPG}


def gemv_kernel(mode: int, T: int, G: int) -> str:
    """gemv_q4's entry point: zero point / min mode, one n8 tile of tokens or two (T > 8), and the form with the
    group size fixed at compile time where there is one (GEMV_CPG: the flush at fixed k32 blocks, each group's
    first mma from 0; `llmrs ptx-check`'s SASS per k32 block at G 128: ~97 -> ~73 instructions)."""
    cpg = G // 32
    return f"gemv_{'q4m' if mode else 'q4z'}{'_t16' if T > 8 else ''}{f'_c{cpg}' if cpg in GEMV_CPG else ''}"


def tiles_fill_gpu(N: int, num_sms: int) -> bool:
    """Whether N's 32-column tiles alone give gemv_q4 its GEMV_BLOCKS_PER_SM blocks an SM (no split-K hand-off)."""
    return N // 32 >= GEMV_BLOCKS_PER_SM * num_sms


def gemv_one_token(N: int, K: int, num_sms: int) -> bool:
    """Whether one token of an N x K weight goes through gemv_q4 rather than matvec_q4 (the comment above
    GEMV_MIN_TOKENS): the tiles fill the GPU, K >= GEMV_ONE_TOKEN_K_PER_N x N, or N x K >=
    GEMV_ONE_TOKEN_MIN_WEIGHTS."""
    return tiles_fill_gpu(N, num_sms) or K >= GEMV_ONE_TOKEN_K_PER_N * N or N * K >= GEMV_ONE_TOKEN_MIN_WEIGHTS


def row_form_needed(N: int, K: int, num_sms: int, gemv: bool = True) -> bool:
    """Whether a 4-bit weight of N output columns that has the GEMM layout keeps its row-major copy on the GPU:
    only matvec_q4 reads it (one token of a smaller N, or without q4_gemv); every other path reads the reordered
    copy (the GEMV, the GEMM, dequant_marlin_bf16 above MAX_TOKENS). Weights whose tiles fill the GPU at one
    token (a 7B's gate_up and down: 84% of its 4-bit bytes) hold one copy."""
    return not gemv or not gemv_one_token(N, K, num_sms)


def _gemv_launch(fn: Any, grid: tuple, block: tuple, args: tuple, S: int, cluster: bool) -> None:
    """A gemv_q4 launch: grid.y's S slices as clusters of S blocks where the plan says so."""
    if cluster:
        launch_cluster(fn, grid, block, args, (1, S, 1))
    else:
        fn(grid, block, args)


# The norm chain (q4_norm_chain) in "auto" up to this hidden size. H200, decode ms/token, chain / rms_norm kernels:
# Qwen2.5-0.5B (896) 0.602 / 0.623, 3B (2048) 1.298 / 1.334, 7B (3584) 1.884 / 1.879. The bf16 matvec's in-loop fold
# stops at the same size (dispatch.NORM_FOLD_MAX_K). On the 7B the chain removes the norms (-73 us a step) but its
# consumers take longer (gate_up +42.7, qkv +18.1).
Q4_NORM_CHAIN_MAX_K = 2048


class QuantLinearOps:
    """The 4-bit GEMM / GEMV launches and the rules that pick them, mixed into CUDABackend: what they read of it is
    declared below (kernels, SM count, the CudaOptions switches, the scratch buffers and profiler spans)."""

    cp: Any
    k: Any  # kernels.Kernels
    num_sms: int
    q4_gemv: bool
    q4_gemv_cluster: bool
    q4_gemv_epilogue: bool
    q4_gemv_norm: Any
    q4_gemm_epilogue: bool
    quant_matvec_max_tokens: int
    _buf: Any
    _counters: Any
    _span: Any
    _cast_bf16: Any

    def to_marlin(self, w: DeviceQuantWeight) -> MarlinWeight | None:
        """The GEMM layout of a 4-bit DeviceQuantWeight (reordered on the GPU), or None where the kernel does not apply
        (q8, or a shape outside `supported`); the one it has when its row form is gone (`row_form_needed`)."""
        if w.qweight is None:
            return w.marlin
        if not has_gemm_layout(w.kind, w.N, w.K, w.group_size):
            return None
        cp = self.cp
        return MarlinWeight(w.N, w.K, w.group_size, 1 if w.mode == "min" else 0, marlin_reorder(w.qweight, cp),
                            marlin_scales(w.scales, w.zeros, cp))

    def w2_takes(self, T: int) -> bool:
        """Whether T tokens go through the 256-token wgmma form (rather than gemm_q4wg's 128-token tiles)."""
        return self.k.wgmma_t256 and WG_TOKENS < T and in_wgmma_range(T, True)

    def wgmma_takes(self, T: int) -> bool:
        """Whether T tokens go through a wgmma form of the GEMM (rather than mma.sync's or dequantize + cuBLAS)."""
        k = self.k
        return k.wgmma and in_wgmma_range(T, k.wgmma_t256)

    def choose_splits(self, T: int, N: int, K: int, wgmma: bool = False, t256: bool = False) -> int:
        """Slices of K so that the grid reaches about GEMM_BLOCKS_PER_SM blocks per SM (1 when the tiles
        already do); the wgmma form: WG_BLOCKS_PER_SM (what fits), its 128-token tiles; `t256`: its 256-token form,
        W2_BLOCKS_PER_SM. Where the wgmma form's tiles alone pass half its resident blocks, wave_fill_splits."""

        if wgmma:  # the K slices are a cluster's blocks: one of the compiled sizes (kernels.wg_cluster)
            form = W2_FORM if t256 else WG_FORM
            tiles = -(-N // BN) * -(-T // form.tokens)
            slots = form.per_sm * self.num_sms
            most = (K // BK) // MIN_KT_PER_SPLIT
            if 2 * tiles > slots and WG_FILL:
                return wave_fill_splits(tiles, slots, min(most, form.fill_max))
            return wg_cluster(min(slots // tiles, most))
        per_sm = GEMM_BLOCKS_PER_SM
        tiles = -(-N // BN) * -(-T // (16 * tile_rows(T)))
        return max(1, min(per_sm * self.num_sms // tiles, (K // BK) // MIN_KT_PER_SPLIT, MAX_SPLITS))

    def gemm_q4(self, x_bf16: Any, mw: MarlinWeight | None, bias: Any | None, out: Any,
                accumulate: bool = False, splits: int | None = None, name: str = "linear",
                wgmma: bool | None = None, t256: bool | None = None) -> bool:
        """out[T, N] (=|+=) x_bf16[T, K] @ W^T (+ bias): x bf16 words (uint16) contiguous, out f32 [T, N] contiguous,
        bias f32 [N] or None. False (nothing launched) where mw is None or the shapes do not match: fall back.
        `wgmma`: force the wgmma form on or off (tests, A/Bs; on needs sm_90a); None: wgmma_takes decides. `t256`: with
        the wgmma form, force its 256-token form on or off; None: w2_takes decides."""
        if mw is None:
            return False
        T, K = x_bf16.shape
        N = mw.N
        if (K != mw.K or out.shape != (T, N) or x_bf16.dtype != np.uint16 or out.dtype != np.float32
                or not x_bf16.flags.c_contiguous or not out.flags.c_contiguous or T < 1):
            return False
        wg = self.wgmma_takes(T) if wgmma is None else wgmma
        b = NULL if bias is None else bias
        if wg:  # K split over a cluster of S blocks, summed in distributed shared memory: no partials, no reduce
            form, S, per = self._wg_plan(T, N, K, splits, t256)
            fn = self.k.wgmma_fns()[f"gemm_q4{form.kernel}{'m' if mw.mode else 'z'}_s{S}"]  # RuntimeError off sm_90a
            with self._span("gemm_q4", name, T, N, K, accumulate, bias is not None):
                fn((-(-N // BN), -(-T // form.tokens), S), (form.threads,),
                   (mw.qweight, mw.sz, x_bf16, b, out, np.int32(T), np.int32(N), np.int32(K), np.int32(mw.group_size),
                    np.int32(1 if accumulate else 0), np.int32(per)), shared_mem=form.smem)
            return True
        S, per = self._mma_splits(T, N, K, splits)
        mt = tile_rows(T)
        grid = (-(-N // BN), -(-T // (16 * mt)), S)
        fn = self.k.fns[f"gemm_{'q4m' if mw.mode else 'q4z'}_m{mt}"]
        smem = gemm_q4_smem_bytes(mt)
        with self._span("gemm_q4", name, T, N, K, accumulate, bias is not None):
            if S == 1:
                fn(grid, (THREADS,), (mw.qweight, mw.sz, x_bf16, b, out, NULL, np.int32(T), np.int32(N), np.int32(K),
                                      np.int32(mw.group_size), np.int32(1 if accumulate else 0), np.int32(per)),
                   shared_mem=smem)
            else:
                part = self._buf("gemm_q4_part", (S, T, N), np.float32)
                fn(grid, (THREADS,), (mw.qweight, mw.sz, x_bf16, NULL, out, part, np.int32(T), np.int32(N),
                                      np.int32(K), np.int32(mw.group_size), np.int32(0), np.int32(per)), shared_mem=smem)
                n = T * N
                self.k.fns["gemm_q4_reduce"]((min(65535, -(-n // 256)),), (256,),
                                                (part, b, out, np.int32(T), np.int32(N), np.int32(S),
                                                 np.int32(1 if accumulate else 0)))
        return True

    def _mma_splits(self, T: int, N: int, K: int, splits: int | None) -> tuple[int, int]:
        """The mma.sync GEMM's K slices (gemm_q4 and gemm_q4_silu): (S, k64 stages a slice) from choose_splits (or
        `splits`, for tests), with no empty slice."""
        KT = K // BK
        S = self.choose_splits(T, N, K) if splits is None else max(1, min(int(splits), KT))
        per = -(-KT // S)
        return -(-KT // per), per

    def _wg_plan(self, T: int, N: int, K: int, splits: int | None, t256: bool | None) -> tuple[WgForm, int, int]:
        """A wgmma form's launch plan (gemm_q4 and gemm_q4_silu): the form (the 256-token one where w2_takes, or as
        `t256` forces), its cluster size S (choose_splits, or `splits` for tests, as a compiled size: a slice may end
        empty, a block of zeros, never overlapping another) and k64 stages a slice."""
        w2 = self.w2_takes(T) if t256 is None else t256
        KT = K // BK
        S = wg_cluster(self.choose_splits(T, N, K, True, w2) if splits is None else max(1, min(int(splits), KT)))
        return (W2_FORM if w2 else WG_FORM), S, -(-KT // S)

    def gemm_silu_takes(self, w: Any, T: int) -> bool:
        """Whether the batched path runs a quantized gate_up of T tokens through a 4-bit GEMM's SiLU form (gemm_q4_silu:
        SiLU x up in the epilogue, bf16 out): the backend's q4_gemm_epilogue, a 4-bit weight in the layout, N % 128 (a
        block: 64 gate columns and their 64 up columns), and T on a GEMM with such a form: the wgmma forms' range
        (wgmma_takes), else the mma.sync GEMM's tokens at MT 4 (33-192; gemm_takes). The caller checks that x is bf16
        and that down takes bf16. H200, 7B AWQ (`llmrs profile --synthetic qwen2.5-7b-awq --context 512`, graph walls,
        3 rounds interleaved, ms, on / off): wgmma forms, 128 sequences 8.157-8.249 /
        8.359-8.479, 256 9.926-10.035 / 10.010-10.121, a 256-token prefill 7.973-8.089 / 8.109-8.230; mma.sync MT 4, 64
        sequences 5.921-6.019 / 6.075-6.107, a 48-token prefill 5.243-5.426 / 5.391-5.467; but MT 2 (32 sequences)
        5.463-5.646 / 5.048-5.134 (its kernels' eager sum lower, 5.21 against 5.35: not understood), so 17-32 tokens
        keep silu_mul_bf16."""
        mw = getattr(w, "marlin", None)
        if (mw is None or not self.q4_gemm_epilogue or T <= GEMV_MAX_TOKENS
                or T <= self.quant_matvec_max_tokens or mw.N % BN):
            return False
        if self.wgmma_takes(T):
            return True
        k = self.k
        return (gemm_takes(T, mw.N, mw.K, k.wgmma, k.wgmma_t256)
                and tile_rows(T) in GEMM_Q4_SILU_MT)

    def gemm_q4_silu(self, x_bf16: Any, mw: MarlinWeight, out: Any, splits: int | None = None,
                     wgmma: bool | None = None, t256: bool | None = None) -> None:
        """The 4-bit GEMMs' SiLU forms (gemm_q4.cu's gemm_q4{wg,w2}{z,m}_silu_s{S} and gemm_q4{z,m}_silu_m{MT}), where
        gemm_silu_takes: out bf16 words [T, N/2] = silu(gate) * up of gate_up [N, K] (gate the first N/2 rows), the
        values of gemm_q4 into f32 + silu_mul_bf16, bit for bit. The same form, K slices and sums as gemm_q4 (the
        mma.sync form's slices summed by gemm_q4_reduce_silu); `splits` / `wgmma` / `t256` as its, for tests."""
        T, K = x_bf16.shape
        N = mw.N
        assert x_bf16.dtype == np.uint16 and K == mw.K and N % BN == 0, (x_bf16.dtype, K, mw.K, N)
        assert out.dtype == np.uint16 and out.shape == (T, N // 2) and out.flags.c_contiguous, (out.dtype, out.shape)
        kind = "q4m" if mw.mode else "q4z"
        if self.wgmma_takes(T) if wgmma is None else wgmma:
            form, S, per = self._wg_plan(T, N, K, splits, t256)
            fn = self.k.wgmma_fns()[f"gemm_q4{form.kernel}{kind[-1]}_silu_s{S}"]
            with self._span("gemm_q4", "gate_up+silu", T, N, K, False, False):
                fn((N // BN, -(-T // form.tokens), S), (form.threads,),
                   (mw.qweight, mw.sz, x_bf16, out, np.int32(T), np.int32(N), np.int32(K), np.int32(mw.group_size),
                    np.int32(per)), shared_mem=form.smem)
            return
        S, per = self._mma_splits(T, N, K, splits)
        mt = tile_rows(T)
        assert mt in GEMM_Q4_SILU_MT, (T, mt)
        part = self._buf("gemm_q4_part", (S, T, N), np.float32) if S > 1 else NULL
        with self._span("gemm_q4", "gate_up+silu", T, N, K, False, False):
            self.k.fns[f"gemm_{kind}_silu_m{mt}"](
                (N // BN, -(-T // (16 * mt)), S), (THREADS,),
                (mw.qweight, mw.sz, x_bf16, out, part, np.int32(T), np.int32(N), np.int32(K), np.int32(mw.group_size),
                 np.int32(per)), shared_mem=gemm_q4_smem_bytes(mt, silu=True))
            if S > 1:
                n = T * N // 2
                self.k.fns["gemm_q4_reduce_silu"]((min(65535, -(-n // 256)),), (256,),
                                                     (part, out, np.int32(T), np.int32(N), np.int32(S)))

    def gemv_cluster(self) -> bool:
        """Whether gemv_q4 may launch a split tile's blocks as one cluster (sm_90+, the backend's q4_gemv_cluster;
        `_gemv_plan` says where it does)."""
        return bool(self.q4_gemv_cluster) and self.k.cc >= 90

    def gemv_splits(self, N: int, K: int, splits: int | None = None) -> tuple[int, int]:
        """(S, kb_per_warp) of gemv_q4: K slices over grid.y, as many as keep the 32-column tiles times S within one
        round of GEMV_BLOCKS_PER_SM resident blocks per SM (or `splits`, for tests), each warp taking a multiple of
        GEMV_DEPTH consecutive k32 blocks.
        Rounded down, not up: a second round for a few blocks costs a whole one (H200, the 7B's down at one token:
        S = 4, 448 blocks, 19.5 us; S = 5, 560 blocks of 528 resident, 23.4 us).
        Past one round it stays one slice: the 7B's gate_up is 1,184 tiles (2.24 rounds of 528), and K split into the
        cluster's slices that fill whole rounds best (4: 9 rounds x 8 k32 blocks a warp, against 3 x 28) lost in the step,
        each block's fixed cost (prologue, reduction, cluster merge, epilogue) outweighing the partial round (7B AWQ
        1.874 -> 2.298 ms/token); so did splitting only the part-full last round: a part-full round's blocks run faster,
        so the GEMV's time is its throughput an SM (22% occupancy at 126-128 registers), not its rounds."""
        NB, KB = N // 32, K // 32
        want = max(1, GEMV_BLOCKS_PER_SM * self.num_sms // NB) if splits is None else splits
        S = max(1, min(want, -(-KB // (GEMV_WARPS * GEMV_DEPTH))))
        per = -(-KB // (S * GEMV_WARPS * GEMV_DEPTH)) * GEMV_DEPTH
        return -(-KB // (GEMV_WARPS * per)), per  # no empty slice

    def gemv_takes(self, T: int, N: int, K: int) -> bool:
        """Whether the backend's decode path runs T tokens through gemv_q4 (GEMV_MIN_TOKENS above)."""
        return T >= GEMV_MIN_TOKENS or gemv_one_token(N, K, self.num_sms)

    def weight_on_gemv(self, w: Any, T: int) -> bool:
        """Whether the backend's decode path sends T tokens of the quantized weight `w` to gemv_q4: 4-bit, up to
        GEMV_MAX_TOKENS, and always for a weight held only in the GEMM's layout, else where gemv_takes (and the backend's
        q4_gemv)."""
        return (T <= GEMV_MAX_TOKENS and w.kind == "q4"
                and (w.qweight is None or self.q4_gemv and self.gemv_takes(T, w.N, w.K)))

    def gemv_q4(self, x: Any, mw: MarlinWeight | None, bias: Any | None, out: Any, accumulate: bool = False,
                name: str = "linear", nbytes: int = 0, splits: int | None = None, norm_out: tuple | None = None) -> bool:
        """out[T, N] (=|+=) x[T, K] @ W^T (+ bias) for T <= GEMV_MAX_TOKENS from f32 x, over the GEMM's layout
        (gemm_q4.cu's gemv_q4: the decode path; x rounded to bf16, the weights exact). False (nothing launched)
        where it does not apply: fall back. norm_out = (g, xg, ssp) (gemm_q4.cu's GV_NORM_OUT, up to 8 tokens, G 32 /
        128, no bias; q4_norm_chain): also xg [T, N] = out * g and ssp [T, N / 32] = each 32-column tile's sum of out^2,
        the next RMSNorm's inputs for gemv_q4_pair's norm_in."""
        if mw is None:
            return False
        T, K = x.shape
        N = mw.N
        if (K != mw.K or not 1 <= T <= GEMV_MAX_TOKENS or out.shape != (T, N) or x.dtype != np.float32
                or out.dtype != np.float32 or not x.flags.c_contiguous or not out.flags.c_contiguous):
            return False
        S, per, cluster, part, sem = self._gemv_plan(T, N, K, splits)
        if norm_out is not None:
            g, xg, ssp = norm_out
            if T > 8 or bias is not None or not gemv_fixed_group(mw.group_size):
                raise ValueError(f"gemv_q4: norm_out needs up to 8 tokens, no bias, G 32 or 128 (T {T}, G {mw.group_size})")
            args = (mw.qweight, mw.sz, x, out, part, sem, np.int32(T), np.int32(N), np.int32(K), np.int32(mw.group_size),
                    np.int32(1 if accumulate else 0), np.int32(per), g, xg, ssp)
            fn = self.k.fns[f"gemv_{'q4m' if mw.mode else 'q4z'}_c{mw.group_size // 32}_nout"]
            name += "+norm"
        else:
            args = (mw.qweight, mw.sz, x, NULL if bias is None else bias, out, part, sem, np.int32(T), np.int32(N),
                    np.int32(K), np.int32(mw.group_size), np.int32(1 if accumulate else 0), np.int32(per))
            fn = self.k.fns[gemv_kernel(mw.mode, T, mw.group_size)]
        with self._span("matvec_q", name, T, N, K, accumulate, bias is not None, nbytes or mw.nbytes):
            _gemv_launch(fn, (N // 32, S), (32 * GEMV_WARPS,), args, S, cluster)
        return True

    def _gemv_plan(self, T: int, N: int, K: int, splits: int | None) -> tuple[int, int, bool, Any, Any]:
        """gemv_q4's launch plan, both forms: (S, kb_per_warp) of gemv_splits, whether the S slices are one cluster (2 to
        GEMV_CLUSTER_MAX of them at up to 8 tokens on sm_90: the t16 forms keep the hand-off, gemm_q4.cu), the L2
        hand-off's partials buffer (NULL where there is none) and its per-tile counters."""
        S, per = self.gemv_splits(N, K, splits)
        cluster = 1 < S <= GEMV_CLUSTER_MAX and T <= 8 and self.gemv_cluster()
        part = self._buf("gemv_q4_part", (S, T, N), np.float32) if S > 1 and not cluster else NULL
        return S, per, cluster, part, self._counters("gemv_q4_sem", GEMV_SEM_TILES)

    def gemv_pair_takes(self, epi: str, w: Any, T: int, head_dim: int = 0) -> bool:
        """Whether the decode path runs a quantized gate_up ("silu") or qkv ("rope") of T tokens through gemv_q4's
        paired form with its follower fused (gemv_q4_pair): the backend's q4_gemv_epilogue, a 4-bit weight in the
        layout on the GEMV path at this T (weight_on_gemv), up to 8 tokens, G 32 or 128, and a
        shape whose pairs are whole tiles (silu: I % 32; rope: head_dim % 64)."""
        mw = getattr(w, "marlin", None)
        if (mw is None or not self.q4_gemv_epilogue or not 1 <= T <= 8
                or not gemv_fixed_group(mw.group_size) or not self.weight_on_gemv(w, T)):
            return False
        if epi == "silu":
            return mw.N % 64 == 0
        return head_dim > 0 and head_dim % 64 == 0 and mw.N % head_dim == 0

    def norm_chain_mode(self) -> str:
        """The backend's q4_gemv_norm as "on" (True: every size), "off" (False) or "auto"
        (up to Q4_NORM_CHAIN_MAX_K)."""
        v = self.q4_gemv_norm
        if isinstance(v, bool):
            return "on" if v else "off"
        v = str(v).strip().lower()
        return "off" if v in ("0", "false", "off", "no") else "on" if v in ("1", "true", "on", "yes") else "auto"

    def gemv_norm_takes(self, w: Any, T: int) -> bool:
        """Whether the paired form over `w` at T tokens may take its RMSNorm from the producer (gemv_q4_pair's norm_in):
        the backend's q4_gemv_norm, up to 8 tokens, and a launch plan of one K slice or one
        cluster of them (the block that finishes a tile holds the token's sum; the L2 hand-off's is not set up for it)."""
        mw = getattr(w, "marlin", None)
        if mw is None or self.norm_chain_mode() == "off" or not 1 <= T <= 8:
            return False
        S, _ = self.gemv_splits(mw.N, mw.K)
        return S == 1 or (S <= GEMV_CLUSTER_MAX and self.gemv_cluster())

    def q4_norm_chain(self, layers: list, T: int, head_dim: int) -> bool:
        """Whether a T-token decode step carries every RMSNorm between two 4-bit GEMVs in them (gemm_q4.cu's GV_NORM_OUT
        / GV_NORM_IN): o writes x * post_norm and the sums of squares for gate_up, down those of the next layer's
        input_norm for its qkv (the first layer's input norm and the final one stay rms_norm). Every layer: qkv and
        gate_up on the GEMV's paired forms with a plan that takes the norm (gemv_norm_takes), o and down on the GEMV
        (weight_on_gemv) at G 32 / 128 without a bias; in "auto" (norm_chain_mode) a hidden size up to
        Q4_NORM_CHAIN_MAX_K."""
        mode = self.norm_chain_mode()
        if not layers or mode == "off" or not 1 <= T <= 8:
            return False
        if mode == "auto" and getattr(layers[0].o, "N", 0) > Q4_NORM_CHAIN_MAX_K:  # (o's N: the hidden size)
            return False
        for layer in layers:
            if not (self.gemv_pair_takes("rope", layer.qkv, T, head_dim) and self.gemv_pair_takes("silu",
                                                                                                  layer.gate_up, T)):
                return False
            if not (self.gemv_norm_takes(layer.qkv, T) and self.gemv_norm_takes(layer.gate_up, T)):
                return False
            for w in (layer.o, layer.down):
                mw = getattr(w, "marlin", None)
                if mw is None or not self.weight_on_gemv(w, T) or not gemv_fixed_group(mw.group_size):
                    return False
        return True

    def gemv_q4_pair(self, epi: str, x: Any, mw: MarlinWeight, out: Any, bias: Any | None = None,
                     rope: tuple | None = None, nbytes: int = 0, splits: int | None = None,
                     norm_in: tuple | None = None) -> None:
        """gemv_q4's paired forms (gemm_q4.cu GV_EPI_SILU / GV_EPI_ROPE), where gemv_pair_takes: "silu" writes out [T,
        N/2] = silu(gate) * up from gate_up [N, K]; "rope" writes q rotated into out [T, N] (qkv; + bias) and k rotated,
        v as it is into the paged caches, rope = (positions, inv_freq, slots, k_cache, v_cache, Hq, Hkv, D, block_size).
        The same K slices, cluster and sums as gemv_q4 (the same bits as gemv_q4 + silu_mul / rope_write_kv; `splits`
        as gemv_q4's, for tests). norm_in = (ssp, eps) (gemm_q4.cu's GV_NORM_IN, where gemv_norm_takes): x is the x * g
        a gemv_q4 norm_out wrote and ssp its sums of squares; the sums are scaled by 1 / rms (rms_norm + this form
        within bf16 rounding of x)."""
        T, K = x.shape
        N = mw.N
        S, per, cluster, part, sem = self._gemv_plan(T, N, K, splits)
        if norm_in is not None and (T > 8 or (S > 1 and not cluster)):
            raise ValueError(f"gemv_q4_pair: norm_in needs up to 8 tokens and one K slice or a cluster ({S} slices)")
        tail = (np.int32(T), np.int32(N), np.int32(K), np.int32(mw.group_size), np.int32(per))
        if epi == "silu":
            args = (mw.qweight, mw.sz, x, out, part, sem) + tail
            label = "gate_up+silu"
        else:
            positions, inv_freq, slots, k_cache, v_cache, Hq, Hkv, D, bs = rope
            args = (mw.qweight, mw.sz, x, NULL if bias is None else bias, out, part, sem) + tail + (
                positions, inv_freq, slots, k_cache, v_cache, np.int32(Hq), np.int32(Hkv), np.int32(D), np.int32(bs))
            label = "qkv+rope"
        if norm_in is not None:
            args += (norm_in[0], np.float32(norm_in[1]))
            label = "norm+" + label
        with self._span("matvec_q", label, T, N, K, False, bias is not None, nbytes or mw.nbytes):
            # a pair of tiles a block, 4 warps each
            _gemv_launch(self.k.fns[f"gemv_{'q4m' if mw.mode else 'q4z'}_{epi}_c{mw.group_size // 32}"
                                       f"{'_nin' if norm_in is not None else ''}"],
                         (N // 64, S), (64 * GEMV_WARPS,), args, S, cluster)

    def dequant_marlin(self, mw: MarlinWeight, out: Any) -> None:
        """out uint16 [N, K] (bf16) = the weight, from the GEMM layout (gemm_q4.cu's dequant_marlin_bf16: the values
        dequant_q4_bf16 gives from the row form)."""
        records = mw.N // 32 * (mw.K // 32) * 32
        self.k.fns[f"dequant_marlin_{'q4m' if mw.mode else 'q4z'}_bf16"](
            (min(65535, -(-records // 512)),), (256,),  # two records a thread a pass
            (mw.qweight, mw.sz, out, np.int32(mw.N), np.int32(mw.K), np.int32(mw.group_size)))

    def linear_q4(self, x: Any, mw: MarlinWeight | None, bias: Any | None, out: Any, accumulate: bool = False,
                  name: str = "linear") -> bool:
        """gemm_q4 from f32 x [T, K]: cast into the backend's `gemm_x` bf16 buffer, then the GEMM. False (nothing
        launched) where the GEMM does not apply."""
        if mw is None or x.shape[1] != mw.K:
            return False
        T, K = x.shape
        xb = self._buf("gemm_x", (T, K), np.uint16)
        with self._span("cast", "cast_bf16 " + name, T * K):
            self._cast_bf16(x, xb)
        return self.gemm_q4(xb, mw, bias, out, accumulate, name=name)
