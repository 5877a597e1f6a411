"""The CUDA backend's shape rules: which kernel form a step takes (matvec or GEMM, their splits, bf16 inputs and
outputs, the decode attention kernel, its splits and cluster sizes, the one-token attention + o fusion), the
constants they compare against, and the options that select a form (`CudaOptions`, today's defaults).

Every rule is a method of `DispatchRules` that reads only the backend's options, its config, `num_sms`, `dpl` and
the compiled kernels' facts (`k.cc`, `k.wgmma`): tests/backends/test_cuda_rules.py calls them on stand-in objects, so the
rules are pinned without a GPU. The launches themselves live in linear.py, attention.py and forward.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from llmrs.backends.cuda.kernels import ATTN_O_CLUSTER_SIZES, max_active_clusters
from llmrs.backends.cuda.quant_linear import GEMV_MAX_TOKENS, gemm_takes
from llmrs.model.quant import DeviceQuantWeight

if TYPE_CHECKING:
    from llmrs.backends.cuda.batch import DeviceBatch


@dataclass(frozen=True)
class CudaOptions:
    """The kernel forms a CUDABackend may take; the defaults are what ships. Tests and A/B runs pass other values
    (`CUDABackend(..., options=CudaOptions(q4_gemv=False))`); each field becomes the backend attribute of that name.
    """

    # GEMM inputs written as bf16 by their producers (rms_norm_bf16, add_rms_norm_bf16, silu_mul_bf16) instead of
    # f32 + cast_f32_bf16: the same bits, two launches fewer per layer; False keeps the f32 + cast path
    fuse_bf16: bool = True
    # decode-sized steps (the matvec path): RoPE + the K/V cache write in the qkv projection's epilogue and SiLU x up
    # in gate_up's (matvec_rope_bf16 / matvec_silu_bf16: bit-identical, two launches fewer per layer)
    fuse_epilogues: bool = True
    # ... and, with those paired kernels, the RMSNorm before qkv and before gate_up folded into the projection (x and
    # the norm weight in, the sum of squares in the same pass; f32 rounding apart from rms_norm + matvec): "auto" up
    # to a hidden size of NORM_FOLD_MAX_K, "1" at every size, "0" never
    fuse_norm: str = "auto"
    # decode over 4-bit weights: gemv_q4 (tensor cores, the Marlin layout) instead of matvec_q4 (f32 FMA, row layout)
    q4_gemv: bool = True
    # gemv_q4's K slices of a tile launched as one thread-block cluster on sm_90+ (QuantLinearOps.gemv_cluster)
    q4_gemv_cluster: bool = True
    # a 4-bit gate_up / qkv on the GEMV with SiLU x up / RoPE + the KV write in its epilogue (quant_linear's
    # gemv_pair_takes); False keeps silu_mul / rope_write_kv as launches
    q4_gemv_epilogue: bool = True
    # the RMSNorms between those GEMVs carried by them (QuantLinearOps.q4_norm_chain): "auto" up to a hidden size of
    # quant_linear.Q4_NORM_CHAIN_MAX_K (where it measured faster), True at every size, False never
    q4_gemv_norm: bool | str = "auto"
    # SiLU x up fused into the batched steps' 4-bit gate_up GEMMs (QuantLinearOps.gemm_silu_takes)
    q4_gemm_epilogue: bool = True
    # the mma.sync 4-bit GEMM reads its x as bf16 words written by the producers instead of a cast before each linear
    # (the same bits, ~4 launches a layer fewer)
    q4_bf16_input: bool = True
    # one token's attention and the o projection as one kernel (attn_o_cluster, `_attn_o_cluster`); 4 or 8: that
    # cluster size only, where it takes the shape
    attn_o_fused: bool | int = True
    # warps an attn_o_cluster8 block: 16, 8 (attn_o_cluster8_w8), or 0: 8 where the Hq clusters of the 16-warp form do
    # not all run at once (`_attn_o_form`)
    attn_o_warps: int = 0
    # gate/up written by cuBLAS as bf16 where both MLP GEMMs take bf16 (`_gate_up_bf16`)
    gate_up_bf16: bool = True
    # warps a row of every bf16 matvec (1, 2 or 4; 0: by shape, `_matvec_splits`)
    matvec_splits: int = 0
    # warps a row where `_matvec_splits`'s long-K rule applies (0: the fewest giving MATVEC_LONG_K_MIN_WARPS warps)
    long_k_splits: int = 0
    # o (a square matrix) by the long-K rule's warp count too
    square_k_splits: bool = False
    # the bf16 GEMMs on gemm_rows(T) rows where the workspace has room (fewer distinct cuBLAS shapes)
    gemm_pad_rows: bool = False
    # o at one token as matvec_rows_bf16 (its rows in registers while the attention runs)
    matvec_rows: bool = False
    # the decode attention kernel: "auto" (the rules of `_attn_choice`), "partial", "gqa" or "tc"
    attn_kernel: str = "auto"
    # the tensor-core prefill attention for steps where a sequence brings at least this many new tokens; None: never
    prefill_min_tokens: int | None = 16
    # attn_cluster's size: None (auto, ATTN_CLUSTER_SIZES by context), 0 (off), 4, 8 or 16 (that size at any context)
    attn_cluster: int | None = None
    # query heads a block of attn_cluster: None (4 where the step's blocks fit the SMs, else 8), 4 or 8
    attn_heads_per_block: int | None = None
    # warps a block of attn_cluster's 4-head forms: 16 (_g4_w16) or 8
    attn_cluster_warps: int = 16
    # GEMM-sized steps: the q/k/v bias added by rope_write_kv, not a separate add_bias launch (bit-identical)
    fold_qkv_bias: bool = True

    def __post_init__(self) -> None:
        checks = [("fuse_norm", self.fuse_norm in ("auto", "0", "1")),
                  ("q4_gemv_norm", self.q4_gemv_norm in ("auto", True, False)),
                  ("attn_o_fused", self.attn_o_fused in (True, False, 4, 8)),
                  ("attn_o_warps", self.attn_o_warps in (0, 8, 16)),
                  ("matvec_splits", self.matvec_splits in (0, 1, 2, 4)),
                  ("long_k_splits", self.long_k_splits in (0, 1, 2, 4)),
                  ("attn_kernel", self.attn_kernel in ("auto", "partial", "gqa", "tc")),
                  ("attn_cluster", self.attn_cluster in (None, 0, 4, *ATTN_CLUSTER_SIZES)),
                  ("attn_heads_per_block", self.attn_heads_per_block in (None, 4, 8)),
                  ("attn_cluster_warps", self.attn_cluster_warps in (8, 16))]
        bad = [name for name, ok in checks if not ok]
        if bad:
            raise ValueError(f"CudaOptions: unsupported {', '.join(f'{n}={getattr(self, n)!r}' for n in bad)}")


MATVEC_ROWS_PER_BLOCK = 4
# the long-K matvec's warps per matrix (`_matvec_splits`): splits = the fewest of 1, 2, 4 reaching it
MATVEC_LONG_K_MIN_WARPS = 3584


def splits_by_warps(N: int) -> int:
    """Warps a row (1, 2 or 4) for N rows: the fewest giving the matrix MATVEC_LONG_K_MIN_WARPS warps."""
    return 1 if N >= MATVEC_LONG_K_MIN_WARPS else 2 if 2 * N >= MATVEC_LONG_K_MIN_WARPS else 4


# cuBLAS's first call of a (token count, shape) costs ~2.6 ms of host time (~0.05 ms later; H200,
# probes/cublas_first_shape.py), so an eager step whose token count is new pays it for each GEMM shape. With
# `gemm_pad_rows` the GEMMs run on gemm_rows(T) rows (the padding rows' inputs and outputs are workspace nobody
# reads): far fewer distinct counts, at the cost of the padding rows' work.
def gemm_rows(T: int) -> int:
    """The row count a T-token GEMM runs on with row padding: T up to 64, then the next multiple of 32 up to 512,
    of 64 up to 2048, of 128 above."""
    if T <= 64:
        return T
    g = 32 if T <= 512 else 64 if T <= 2048 else 128
    return -(-T // g) * g

# The RMSNorm folded into the paired qkv / gate_up matvecs (`fuse_norm` "auto") up to this hidden size. Measured on
# the H200 (single-stream decode ms/token, unfolded -> folded):
# Qwen2.5-0.5B (896) 0.868 -> 0.841, 3B (2048) 2.776 -> 2.775, 7B (3584) 4.448 -> 4.527: the fold's extra work per
# weight chunk (the norm weight's loads, the sum of squares) costs more than the launch it saves on long rows.
NORM_FOLD_MAX_K = 2048
# (Folding only gate_up's norm at 3584, the 7B, measured slower in the decode on the H200.)
NORM_STAGE_MAX_K = 12288  # matvec.cu's: one token's x * g staged in (at most 48 KB of) shared memory
# bf16 weights: the matvec for one token, cuBLAS from two. Measured on the H200 (matvec_max_tokens 8 | 2 | 1,
# `llmrs profile --synthetic qwen2.5-7b --batch 1,2,3,4,8`, graph wall ms per decode step):
# 7B with the matvec up to 8 tokens 4.93 / 6.61 / 11.16 / 11.14 / 22.43, cuBLAS from 2 4.93 / 5.28 / 5.23 / 5.26 /
# 5.53 (the f32 matvec is compute-bound from 2-3 tokens); 0.5B B = 2 1.08 matvec vs 1.27 cuBLAS, B = 4 2.55 vs 1.27.
MATVEC_MAX_TOKENS = 1
ATTN_THREADS = 128
ATTN_MAXG = 8  # query heads per attention block (MAXG in attention.cu)
ATTN_GQA_MIN_BLOCKS = 128  # "auto": attn_partial_gqa from this many blocks a step (7B: 32 sequences); measured at 256+
# "auto": attn_partial_gqa from 2 tokens for heads of at most this many dims: with 2 dims a lane attn_partial's
# dot product is mostly shuffles. H200, Qwen2.5-0.5B (head_dim 64), `llmrs profile --batch 1,4,16,64 --context
# 512` graph wall ms, gqa / partial: 0.877 / 0.848, 1.285 / 1.383, 1.340 / 1.529, 1.842 / 2.600; single-stream
# decode 0.839 / 0.759 ms/token: one token takes attn_partial. head_dim 128 (3B, 7B) keeps attn_partial below
# 128 blocks (4% faster)
ATTN_GQA_MAX_HEAD_DIM = 64
# ... except where attn_cluster's d2 form covers the context (one launch, no attn_merge: `_cluster_form`): H200,
# Qwen2.5-0.5B one stream, prompt 256 + 256 steps, decode_attn_tc + attn_merge 0.628 against attn_cluster 0.612
# ms/token. False keeps decode_attn_tc there
ATTN_TC_SMALL_HEADS_CLUSTER = True
# "auto": decode_attn_tc (tensor cores, attention._decode_attention_tc) from this many tokens a step, and for
# heads of at most ATTN_GQA_MAX_HEAD_DIM dims from one token; where it cannot run (GPUs before sm_80, head dims
# other than 64 / 128, more than 16 query heads a KV head) the rules above. H200, `llmrs profile --synthetic
# qwen2.5-7b --batch 1,64,256 --context 512` graph walls, gqa -> tc: B=64 7.20 -> 5.79 ms (attention 1.68 -> 0.92),
# B=256 12.67 -> 9.42 ms (attention 5.68 -> 2.31 ms, 28% -> 70% of the bandwidth roof); single-stream decode
# (attn_partial -> tc) 0.5B 0.752 -> 0.712 ms/token, 3B 2.351 -> 2.458, 7B 4.249 -> 4.336: one token of 128-dim
# heads keeps attn_partial.
ATTN_TC_MIN_TOKENS = 2
# attn_cluster (attention.cu): CW = 8 warps a block, each loading CK = 8 keys at once: up to 64 keys a split in one
# batch a warp. Cluster sizes (splits): 8, and 16 (non-portable, allowed per kernel at load). "auto" takes the
# smaller one that covers the step's max_len in one batch (8 up to 512 keys, 16 up to 1024), attn_partial +
# attn_merge beyond. Measured on the H200 (single-stream decode, prompt 256 + 256 steps, ms/token, attn_cluster
# 0 / 16 / 8): 7B 4.225 / 4.195 / 4.172, 3B 2.351 / 2.308 (8), 7B AWQ 2.569 / 2.521 (8).
ATTN_CLUSTER_THREADS = 256
ATTN_CLUSTER_KEYS_PER_SPLIT = 64
ATTN_CLUSTER_SIZES = (8, 16)
# attn_o_cluster{CL} (attention.cu): a block a (query head, split) with 16 warps, each lane holding 8 (CL 8) or 16
# (CL 4) 16-byte chunks of the o weights (2 rows a chunk index), so a split of o's rows is at most 256 / 512 rows
ATTN_O_THREADS = 512
ATTN_O_MAX_ROWS = {8: 256, 4: 512}
# the sizes auto takes: 8 only. H200, one stream (`llmrs synth --decode-bench`): 1.5B (12 heads, clusters of 8)
# 1.317 -> 1.295 ms/token; the 3B's 16 clusters of 8 exceed the 15 that run at once (2.044 -> 2.12: two waves), and
# in clusters of 4 (64 SMs holding o) it ties to loses (2.049 -> 2.057); attn_o_fused=4 forces that form
ATTN_O_AUTO_SIZES = (8,)



def norm_threads(H: int) -> int:
    """Threads of an RMSNorm block (one row): the same for the f32, fused-residual and bf16-output kernels, so
    they sum the squares in the same order (the bf16 outputs are then the exact cast of the f32 ones). Blocks of
    128 threads with 16-byte loads were measured slower on the H200 (7B rows, eager profile, us a call: 1 row 6.1
    -> 7.2, 256 rows 7.4 -> 9.1; only 512 rows gained, 11.1 -> 9.6)."""
    return min(1024, max(32, -(-H // 32) * 32))


def rope_threads(Hq: int, Hkv: int, D: int) -> int:
    """Threads of a rope_write_kv block (one token): one per rotated pair of its q and k heads, in whole warps."""
    return min(1024, max(32, -(-(Hq + Hkv) * D // 2 // 32) * 32))


def matvec_nt(T: int) -> int:
    """Tokens a matvec block computes together (the kernels' NT: 1, 2, 4 or 8) for a step of T <= 8 tokens."""
    return 1 if T == 1 else 2 if T == 2 else 4 if T <= 4 else 8


class DispatchRules:
    """The shape rules, mixed into CUDABackend (module docstring)."""

    _tc_ok: bool | None = None  # decode_tc_supported, asked once

    def _matvec_splits(self, N: int, K: int) -> int:
        """Warps per output row of matvec_bf16 (1, 2 or 4), by shape only (the same for every token count, so a
        row sums in the same order alone or in a batch): few rows and a long K (a 7B's down, o, qkv) leave
        most SMs short of loads in flight with one warp a row; `matvec_splits` forces one value."""
        if K % 8:
            return 1
        if self.matvec_splits:
            return self.matvec_splits
        # measured on the H200 (T = 1): o/qkv (K = N) slower with 2 or 4. Long K: alone, the 7B's down took 42.5 us
        # with 1 and 39.0 with 4, but inside the graphed step (one stream) the fewest splits that give
        # ~3584 warps won: 7B (N 3584) 1, 3B (2048) 2, 0.5B (896) 4, each 1.2-2.3 us a layer ahead of the others
        if not (K >= 4 * N and K >= 4096 and N * 4 <= 16384):
            return splits_by_warps(N) if self.square_k_splits and N == K else 1
        return self.long_k_splits or splits_by_warps(N)

    def _bias_in_rope(self, w: Any, T: int) -> bool:
        """Whether the q/k/v bias is added by rope_write_kv instead of add_bias: where `_linear` would run the bf16
        GEMM and then add_bias (`fold_qkv_bias`; the matvec adds it in its epilogue already)."""
        return self.fold_qkv_bias and not isinstance(w, DeviceQuantWeight) and T > self.matvec_max_tokens

    def _pair_epilogue(self, w: Any, T: int) -> bool:
        """Whether the projection over `w` runs as a paired-row matvec with its follower fused (`fuse_epilogues`):
        a bf16 matrix on the matvec path with one warp a row."""
        return (self.fuse_epilogues and T <= self.matvec_max_tokens and not isinstance(w, DeviceQuantWeight)
                and self._matvec_splits(w.shape[0], w.shape[1]) == 1)

    def _norm_folds(self, w: Any) -> bool:
        """Whether the RMSNorm before the projection over `w` rides in it when that projection runs as a paired
        matvec (`_pair_epilogue`): `fuse_norm`, and in "auto" up to a row length of NORM_FOLD_MAX_K."""
        if self.fuse_norm == "0":
            return False
        return self.fuse_norm != "auto" or w.shape[1] <= NORM_FOLD_MAX_K

    def _gemm_takes_bf16(self, w: Any, T: int) -> bool:
        """Whether `_linear` over `w` with T tokens reads bf16 x, so that the producer of its input writes bf16 words
        itself (`fuse_bf16`): a plain bf16 weight above the matvec's tokens (cuBLAS),
        a quantized one above every packed-weight kernel's (dequantized into a bf16 scratch, then cuBLAS:
        `_linear_quant`) and where the wgmma form of the 4-bit GEMM runs (the mma.sync one too with
        `q4_bf16_input`, on by default). The matvec and the 4-bit GEMV take f32."""
        if isinstance(w, DeviceQuantWeight):  # the 4-bit GEMMs read bf16 x too (wgmma always, mma.sync by switch)
            return (self.fuse_bf16 and T > max(GEMV_MAX_TOKENS, self.quant_matvec_max_tokens)
                    and (not gemm_takes(T, w.N, w.K, self.k.wgmma, self.k.wgmma_t256)
                         or (w.marlin is not None and (self.q4_bf16_input or self.wgmma_takes(T)))))
        return self.fuse_bf16 and T > self.matvec_max_tokens

    def _gemm_out_bf16(self, w: Any, T: int) -> bool:
        """Whether `_linear` over `w` with T tokens can write bf16 words (out_bf16): cuBLAS only, i.e. a bf16
        weight on the GEMM path or a quantized one dequantized for cuBLAS (not the 4-bit GEMMs, which write f32)."""
        if isinstance(w, DeviceQuantWeight):
            return self._gemm_takes_bf16(w, T) and not gemm_takes(T, w.N, w.K, self.k.wgmma, self.k.wgmma_t256)
        return self._gemm_takes_bf16(w, T)

    def _gate_up_bf16(self, layer: Any, T: int) -> bool:
        """Whether gate/up comes out of cuBLAS as bf16 words and silu_mul_bf16_bf16 reads them (`gate_up_bf16`):
        both gate_up and down on the bf16 GEMM path (`_gemm_takes_bf16`), so the f32 [T, 2I] product is never
        written or read."""
        return (self.gate_up_bf16 and self._gemm_out_bf16(layer.gate_up, T)
                and self._gemm_takes_bf16(layer.down, T))

    def _attn_choice(self, T: int, max_len: int | None = None) -> str:
        """The decode attention kernel of a T-token step over contexts up to max_len: "tc", "gqa" or "partial"
        (`attn_kernel`, or the auto rule: ATTN_TC_MIN_TOKENS; one token of small heads takes decode_attn_tc
        only where attn_cluster does not cover max_len, ATTN_TC_SMALL_HEADS_CLUSTER)."""
        if self.attn_kernel != "auto":
            return self.attn_kernel
        tc = self._tc_ok  # (asked twice a layer of every eager step: the answer is kept)
        if tc is None:
            tc = self._tc_ok = self.decode_tc_supported()
        if tc and T >= ATTN_TC_MIN_TOKENS:
            return "tc"
        if tc and self.config.head_dim <= ATTN_GQA_MAX_HEAD_DIM:
            if not (ATTN_TC_SMALL_HEADS_CLUSTER and max_len is not None and self._cluster_form(T, max_len)[0]):
                return "tc"
        return "gqa" if self._use_gqa(T) else "partial"

    def _use_gqa(self, T: int) -> bool:
        if self.attn_kernel not in ("auto", "tc"):
            return self.attn_kernel == "gqa"
        c = self.config
        if c.head_dim <= ATTN_GQA_MAX_HEAD_DIM:
            return T > 1
        return T * c.num_key_value_heads * -(-c.num_queries_per_kv // ATTN_MAXG) >= ATTN_GQA_MIN_BLOCKS

    def _splits(self, T: int, max_len: int, gqa: bool = False) -> int:
        if self.attn_splits is not None:
            return max(1, min(self.attn_splits, max_len))
        c = self.config
        groups = -(-c.num_queries_per_kv // ATTN_MAXG)
        blocks = T * c.num_key_value_heads * groups
        if max_len <= 128 or blocks >= 2 * self.num_sms:
            return 1
        if gqa:  # 4 warps x 32 keys: >= 128 keys a split; ~2 blocks per SM (H200, 7B, B=64: S=2 51 us, S=3 78 us)
            return max(1, min(-(-max_len // 128), -(-2 * self.num_sms // blocks)))
        # A warp walks its keys one dependent round trip (block table, then K/V row) at a time, so a split of
        # 16 keys (4 per warp) keeps a short-context decode latency-bound on 4 keys, not 16; long contexts keep
        # 64-key splits (at most 64 splits, or what 64-key splits need) so attn_merge stays short.
        return max(1, min(-(-max_len // 16), -(-4 * self.num_sms // blocks), max(64, -(-max_len // 64))))

    def _cluster_size(self, T: int, max_len: int) -> int:
        """The cluster (splits) of attn_cluster for a T-token step over contexts up to max_len, 0 where attn_partial
        + attn_merge run instead (`_cluster_form`)."""
        return self._cluster_form(T, max_len)[0]

    def _cluster_form(self, T: int, max_len: int) -> tuple[int, int]:
        """(cluster size, query heads a block) of attn_cluster for a T-token step over contexts up to max_len; size 0
        where attn_partial + attn_merge run instead: where attn_partial is the choice (`_attention`), on sm_90+
        (clusters), for 64- and 128-dim heads (the kernel's d2, d4), while the step's blocks fit one an SM and every
        warp loads its keys in one batch (max_len <= CL x ATTN_CLUSTER_KEYS_PER_SPLIT). "auto" takes 4 heads a block
        (the _g4 forms) before 8, and for each the first of ATTN_CLUSTER_SIZES that fits; the 4-block cluster (an
        A/B form) has 8 heads a block only. A size whose clusters the GPU cannot run all at once (`_attn_cluster_max`)
        gives way to a smaller one that it can, whose warps then loop over their keys."""
        if self.attn_cluster == 0 or self.dpl not in (2, 4) or self.attn_splits is not None or self.k.cc < 90:
            return 0, ATTN_MAXG
        if self.attn_cluster == 4 and self.dpl != 4:  # attn_cluster4 exists for 128-dim heads only (an A/B form)
            return 0, ATTN_MAXG
        c = self.config
        forms = (4, ATTN_MAXG) if self.attn_heads_per_block is None else (self.attn_heads_per_block,)
        for hg in forms:
            if hg == 4 and self.attn_cluster == 4:
                continue
            heads = T * c.num_key_value_heads * -(-c.num_queries_per_kv // hg)
            if self.attn_cluster is not None:  # a forced size (A/Bs): any context, its warps loop over key batches
                if heads * self.attn_cluster <= self.num_sms:
                    return self.attn_cluster, hg
                continue
            for cl in ATTN_CLUSTER_SIZES:
                if heads * cl <= self.num_sms and max_len <= cl * ATTN_CLUSTER_KEYS_PER_SPLIT:
                    if heads > self._attn_cluster_max(cl, hg):  # two waves: a smaller size that runs at once,
                        for c in sorted(ATTN_CLUSTER_SIZES, reverse=True):  # its warps looping over key batches
                            if c < cl and heads <= self._attn_cluster_max(c, hg):
                                return c, hg
                    return cl, hg
        return 0, ATTN_MAXG

    def _attn_cluster_kernel(self, cl: int, hg: int) -> tuple[str, int]:
        """(kernel, threads) of attn_cluster{cl} with hg query heads a block: the _g4 forms for 4 heads, with 16 warps
        under attn_cluster_warps."""
        w16 = hg == 4 and self.attn_cluster_warps == 16
        name = f"attn_cluster{cl}_d{self.dpl}" + ("_g4" if hg == 4 else "") + ("_w16" if w16 else "")
        return name, 2 * ATTN_CLUSTER_THREADS if w16 else ATTN_CLUSTER_THREADS

    def _attn_cluster_max(self, cl: int, hg: int) -> int:
        """The clusters of the attn_cluster{cl} form with hg heads a block that the GPU runs at once. On the H200, 15
        of 8 and 7 of 16 in the 16-warp _g4 forms, so the 7B's 8 clusters of 16 (contexts 513-1024) would run in two
        waves: its attention took 356.0 us a step in clusters of 16 against 229.4 in clusters of 8."""
        return self._max_clusters(*self._attn_cluster_kernel(cl, hg), cl)

    def _max_clusters(self, name: str, threads: int, cl: int) -> int:
        """How many clusters of cl blocks of `threads` threads of kernel `name` the GPU runs at once (the driver's
        cuOccupancyMaxActiveClusters; a launch of more runs in waves), asked once a kernel; stand-in kernels without
        a compiled function (CPU tests) count one block an SM. Kept in `_cluster_counts`, never in `_ws`: an int
        among the workspace's buffers would break every decode graph captured after it."""
        got = self._cluster_counts.get(name)
        if got is None:
            raw = getattr(getattr(self.k, name, None), "raw", None)
            got = self._cluster_counts[name] = (max_active_clusters(raw, (1, self.num_sms // cl, cl), (threads,))
                                                if raw is not None else self.num_sms // cl)
        return got

    def _attn_o_cluster(self, o: Any, db: DeviceBatch) -> int:
        """The cluster size of attn_o_cluster for this step's attention + o projection, 0 where attn_cluster and the
        o matvec run instead: one token (no prefill tile), a bf16 o on the one-token matvec path, 128-dim heads where
        the attention would be attn_cluster's (sm_90+, no forced split count or attention kernel, contexts up to
        1024), no tensor parallel; the largest size (of ATTN_O_AUTO_SIZES, or the one `attn_o_fused` forces)
        whose Hq clusters run at once (`_attn_o_max_clusters`, one block an SM) and whose splits of o's rows fit a
        block (ATTN_O_MAX_ROWS)."""
        c = self.config
        if (not self.attn_o_fused or db.T != 1 or db.n_prefill_tiles or self.tp is not None or self.dpl != 4
                or db.max_len > ATTN_CLUSTER_SIZES[-1] * ATTN_CLUSTER_KEYS_PER_SPLIT  # (attn_partial's beyond)
                or c.head_dim != 128 or isinstance(o, DeviceQuantWeight) or self.matvec_max_tokens < 1
                or self.k.cc < 90 or self.attn_splits is not None or self.attn_cluster == 0
                or self.attn_kernel not in ("auto", "partial") or self._attn_choice(1) == "tc" or self._use_gqa(1)):
            return 0
        N, Hq = o.shape[0], c.num_attention_heads
        for cl in sorted(ATTN_O_CLUSTER_SIZES, reverse=True):
            if self.attn_o_fused not in (True, cl) or (self.attn_o_fused is True and cl not in ATTN_O_AUTO_SIZES):
                continue
            if (Hq * cl <= self.num_sms and N % cl == 0 and N // cl <= ATTN_O_MAX_ROWS[cl]
                    and Hq <= self._attn_o_max_clusters(cl)):
                return cl
        return 0

    def _attn_o_form(self, cl: int) -> tuple[str, int]:
        """(kernel, threads) of attn_o_cluster{cl}: clusters of 8 take the 8-warp form under attn_o_warps=8, and
        under auto where the model's Hq clusters of the 16-warp form would not all run at once (the 3B's 16 on an
        H200's 15)."""
        if cl == 8 and (self.attn_o_warps == 8 or not self.attn_o_warps and self.config.num_attention_heads
                        > self._max_clusters("attn_o_cluster8", ATTN_O_THREADS, cl)):
            return "attn_o_cluster8_w8", ATTN_O_THREADS // 2
        return f"attn_o_cluster{cl}", ATTN_O_THREADS

    def _attn_o_max_clusters(self, cl: int) -> int:
        """The clusters of attn_o_cluster{cl} (the form `_attn_o_form` takes) the GPU runs at once (cl SMs of a GPC
        each, one block an SM, two in the 8-warp form): the 3B's 16 heads in clusters of 8 ran in two waves (H200:
        2.12 against 2.04 ms/token)."""
        return self._max_clusters(*self._attn_o_form(cl), cl)
