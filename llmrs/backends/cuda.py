"""CuPy CUDA backend: bf16 weights and a bf16 paged KV cache resident on the GPU, the forward pass in our
kernels (llmrs/kernels_cu/) and cuBLAS.

Numbers: matrices are stored bf16 (raw uint16 words: numpy and CuPy have no bfloat16); norms and biases as
f32 holding bf16-rounded values; the KV cache is bf16 in the contract layout
`[num_blocks, num_kv_heads, block_size, head_dim]` per layer. Activations and the residual stream stay f32,
so the CPU reference fed the same bf16-rounded weights differs only by bf16 K/V and, in GEMMs, bf16
activations (and gate/up). Linear layers: for up to `matvec_max_tokens` tokens (MATVEC_MAX_TOKENS: one) the
one-warp-per-row matvec (f32 x, bf16 W: decode is memory-bound), otherwise cuBLAS gemmEx (bf16 x bf16 -> f32, f32
accumulate), whose bf16 inputs the norms and SiLU x up write directly (`fuse_bf16`: the same bits as f32 + a cast);
the gate/up GEMM writes bf16 itself where down's GEMM follows (`_gate_up_bf16`: a rounding the f32 path does not
make). Quantized
weights (quant.py): up to 16 tokens the 4-bit GEMV (gemm_q4.cu, tensor cores; cuda_q4gemm.gemv_takes) or, up to
8, the 4-/8-bit matvec (matvec_q4.cu); the Marlin-style 4-bit GEMM up to 192 (cuda_q4gemm.gemm_takes; its wgmma
forms at 65-256 and 425-512 on Hopper), dequantize + cuBLAS above.

Attention: `_attention` picks per step: the tensor-core prefill kernel (cuda_prefill.py) when a sequence brings
`prefill_min_tokens` or more new tokens; else, where it can run, decode_attn_tc (prefill_attention.cu, tensor
cores) from ATTN_TC_MIN_TOKENS tokens (from one for heads of <= 64 dims); else attn_partial (attention.cu) or, from
ATTN_GQA_MIN_BLOCKS blocks a step, attn_partial_gqa (attention_gqa.cu); all split along the keys and share
attn_merge, except where attn_partial's step fits attn_cluster (`_cluster_form`: sm_90+, its splits one thread-block
cluster merged in distributed shared memory, one launch; 4 query heads a block where those blocks fit, else 8).
At one token, where a (query head, split) block each fits (`_attn_o_cluster`), the attention and the o projection
after it are one kernel instead (attn_o_cluster: each block multiplies its head's output into its split of o's rows).

Tensor parallelism: with `tp=TPRank` (tp_nccl.py) the same fused step embeds the rank's vocabulary slice, sums
the embeddings and every o/down partial over the ranks with NCCL on the step's stream, and gathers the logits.

`forward(weights, batch)` is the fused step the engine runs (`CUDAModel`): residual adds ride in the
o/down projections (matvec `accumulate`, GEMM beta = 1), RoPE is fused with the K/V cache write (and, on the
matvec path, both ride in the qkv projection's epilogue, as SiLU x up rides in gate_up's: `fuse_epilogues`, and up
to a hidden size of NORM_FOLD_MAX_K the RMSNorm before each rides in its prologue: `fuse_norm`), and the sampled
rows are gathered inside the final RMSNorm. The Backend protocol methods (`embedding`, `linear`,
...) are kept for `Model.forward` and for the kernel-by-kernel tests.

GPU sampling: `sample(logits_on_device, states)` samples every row in one launch (greedy, temperature,
top-k, top-p, min-p; one uniform per request from its own seeded generator, as the CPU sampler draws). Rows
that need penalties, logprobs or a min_tokens mask fall back to the CPU sampler for the whole call.

CUDA graphs (`cuda_graphs.DecodeGraphs`): a pure decode step (one token per sequence, every row sampled)
replays a graph captured per (batch bucket, context cap) over static buffers; anything else runs eagerly.
`LLMRS_CUDA_GRAPHS=0` turns them off. The KV cache holds one extra block (`pad_block`, never handed out by the
block pool) where the padding rows of a bucket write their K/V. On sm_90+ the graphs are captured with
programmatic dependent launches (cuda_kernels.PDL_KERNELS).

Profiling (`llmrs profile`): set `backend.profiler` to a `llmrs.profiling.profile.KernelTimer` and every launch of the
eager step is bracketed by CUDA events (`_span`); graphs are bypassed while it is set.
"""

from __future__ import annotations

import contextlib
import math
import os
from dataclasses import dataclass
from typing import Any

import numpy as np

from llmrs.backends.cuda_kernels import ATTN_O_CLUSTER_SIZES, MATVEC_ROWS_R, OFF_VALUES, sample_row_blocks
from llmrs.backends.cuda_q4gemm import (GEMV_MAX_TOKENS, dequant_marlin, gemm_q4, gemm_q4_silu, gemm_silu_takes,
                                               gemm_takes, gemv_pair_takes, gemv_q4, gemv_q4_pair, linear_q4,
                                               q4_norm_chain, weight_on_gemv, wgmma_takes)
from llmrs.backends.cuda_wgmma import bf16_wgmma_takes, gemm_bf16wg
from llmrs.engine.batch import StepBatch
from llmrs.engine.config import ModelConfig, env_int
from llmrs.model.decoder import Model, ModelWeights, rope_inv_freq
from llmrs.model.quant import DeviceQuantWeight
from llmrs.engine.sampling import SampleResult, min_tokens_pending, penalized_or_logprobs
from llmrs.errors import UserError
from llmrs import trace
from llmrs.trace import tr

CUDA_R_32F, CUDA_R_16BF, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT = 0, 14, 68, -1
CUBLAS_OP_N, CUBLAS_OP_T = 0, 1
NULL = np.uint64(0)
MATVEC_ROWS_PER_BLOCK = 4
# the long-K matvec's warps per matrix (`_matvec_splits`): splits = the fewest of 1, 2, 4 reaching it
MATVEC_LONG_K_MIN_WARPS = 3584


def splits_by_warps(N: int) -> int:
    """Warps a row (1, 2 or 4) for N rows: the fewest giving the matrix MATVEC_LONG_K_MIN_WARPS warps."""
    return 1 if N >= MATVEC_LONG_K_MIN_WARPS else 2 if 2 * N >= MATVEC_LONG_K_MIN_WARPS else 4


# cuBLAS's first call of a (token count, shape) costs ~2.6 ms of host time (~0.05 ms later; H200, session 18,
# scripts/cublas_first_shape.py), so an eager step whose token count is new pays it for each GEMM shape. With
# LLMRS_GEMM_PAD_ROWS=1 the GEMMs run on gemm_rows(T) rows (the padding rows' inputs and outputs are workspace
# nobody reads): far fewer distinct counts, at the cost of the padding rows' work.
def gemm_rows(T: int) -> int:
    """The row count a T-token GEMM runs on with row padding: T up to 64, then the next multiple of 32 up to 512,
    of 64 up to 2048, of 128 above."""
    if T <= 64:
        return T
    g = 32 if T <= 512 else 64 if T <= 2048 else 128
    return -(-T // g) * g


def room_bytes(a: Any) -> int:
    """Bytes of device memory from a's first element to the end of the allocation it lies in."""
    return int(a.data.mem.size - (a.data.ptr - a.data.mem.ptr))


VIEW_CACHE_MAX = 4096  # workspace views `_buf` keeps (cleared when full)
# The RMSNorm folded into the paired qkv / gate_up matvecs (`fuse_norm` "auto") up to this hidden size. Measured on
# the H200 (scripts/gpu_ab.sh, AB_VALUES LLMRS_FUSE_NORM=0/1, single-stream decode ms/token, unfolded -> folded):
# Qwen2.5-0.5B (896) 0.868 -> 0.841, 3B (2048) 2.776 -> 2.775, 7B (3584) 4.448 -> 4.527: the fold's extra work per
# weight chunk (the norm weight's loads, the sum of squares) costs more than the launch it saves on long rows.
NORM_FOLD_MAX_K = 2048
# Folding only gate_up's norm at 3584 (the 7B) measured faster inside graphs at one token (session 8: 64.6 us against
# 62.8 + 2.6 apart) but slower in the decode: 4.250 / 4.254 -> 4.322 / 4.319 ms/token (session9/call6): not done.
NORM_STAGE_MAX_K = 12288  # matvec.cu's: one token's x * g staged in (at most 48 KB of) shared memory
# bf16 weights: the matvec for one token, cuBLAS from two. Measured on the H200 (`LLMRS_MATVEC_MAX_TOKENS=8|2|1
# llmrs profile --synthetic qwen2.5-7b --batch 1,2,3,4,8`, graph wall ms per decode step, scripts/gpu_crossover.sh):
# 7B with the matvec up to 8 tokens 4.93 / 6.61 / 11.16 / 11.14 / 22.43, cuBLAS from 2 4.93 / 5.28 / 5.23 / 5.26 /
# 5.53 (the f32 matvec is compute-bound from 2-3 tokens); 0.5B B = 2 1.08 matvec vs 1.27 cuBLAS, B = 4 2.55 vs 1.27.
MATVEC_MAX_TOKENS = 1
ATTN_THREADS = 128
ATTN_MAXG = 8  # query heads per attention block (MAXG in attention.cu)
ATTN_GQA_MIN_BLOCKS = 128  # "auto": attn_partial_gqa from this many blocks a step (7B: 32 sequences); measured at 256+
# "auto": attn_partial_gqa from 2 tokens for heads of at most this many dims: with 2 dims a lane attn_partial's
# dot product is mostly shuffles. H200, Qwen2.5-0.5B (head_dim 64), `llmrs profile --batch 1,4,16,64 --context
# 512` graph wall ms, gqa / partial: 0.877 / 0.848, 1.285 / 1.383, 1.340 / 1.529, 1.842 / 2.600; single-stream
# decode 0.839 / 0.759 ms/token since attn_partial stages its block table and attn_merge its (m, l)
# (reports/h200-qwen2.5/session8): one token takes attn_partial. head_dim 128 (3B, 7B) keeps attn_partial below
# 128 blocks (4% faster)
ATTN_GQA_MAX_HEAD_DIM = 64
# ... except where attn_cluster's d2 form covers the context (one launch, no attn_merge: `_cluster_form`): H200,
# Qwen2.5-0.5B one stream, prompt 256 + 256 steps, decode_attn_tc + attn_merge 0.6282 / 0.6287 against attn_cluster
# 0.6118 / 0.6112 ms/token (session 31 call5, alternated; `llmrs profile --timeline` had the pair at 136 us of the
# step's 628); in session 13, before the cluster's 16 warps and 4 heads a block, it had lost (0.728 against 0.695).
# LLMRS_ATTN_TC_SMALL_HEADS=1 keeps decode_attn_tc there (A/Bs)
ATTN_TC_SMALL_HEADS_CLUSTER = os.environ.get("LLMRS_ATTN_TC_SMALL_HEADS", "0") in OFF_VALUES
# "auto": decode_attn_tc (tensor cores, cuda_prefill.decode_attention_tc) from this many tokens a step, and for
# heads of at most ATTN_GQA_MAX_HEAD_DIM dims from one token; where it cannot run (GPUs before sm_80, head dims
# other than 64 / 128, more than 16 query heads a KV head) the rules above. H200, `llmrs profile --synthetic
# qwen2.5-7b --batch 1,64,256 --context 512` graph walls, gqa -> tc: B=64 7.20 -> 5.79 ms (attention 1.68 -> 0.92),
# B=256 12.67 -> 9.42 ms (attention 5.68 -> 2.31 ms, 28% -> 70% of the bandwidth roof); single-stream decode
# (attn_partial -> tc) 0.5B 0.752 -> 0.712 ms/token, 3B 2.351 -> 2.458, 7B 4.249 -> 4.336
# (reports/h200-qwen2.5/session9/call1): one token of 128-dim heads keeps attn_partial.
ATTN_TC_MIN_TOKENS = 2
# attn_cluster (attention.cu): CW = 8 warps a block, each loading CK = 8 keys at once: up to 64 keys a split in one
# batch a warp. Cluster sizes (splits): 8, and 16 (non-portable, allowed per kernel at load). "auto" takes the
# smaller one that covers the step's max_len in one batch (8 up to 512 keys, 16 up to 1024), attn_partial +
# attn_merge beyond. Measured on the H200 (session 13 call2, single-stream decode bench, prompt 256 + 256 steps:
# graphs of context <= 512; ms/token, LLMRS_ATTN_CLUSTER=0 / 16 / 8): 7B 4.225 / 4.194-4.196 / 4.172, 3B 2.351 /
# 2.308, 7B AWQ 2.569 / 2.521.
ATTN_CLUSTER_THREADS = 256
ATTN_CLUSTER_KEYS_PER_SPLIT = 64
ATTN_CLUSTER_SIZES = (8, 16)
# attn_o_cluster{CL} (attention.cu): a block a (query head, split) with 16 warps, each lane holding 8 (CL 8) or 16
# (CL 4) 16-byte chunks of the o weights (2 rows a chunk index), so a split of o's rows is at most 256 / 512 rows
ATTN_O_THREADS = 512
ATTN_O_MAX_ROWS = {8: 256, 4: 512}
# the sizes auto takes: 8 only. H200, one stream (session 30 calls 2-4, `llmrs synth --decode-bench`, one run a
# process): 1.5B (12 heads, clusters of 8) 1.316-1.319 -> 1.294-1.295 ms/token; the 3B's 16 clusters of 8 exceed the
# 15 that run at once (2.044 -> 2.12: two waves), and in clusters of 4 (64 SMs holding o) it ties to loses
# (2.0487 -> 2.0566); LLMRS_ATTN_O_FUSED=4 forces that form (A/Bs)
ATTN_O_AUTO_SIZES = (8,)
CUBLAS_WORKSPACE_BYTES = 32 << 20
_NO_SPAN = contextlib.nullcontext()
_cublas_workspaces: dict[int, Any] = {}  # device id -> buffer: kept alive as long as the process (handles are shared)


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


def round_bf16(a: np.ndarray) -> np.ndarray:
    """float32 values rounded to the nearest bf16 (ties to even), as float32: what the GPU stores."""
    return (bf16_bits(a).astype(np.uint32) << 16).view(np.float32)


def bf16_bits(a: np.ndarray) -> np.ndarray:
    """The bf16 words (uint16) of float32 values, round to nearest even; NaN stays NaN."""
    u = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)
    r = ((u + np.uint32(0x7FFF) + ((u >> 16) & np.uint32(1))) >> 16).astype(np.uint16)
    nan = (u & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000)
    if nan.any():
        r[nan] = ((u[nan] >> 16) | np.uint32(0x40)).astype(np.uint16)
    return r


def cuda_available() -> tuple[bool, str]:
    """(True, device name) when CuPy imports and sees a GPU; else (False, why). Never raises."""
    try:
        import cupy as cp
    except Exception as e:  # ImportError, or a CuPy built for another CUDA
        return False, f"CuPy is not installed ({type(e).__name__}); pip install 'llmrs[cuda13]' (or cuda12)"
    try:
        n = cp.cuda.runtime.getDeviceCount()
    except Exception as e:
        return False, f"no usable CUDA driver/GPU ({e})"
    if n < 1:
        return False, "no CUDA GPU found"
    return True, gpu_name_memory(cp)[0]


def gpu_name_memory(cp: Any, device: int = 0) -> tuple[str, int]:
    """(name, total memory in bytes) of CUDA device `device`, through CuPy `cp`."""
    props = cp.cuda.runtime.getDeviceProperties(device)
    name = props["name"]
    return (name.decode() if isinstance(name, bytes) else str(name)), int(props["totalGlobalMem"])


def _import_cupy() -> Any:
    ok, why = cuda_available()
    if not ok:
        raise UserError(f"the CUDA backend needs CuPy and a GPU: {why}")
    import cupy as cp

    return cp


@dataclass(slots=True)
class DeviceBatch:
    """A StepBatch's index arrays on the GPU (one host-to-device copy per step) + host facts the launches need."""

    T: int
    S: int
    token_ids: Any
    positions: Any
    slots: Any
    token_seq: Any
    sample_rows: Any
    block_tables: Any
    max_blocks: int
    max_len: int  # the longest causal key range of any token (max position + 1)
    kv_tokens: int = 0  # profiling only: keys in cache over all sequences (sum of context_lens)
    qk_pairs: int = 0  # profiling only: (query, key) pairs attended (sum of position + 1)
    prefill_tiles: Any = None  # the tensor-core prefill kernel's work tiles (cuda_prefill.plan_prefill_tiles)
    n_prefill_tiles: int = 0  # 0: attention runs attn_partial


class CUDABackend:
    name = "cuda"
    # GEMM inputs written as bf16 by their producers (rms_norm_bf16, add_rms_norm_bf16, silu_mul_bf16) instead of
    # f32 + cast_f32_bf16: the same bits, two launches fewer per layer; False (tests) keeps the f32 + cast path
    fuse_bf16 = True
    gemm_pad_rows = False  # the bf16 GEMMs on gemm_rows(T) rows (LLMRS_GEMM_PAD_ROWS=1; `_linear`, `_buf`)
    matvec_rows = False  # o at one token as matvec_rows_bf16 (LLMRS_MATVEC_ROWS=1; `_linear`)
    # decode-sized steps (the matvec path): RoPE + the K/V cache write in the qkv projection's epilogue and
    # SiLU x up in gate_up's (matvec_rope_bf16 / matvec_silu_bf16: bit-identical, two launches fewer per layer);
    # LLMRS_FUSE_EPILOGUES=0 (and tests) keep the separate kernels
    fuse_epilogues = os.environ.get("LLMRS_FUSE_EPILOGUES", "1") not in OFF_VALUES
    # ... and, with those paired kernels, the RMSNorm before qkv and before gate_up folded into the projection
    # (x and the norm weight in, the sum of squares in the same pass: one launch less per norm, f32 rounding apart
    # from rms_norm + matvec) for hidden sizes up to NORM_FOLD_MAX_K ("auto"); LLMRS_FUSE_NORM=1 folds at every
    # size, 0 (and the bit-exact tests) keeps rms_norm as its own launch
    fuse_norm = os.environ.get("LLMRS_FUSE_NORM", "auto").lower()
    # decode over 4-bit weights: gemv_q4 (tensor cores, the Marlin layout) instead of matvec_q4 (f32 FMA, the row
    # layout); LLMRS_Q4_GEMV=0 for A/B runs, tests that need matvec_q4's f32 activations set it False
    q4_gemv = os.environ.get("LLMRS_Q4_GEMV", "1") not in OFF_VALUES
    # gemv_q4's K slices of a tile launched as one thread-block cluster on sm_90+ (cuda_q4gemm.gemv_cluster);
    # LLMRS_Q4_GEMV_CLUSTER=0 keeps the hand-off through L2 (A/Bs: "set:q4_gemv_cluster=False")
    q4_gemv_cluster = os.environ.get("LLMRS_Q4_GEMV_CLUSTER", "1") not in OFF_VALUES
    # a 4-bit gate_up / qkv on the GEMV with SiLU x up / RoPE + the KV write in its epilogue (gemm_q4.cu's paired
    # forms, cuda_q4gemm.gemv_pair_takes); LLMRS_Q4_GEMV_EPILOGUE=0 keeps silu_mul / rope_write_kv as launches
    q4_gemv_epilogue = os.environ.get("LLMRS_Q4_GEMV_EPILOGUE", "1") not in OFF_VALUES
    # ... and the RMSNorms between those GEMVs carried by them (cuda_q4gemm.q4_norm_chain: o and down write the next
    # norm's x * g and sums of squares, gate_up and qkv scale by 1 / rms; no rms_norm launch but the first layer's
    # and the final one), f32 / bf16 rounding apart from rms_norm + the GEMVs: "auto" up to a hidden size of
    # cuda_q4gemm.Q4_NORM_CHAIN_MAX_K (where it measured faster), LLMRS_Q4_GEMV_NORM=1 at every size, 0 never
    q4_gemv_norm: bool | str = os.environ.get("LLMRS_Q4_GEMV_NORM", "auto")
    # SiLU x up fused into the batched steps' 4-bit gate_up on the GEMMs (the wgmma forms' 65-256 and 425-512 tokens,
    # mma.sync's 33-192: gemm_q4.cu's gemm_q4{wg,w2}{z,m}_silu_s{S} and gemm_q4{z,m}_silu_m4, cuda_q4gemm.
    # gemm_silu_takes): no [T, 2I] f32 gate/up written and read back, one launch a layer fewer;
    # LLMRS_Q4_GEMM_EPILOGUE=0 keeps silu_mul_bf16 as its own launch (A/Bs)
    q4_gemm_epilogue = os.environ.get("LLMRS_Q4_GEMM_EPILOGUE", "1") not in OFF_VALUES
    # warps an attn_cluster 4-head block, at its default (__init__ reads LLMRS_ATTN_CLUSTER_WARPS; stand-ins built
    # without it, scripts/bench_host_prefill.py's, see this)
    attn_cluster_warps = 16
    # one token's attention and the o projection as one kernel (attention.cu attn_o_cluster: each (head, split)
    # block multiplies its head's output into its split of o's rows, the heads' partials summed by the split's last
    # block; `_attn_o_cluster` says where); LLMRS_ATTN_O_FUSED=0 keeps attn_cluster + the o matvec (A/Bs)
    # (4 or 8: that cluster size only, where it takes the shape)
    attn_o_fused: bool | int = (lambda v: int(v) if v in ("4", "8") else v not in OFF_VALUES)(
        os.environ.get("LLMRS_ATTN_O_FUSED", "1").strip())
    # warps an attn_o_cluster8 block: 16, or 8 (attn_o_cluster8_w8: two blocks an SM, so that more clusters run at
    # once); 0 (auto): 8 where the Hq clusters of the 16-warp form do not all run at once (`_attn_o_form`).
    # H200, Qwen2.5-3B (16 heads; 15 clusters of the 16-warp form at once, 30 of the 8-warp), one stream, prompt 256 +
    # 256 steps, alternated (session 32 call1): 2.0453 / 2.0448 ms/token in two kernels (attn_cluster + the o matvec)
    # -> 2.0183 / 2.0203 fused in 8-warp blocks; the 1.5B (12 heads, all run at once) lost in them (1.2950 -> 1.3119),
    # so it keeps 16. LLMRS_ATTN_O_WARPS=8 / 16 forces a form (A/Bs)
    attn_o_warps = {"8": 8, "16": 16}.get(os.environ.get("LLMRS_ATTN_O_WARPS", "").strip(), 0)
    # the mma.sync 4-bit GEMM (17-192 tokens) reads its x as bf16 words written by the producers (norms, SiLU x up,
    # attention) instead of a cast kernel before each linear, as dequantize + cuBLAS and the wgmma form do: the same
    # bits (the producers' bf16 forms round as cast_f32_bf16 does), ~4 launches a layer fewer (H200, `llmrs profile
    # --synthetic qwen2.5-7b-awq --batch 64`: step 6.369 -> 6.168 ms). LLMRS_Q4_BF16_INPUT=0 for A/Bs
    q4_bf16_input = os.environ.get("LLMRS_Q4_BF16_INPUT", "1") not in OFF_VALUES
    # GEMM-sized steps (prefill, batches above matvec_max_tokens): the q/k/v bias added by rope_write_kv, not by a
    # separate add_bias launch (bit-identical); False (tests) keeps add_bias
    fold_qkv_bias = True

    def __init__(self, config: ModelConfig, num_blocks: int, block_size: int = 16,
                 matvec_max_tokens: int = MATVEC_MAX_TOKENS, cuda_graphs: bool | None = None, tp: Any = None):
        cp = _import_cupy()
        from cupy_backends.cuda.libs import cublas

        from llmrs.backends.cuda_kernels import get_kernels

        c = config
        D = c.head_dim
        if D <= 32:
            self.dpl = 1
        elif D in (64, 128, 256):
            self.dpl = D // 32
        else:
            raise UserError(f"the CUDA backend supports head_dim <= 32, 64, 128 or 256, not {D}")
        if D % 2:
            raise UserError(f"head_dim {D} is odd; rotary embedding needs pairs")
        self.cp, self.cublas = cp, cublas
        self.config = c
        self.tp = tp  # a TPRank (llmrs.engine.tp_nccl) on a tensor-parallel rank: `config` is then its shard's
        self.block_size = block_size
        self.num_blocks = num_blocks
        # bf16 weights: the matvec up to this many tokens, cuBLAS above (LLMRS_MATVEC_MAX_TOKENS, for measuring
        # the crossover); quantized weights: their decode kernels up to quant_matvec_max_tokens (the GEMV's 8)
        self.matvec_max_tokens = env_int("LLMRS_MATVEC_MAX_TOKENS", matvec_max_tokens)
        self.quant_matvec_max_tokens = 8
        if self.fuse_norm not in ("auto", "1", "true", "yes", "on", *OFF_VALUES):
            raise UserError(f"LLMRS_FUSE_NORM={self.fuse_norm!r}: expected auto, 0 or 1")
        # gate/up written by cuBLAS as bf16 where both MLP GEMMs take bf16 (`_gate_up_bf16`); LLMRS_GATE_UP_BF16=0: f32
        self.gate_up_bf16 = os.environ.get("LLMRS_GATE_UP_BF16", "1").strip().lower() not in OFF_VALUES
        forced = os.environ.get("LLMRS_MATVEC_SPLITS", "")
        self._matvec_forced_splits = int(forced) if forced in ("1", "2", "4") else 0
        # warps a row where `_matvec_splits`'s long-K rule applies (a 7B's down): by default the fewest (1, 2, 4)
        # that give the matrix MATVEC_LONG_K_MIN_WARPS warps; LLMRS_MATVEC_LONG_K_SPLITS=1|2|4 sets one count, for
        # A/Bs of that projection alone (LLMRS_MATVEC_SPLITS forces every matrix, and unpairs gate_up / qkv)
        long_k = os.environ.get("LLMRS_MATVEC_LONG_K_SPLITS", "auto").strip().lower()
        if long_k not in ("auto", "1", "2", "4"):
            raise UserError(f"LLMRS_MATVEC_LONG_K_SPLITS={long_k!r}: expected auto, 1, 2 or 4")
        self.long_k_splits = 0 if long_k == "auto" else int(long_k)  # 0: by the warp count
        self.square_k_splits = False  # (an A/B of `_matvec_splits`: o by the warp count too)
        # the bf16 GEMMs on gemm_rows(T) rows where the workspace has room (`_linear`; LLMRS_GEMM_PAD_ROWS)
        self.gemm_pad_rows = os.environ.get("LLMRS_GEMM_PAD_ROWS", "0").strip().lower() not in OFF_VALUES
        # o at one token as matvec_rows_bf16 (its rows in registers while the attention runs; LLMRS_MATVEC_ROWS=1)
        self.matvec_rows = os.environ.get("LLMRS_MATVEC_ROWS", "0").strip().lower() not in OFF_VALUES
        self.attn_splits: int | None = None  # None: chosen per step; tests force values
        # decode attention kernel: "partial" (attention.cu: a warp per key, a shuffle reduction per query head) or
        # "gqa" (attention_gqa.cu: a lane per key, 32 keys a warp, the block's query heads from shared memory);
        # the same arguments and outputs (attn_merge serves both). "auto": gqa once a step has at least
        # ATTN_GQA_MIN_BLOCKS (token, kv head, head group) blocks, partial below. Measured on the H200 (7B shape,
        # context 512): B=256 12.9 -> 5.1 ms a step, B=64 4.3 -> 2.1 ms; one stream through the server 5.16 ->
        # 5.41 ms/token with gqa (its 128-key splits leave a short single-sequence step with few blocks); heads of
        # <= 64 dims take gqa from 2 tokens (ATTN_GQA_MAX_HEAD_DIM).
        # "tc": decode_attn_tc on tensor cores (cuda_prefill.decode_attention_tc); "auto" takes it per
        # ATTN_TC_MIN_TOKENS. LLMRS_ATTN_KERNEL=partial|gqa|tc|auto.
        self.attn_kernel = os.environ.get("LLMRS_ATTN_KERNEL", "auto")
        if self.attn_kernel not in ("partial", "gqa", "auto", "tc"):
            raise UserError(f"LLMRS_ATTN_KERNEL={self.attn_kernel!r}: expected partial, gqa, tc or auto")
        # prefill attention on tensor cores (cuda_prefill.py) for steps where a sequence brings at least this many
        # new tokens (LLMRS_PREFILL_MIN_TOKENS, for experiments); None: never (LLMRS_PREFILL_ATTN=0). Measured on
        # the H200 (7B shape): a tie with attn_partial at 1 x 64 and 16 x 8 tokens, ahead from 16 x 16 and 1 x 128
        # on (1 x 256: 18 us vs 154 us).
        self.prefill_min_tokens: int | None = env_int("LLMRS_PREFILL_MIN_TOKENS", 16)
        # one-launch decode attention (attention.cu's attn_cluster{8,16}_d4: the splits of a (token, kv head) are a
        # thread-block cluster and merge through distributed shared memory, no attn_merge): LLMRS_ATTN_CLUSTER=auto
        # (default, None here: ATTN_CLUSTER_SIZES by context), 4, 8 or 16 (that size at any context, for A/Bs), 0
        # (off: attn_partial + attn_merge); `_cluster_form` says where it runs
        cl = os.environ.get("LLMRS_ATTN_CLUSTER", "auto").strip().lower()
        if cl not in ("auto", "0", "4", *map(str, ATTN_CLUSTER_SIZES)):
            raise UserError(f"LLMRS_ATTN_CLUSTER={cl!r}: expected auto, 0, 4, 8 or 16")
        self.attn_cluster: int | None = None if cl == "auto" else int(cl)
        # query heads a block of attn_cluster takes: 4 (its _g4 forms: twice the blocks, half the per-key work a
        # warp, the same bits; H200 one stream, session20/call1: 7B 3.9394 -> 3.9051, 3B 2.2089 -> 2.1475 ms/token)
        # where the step's blocks fit the SMs, else 8; LLMRS_ATTN_HEADS_PER_BLOCK=4 or 8 forces one (A/Bs)
        hpb = os.environ.get("LLMRS_ATTN_HEADS_PER_BLOCK", "auto").strip()
        if hpb not in ("auto", "4", "8"):
            raise UserError(f"LLMRS_ATTN_HEADS_PER_BLOCK={hpb!r}: expected auto, 4 or 8")
        self.attn_heads_per_block: int | None = None if hpb == "auto" else int(hpb)
        # warps a block of attn_cluster's 4-head forms: 8 (8 keys a warp at a 64-key split) or 16 (_g4_w16: 4 keys
        # a warp, half the per-key chain, a block merge over 16 warps; the default: H200 session 22, one stream best
        # of 3, 7B 3.934 -> 3.908, 3B 2.126 -> 2.077 ms/token); LLMRS_ATTN_CLUSTER_WARPS=8 for A/Bs
        cw = os.environ.get("LLMRS_ATTN_CLUSTER_WARPS", "16").strip()
        if cw not in ("8", "16"):
            raise UserError(f"LLMRS_ATTN_CLUSTER_WARPS={cw!r}: expected 8 or 16")
        self.attn_cluster_warps = int(cw)
        self.k = get_kernels()  # compiles every kernel now (warm-up), not on the first request
        from llmrs.backends.cuda_prefill import prefill_supported

        if (os.environ.get("LLMRS_PREFILL_ATTN", "1") in OFF_VALUES or not prefill_supported(self)
                or self.prefill_min_tokens < 1):
            self.prefill_min_tokens = None
        self.pad_block = num_blocks  # one extra block: padding rows of a graph bucket write here, nothing reads it
        shape = (num_blocks + 1, c.num_key_value_heads, block_size, D)
        # NOTE: each layer's cache is a view of its first num_blocks blocks (the contract shape); the kernels
        # address the pad block past its end through the same base pointer
        self.k_cache = [cp.zeros(shape, dtype=cp.uint16)[:num_blocks] for _ in range(c.num_hidden_layers)]
        self.v_cache = [cp.zeros(shape, dtype=cp.uint16)[:num_blocks] for _ in range(c.num_hidden_layers)]
        self.inv_freq = cp.asarray(rope_inv_freq(c))
        self.scale = np.float32(1.0 / math.sqrt(D))
        self.num_sms = cp.cuda.Device().attributes["MultiProcessorCount"]
        self._one, self._zero = np.array(1.0, dtype=np.float32), np.array(0.0, dtype=np.float32)
        self._one_ptr, self._zero_ptr = self._one.ctypes.data, self._zero.ctypes.data  # (cuBLAS alpha / beta)
        self._handle = cp.cuda.device.get_cublas_handle()
        self._set_cublas_workspace()
        self._ws: dict[str, Any] = {}  # device buffers only (the graphs swap in their own and check every pointer)
        self._cluster_counts: dict[str, int] = {}  # kernel -> clusters at once (`_max_clusters`)
        self._views: dict[tuple, tuple[Any, Any]] = {}  # (name, shape, dtype) -> (buffer, view of it): `_buf`
        self._pin: dict[str, np.ndarray] = {}
        self._staged: dict[str, tuple[int, list[Any]]] = {}  # name -> (last half used, its copies' events)
        # the sampler's output, kept until the next step's feed_tokens has read it (grown preserving its contents)
        self._samples = cp.zeros(256, dtype=cp.int32)
        self._launches = 0  # sample_launch calls: which half of the token read-back buffer a step uses
        self.profiler: Any = None  # a llmrs.profiling.profile.KernelTimer while `llmrs profile` measures
        self._raw_gemm: Any = None  # set by DecodeGraphs while capturing: CuPy's gemmEx refuses stream capture
        self._lt: Any = None  # cuda_lt.LtGemm: the bf16 GEMMs through cuBLASLt (LLMRS_CUBLASLT=1; off: no gain, s17)
        if os.environ.get("LLMRS_CUBLASLT", "0") not in OFF_VALUES:
            from llmrs.backends.cuda_lt import LtGemm

            self._lt = LtGemm(_cublas_workspaces[cp.cuda.Device().id].data.ptr, CUBLAS_WORKSPACE_BYTES)
        if cuda_graphs is None:
            cuda_graphs = os.environ.get("LLMRS_CUDA_GRAPHS", "1") not in OFF_VALUES
        self.graphs: Any = None
        if cuda_graphs:
            from llmrs.backends.cuda_graphs import DecodeGraphs

            self.graphs = DecodeGraphs(self)
        # a lone prompt's prefill from graphs (cuda_prefill_graphs; on with the decode graphs, LLMRS_PREFILL_GRAPHS=0
        # turns it off)
        self.prefill_graphs: Any = None
        if cuda_graphs and os.environ.get("LLMRS_PREFILL_GRAPHS", "1").strip().lower() not in OFF_VALUES:
            from llmrs.backends.cuda_prefill_graphs import PrefillGraphs

            self.prefill_graphs = PrefillGraphs(self)

    def _set_cublas_workspace(self) -> None:
        """A fixed cuBLAS workspace, so that cuBLAS allocates nothing inside a graph capture."""
        dev = self.cp.cuda.Device().id
        ws = _cublas_workspaces.get(dev)
        if ws is None:
            ws = _cublas_workspaces[dev] = self.cp.empty(CUBLAS_WORKSPACE_BYTES, dtype=self.cp.uint8)
        try:
            self.cublas.setWorkspace(self._handle, ws.data.ptr, CUBLAS_WORKSPACE_BYTES)
        except AttributeError:  # an old CuPy without cublasSetWorkspace: cuBLAS keeps its own
            pass

    def _span(self, kind: str, name: str, *dims: Any) -> Any:
        """Times the launches inside it when a profiler is set (else a shared no-op context)."""
        p = self.profiler
        return _NO_SPAN if p is None else p.span(kind, name, dims)

    # ------------------------------------------------------------------ memory
    @staticmethod
    def kv_bytes_per_block(config: ModelConfig, block_size: int = 16) -> int:
        return 2 * config.num_hidden_layers * config.num_key_value_heads * block_size * config.head_dim * 2

    @staticmethod
    def device_sms() -> int:
        """The current GPU's streaming multiprocessors (before a backend exists: the KV sizing)."""
        return int(_import_cupy().cuda.Device().attributes["MultiProcessorCount"])

    @staticmethod
    def blocks_that_fit(config: ModelConfig, weight_bytes: int, gpu_memory_utilization: float = 0.9,
                        block_size: int = 16, activation_reserve: int = 1 << 30) -> int:
        """KV blocks that fit in utilization x total GPU memory after the weights and an activation reserve."""
        cp = _import_cupy()
        free, total = cp.cuda.runtime.memGetInfo()
        budget = gpu_memory_utilization * total - weight_bytes - activation_reserve - (total - free)
        return max(0, int(budget // CUDABackend.kv_bytes_per_block(config, block_size)))

    def _buf(self, name: str, shape: tuple[int, ...], dtype: Any = np.float32) -> Any:
        """A persistent workspace view of `shape` (grown, never shrunk: no allocation once warm). The view itself is
        kept per (name, shape, dtype) and handed out again while the same buffer backs it: an eager step asks for
        ~10 of them a layer, and making two CuPy views (slice, reshape) each time cost more host time than the
        launch that uses it (a prefill's host time is the GPU's idle time)."""
        cur = self._ws.get(name)
        key = (name, shape, dtype)
        hit = self._views.get(key)
        if hit is not None and hit[0] is cur:  # (the decode graphs swap in their own workspace while capturing)
            return hit[1]
        n = int(np.prod(shape))
        # room for a GEMM's padding rows past a [T, X] view (gemm_rows; only `_linear` reads or writes them)
        room = gemm_rows(shape[0]) * int(np.prod(shape[1:])) if self.gemm_pad_rows and len(shape) == 2 else n
        if cur is None or cur.size < room or cur.dtype != np.dtype(dtype):
            cur = self.cp.empty(max(room, 1), dtype=dtype)
            self._ws[name] = cur
            self._views = {k: v for k, v in self._views.items() if k[0] != name}  # the old buffer's views go too
        if len(self._views) >= VIEW_CACHE_MAX:  # (step shapes vary with the batch: keep the cache bounded)
            self._views.clear()
        view = cur[:n].reshape(shape)
        self._views[key] = (cur, view)
        return view

    def _pinned(self, name: str, n: int, dtype: Any) -> np.ndarray:
        """A persistent page-locked host buffer (copies from it skip the driver's staging; grown, never shrunk)."""
        cur = self._pin.get(name)
        if cur is None or cur.size < n or cur.dtype != np.dtype(dtype):
            size = max(n, 1)
            mem = self.cp.cuda.alloc_pinned_memory(size * np.dtype(dtype).itemsize)
            cur = self._pin[name] = np.frombuffer(mem, dtype=dtype, count=size)
        return cur[:n]

    def _stage(self, name: str, a: np.ndarray) -> Any:
        """`a` in a device workspace buffer, by an async copy from a page-locked buffer. Two such buffers per name
        take turns, each refilled only once its last copy is done, so the host can stage step n+1's data while
        step n's copy may still wait in the stream (async scheduling)."""
        cp = self.cp
        half, events = self._staged.get(name, (1, [None, None]))
        half = 1 - half
        if events[half] is not None:
            events[half].synchronize()
        h = self._pinned(f"{name}.{half}", a.size, a.dtype)
        h[:] = a.reshape(-1)
        stream = cp.cuda.get_current_stream()
        d = self._buf(name, (a.size,), a.dtype)
        d.set(h, stream=stream)
        ev = events[half] or cp.cuda.Event(disable_timing=True)
        ev.record(stream)
        events[half] = ev
        self._staged[name] = (half, events)
        return d

    def feed(self, token_ids: Any, feed: np.ndarray) -> None:
        """Rows of device `token_ids` with feed[t] >= 0 take sample feed[t] of the last sampled step (StepBatch.feed:
        async scheduling planned this step before those samples were on the host)."""
        T = int(feed.shape[0])
        self.k.feed_tokens((-(-T // 256),), (256,), (token_ids, self._stage("feed", feed.astype(np.int32, copy=False)),
                                                     self._samples, np.int32(T)))

    # ------------------------------------------------------------------ weights
    def upload(self, w: np.ndarray) -> Any:
        """Matrices -> bf16 words on the GPU (rounded there); vectors -> f32 holding bf16-rounded values."""
        cp = self.cp
        if w.ndim == 1:
            return cp.asarray(round_bf16(w))
        x = cp.asarray(np.ascontiguousarray(w, dtype=np.float32))
        out = cp.empty(x.shape, dtype=cp.uint16)
        self._cast_bf16(x, out)
        del x
        return out

    def upload_bf16(self, x_f32_device: Any) -> Any:
        """A device f32 matrix -> a new bf16 matrix (synthetic weights are drawn on the GPU)."""
        out = self.cp.empty(x_f32_device.shape, dtype=self.cp.uint16)
        self._cast_bf16(x_f32_device, out)
        return out

    def upload_quantized(self, w: Any) -> DeviceQuantWeight:
        """A llmrs.model.quant.QuantWeight (AWQ, GGUF Q4_0/Q4_1/Q8_0) stays quantized on the GPU, in its row-major
        form (matvec_q4.cu reads it; build_weights calls this for quantized linears)."""
        cp = self.cp
        if w.K % 32 or w.group_size % 32:
            raise UserError(f"quantized weight {w.shape}: K and the group size must be multiples of 32")
        dw = DeviceQuantWeight(w.source, w.N, w.K, w.group_size, cp.asarray(np.ascontiguousarray(w.qweight)),
                               cp.asarray(np.ascontiguousarray(w.scales).view(np.uint16)),
                               None if w.zeros is None else cp.asarray(np.ascontiguousarray(w.zeros).view(np.uint16)))
        return self.add_gemm_layout(dw)

    def add_gemm_layout(self, dw: DeviceQuantWeight) -> DeviceQuantWeight:
        """A 4-bit weight's reordered copy for the GEMV / GEMM (cuda_q4gemm.to_marlin); its row form is released
        where no kernel reads it (cuda_q4gemm.row_form_needed), else both stay (~2x the 4-bit bytes)."""
        from llmrs.backends.cuda_q4gemm import row_form_needed, to_marlin

        dw.marlin = to_marlin(self, dw)
        if dw.marlin is not None and not row_form_needed(dw.N, dw.K, self.num_sms, self.q4_gemv):
            dw.qweight = dw.scales = dw.zeros = None
        return dw

    def _cast_bf16(self, x: Any, out: Any) -> None:
        n = x.size
        self.k.cast_f32_bf16((min(65535, -(-n // 1024)),), (256,), (x, out, np.int64(n)))  # 4 a thread

    # ------------------------------------------------------------------ batch
    def pack_batch(self, batch: StepBatch) -> tuple[np.ndarray, int]:
        """A StepBatch's index arrays as one int32 array (the layout `device_batch` and the prefill graphs copy to
        the GPU: token ids, positions, slots, token_seq [T] each, sample rows [S], block tables, prefill tiles) and
        the number of prefill tiles."""
        T, B = batch.num_tokens, batch.num_seqs
        lens = np.diff(batch.query_start)
        token_seq = np.repeat(np.arange(B, dtype=np.int32), lens)
        bt = np.ascontiguousarray(batch.block_tables, dtype=np.int32)
        tiles = np.zeros((0, 4), dtype=np.int32)
        if self.prefill_min_tokens is not None and T and int(lens.max()) >= self.prefill_min_tokens:
            from llmrs.backends.cuda_prefill import plan_prefill_tiles

            tiles = plan_prefill_tiles(batch.query_start, batch.positions)
        packed = np.concatenate([batch.token_ids.astype(np.int32), batch.positions.astype(np.int32),
                                 batch.slot_mapping.astype(np.int32), token_seq,
                                 batch.sample_rows.astype(np.int32), bt.reshape(-1), tiles.reshape(-1)])
        return packed, len(tiles)

    @staticmethod
    def unpack_batch(d: Any, batch: StepBatch, n_tiles: int) -> DeviceBatch:
        """The DeviceBatch whose arrays are views of `d`, a device copy of `pack_batch(batch)`'s array."""
        T, S = batch.num_tokens, int(batch.sample_rows.shape[0])
        bt = batch.block_tables
        o = np.cumsum([0, T, T, T, T, S, bt.size])
        return DeviceBatch(T=T, S=S, token_ids=d[o[0]:o[1]], positions=d[o[1]:o[2]], slots=d[o[2]:o[3]],
                           token_seq=d[o[3]:o[4]], sample_rows=d[o[4]:o[5]], block_tables=d[o[5]:o[6]],
                           max_blocks=int(bt.shape[1]), max_len=int(batch.positions.max()) + 1 if T else 0,
                           prefill_tiles=d[o[6]:], n_prefill_tiles=n_tiles)

    def device_batch(self, batch: StepBatch) -> DeviceBatch:
        packed, n_tiles = self.pack_batch(batch)
        d = self._stage("batch", packed)  # async: the host may run ahead of the GPU (async scheduling)
        db = self.unpack_batch(d, batch, n_tiles)
        if self.profiler is not None:
            db.kv_tokens = int(np.sum(batch.context_lens))
            db.qk_pairs = int(np.sum(batch.positions.astype(np.int64) + 1))
        return db

    # ------------------------------------------------------------------ launches
    def _rms_norm(self, x: Any, w: Any, eps: float, out: Any, rows: Any = None, n_rows: int | None = None) -> None:
        H = x.shape[1]
        n = x.shape[0] if n_rows is None else n_rows
        threads = norm_threads(H)
        with self._span("rms_norm", "rms_norm", n, H):
            self.k.rms_norm((n,), (threads,), (x, NULL if rows is None else rows, w, out, np.int32(H), np.float32(eps)))

    def _matvec_splits(self, N: int, K: int) -> int:
        """Warps per output row of matvec_bf16 (1, 2 or 4), by shape only (the same for every token count, so a
        row sums in the same order alone or in a batch): few rows and a long K (a 7B's down, o, qkv) leave
        most SMs short of loads in flight with one warp a row; LLMRS_MATVEC_SPLITS forces one value."""
        if K % 8:
            return 1
        if self._matvec_forced_splits:
            return self._matvec_forced_splits
        # measured on the H200 (T = 1): o/qkv (K = N) slower with 2 or 4. Long K: alone, the 7B's down took 42.5 us
        # with 1 and 39.0 with 4, but inside the graphed step (one stream, session 18) the fewest splits that give
        # ~3584 warps won: 7B (N 3584) 1, 3B (2048) 2, 0.5B (896) 4, each 1.2-2.3 us a layer ahead of the others
        if not (K >= 4 * N and K >= 4096 and N * 4 <= 16384):
            # square_k_splits (an A/B, off): a square matrix (o) by the long-K rule's warp count too
            return splits_by_warps(N) if self.square_k_splits and N == K else 1
        return self.long_k_splits or splits_by_warps(N)

    def _counters(self, name: str, n: int) -> Any:
        """n int32 counters in the workspace, zeros once: the split hand-offs' (gemv_q4's K slices, the sampler's
        blocks of a row), each launch's last block of a tile or row putting its counter back to 0."""
        c = self._ws.get(name)
        if c is None:
            c = self._ws[name] = self.cp.zeros(n, dtype=self.cp.int32)
        return c

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
        if not out_bf16 and bf16_wgmma_takes(self, T, N, K):  # K split over a cluster (cuda_wgmma), opt-in
            gemm_bf16wg(self, xb, w, bias, out, accumulate, name)
            return
        M = T  # the rows cuBLAS computes: gemm_rows(T) where both buffers have room (the padding rows unread)
        if self.gemm_pad_rows:
            Tp = gemm_rows(T)
            if Tp != T and room_bytes(xb) >= Tp * K * 2 and room_bytes(out) >= Tp * N * out.itemsize:
                M = Tp
        with self._span("gemm", name, T, N, K, accumulate, False, 2 if out_bf16 else 4):
            # row-major out[T, N] = x[T, K] @ w[N, K]^T  <=>  column-major out^T[N, T] = w^T' ... (op(A) = W^T view)
            if self._lt is not None:  # cuBLASLt, each shape's algorithm chosen once (LLMRS_CUBLASLT=1, cuda_lt)
                self._lt.matmul(N, M, K, self._one_ptr, w.data.ptr, xb.data.ptr,
                                self._one_ptr if accumulate else self._zero_ptr, out.data.ptr,
                                CUDA_R_16BF if out_bf16 else CUDA_R_32F, self.cp.cuda.get_current_stream().ptr)
            else:
                gemm = self.cublas.gemmEx if self._raw_gemm is None else self._raw_gemm
                gemm(self._handle, CUBLAS_OP_T, CUBLAS_OP_N, N, M, K,
                     self._one_ptr, w.data.ptr, CUDA_R_16BF, K, xb.data.ptr, CUDA_R_16BF, K,
                     self._one_ptr if accumulate else self._zero_ptr, out.data.ptr,
                     CUDA_R_16BF if out_bf16 else CUDA_R_32F, N, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT)
        if bias is not None:
            n = T * N
            with self._span("add_bias", "add_bias " + name, T, N):
                self.k.add_bias((min(65535, -(-n // 256)),), (256,), (out, bias, np.int32(T), np.int32(N)))

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
        if self.fuse_norm in OFF_VALUES:
            return False
        return self.fuse_norm != "auto" or w.shape[1] <= NORM_FOLD_MAX_K

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
        gemv_q4, where cuda_q4gemm.gemv_takes) or the 4-/8-bit matvec (matvec_q4.cu) streams the packed weight; up
        to GEMV_MAX_TOKENS the GEMV; where cuda_q4gemm.gemm_takes the Marlin-style 4-bit GEMM (gemm_q4.cu, weights
        decoded to the same bf16 values --dequantize holds); above, the weight is dequantized into a bf16 scratch
        (bit-exact with the --dequantize weights) for cuBLAS."""
        T, K = x.shape
        N, G = w.N, w.group_size
        assert w.K == K and out.shape == (T, N)
        # 4-bit up to GEMV_MAX_TOKENS: the tensor-core GEMV over the GEMM's layout (gemm_q4.cu) where it is the
        # faster one, and always for a weight held only in that layout (cuda_q4gemm.weight_on_gemv); the row-major
        # matvec for 8-bit, for one token of a smaller N, and for shapes the layout lacks (or LLMRS_Q4_GEMV=0)
        if weight_on_gemv(self, w, T) and gemv_q4(self, x, w.marlin, bias, out, accumulate, name, w.nbytes):
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
        # the Marlin-style 4-bit GEMM (gemm_q4.cu); beyond cuda_q4gemm.gemm_takes dequantize + cuBLAS is faster.
        # x arrives as bf16 words where the wgmma form runs (`_gemm_takes_bf16`): the GEMM reads it uncast
        if gemm_takes(T, N, K, self.k.wgmma, self.k.wgmma_t256):
            assert not out_bf16, f"{name}: the 4-bit GEMM writes f32"
            if x.dtype == np.uint16:
                assert gemm_q4(self, x, w.marlin, bias, out, accumulate, name=name), f"{name}: bf16 x, no GEMM layout"
                return
            if linear_q4(self, x, w.marlin, bias, out, accumulate, name):
                return
        wb = self._buf("dequant_w", (N, K), np.uint16)
        grid = (min(65535, -(-(N * K // 8) // 256)),)  # a word (8 weights) a thread
        with self._span("dequant", name, N, K, w.nbytes):
            if w.marlin is not None:
                # from the GEMM layout wherever there is one: its kernel stores whole 16-byte runs (H200, the 7B's
                # down: 49 us a layer against the row form's 78)
                dequant_marlin(self, w.marlin, wb)
            elif w.kind == "q8":
                self.k.dequant_q8_bf16(grid, (256,), (w.qweight, w.scales, wb, np.int32(N), np.int32(K)))
            else:  # DQ_WORDS (4) words a thread a pass
                self.k.dequant_q4_bf16((min(65535, -(-grid[0] // 4)),), (256,),
                                       (w.qweight, w.scales, NULL if w.zeros is None else w.zeros, wb, np.int32(N),
                                        np.int32(K), np.int32(G), np.int32(1 if w.mode == "min" else 0)))
        self._linear(x, wb, bias, out, accumulate, name, out_bf16)

    def _gemm_takes_bf16(self, w: Any, T: int) -> bool:
        """Whether `_linear` over `w` with T tokens reads bf16 x, so that the producer of its input writes bf16 words
        itself (`fuse_bf16`): a plain bf16 weight above the matvec's tokens (cuBLAS, or the opt-in bf16 wgmma GEMM),
        a quantized one above every packed-weight kernel's (dequantized into a bf16 scratch, then cuBLAS:
        `_linear_quant`) and where the wgmma form of the 4-bit GEMM runs (the mma.sync one too with
        `q4_bf16_input`, on by default). The matvec and the 4-bit GEMV take f32."""
        if isinstance(w, DeviceQuantWeight):  # the 4-bit GEMMs read bf16 x too (wgmma always, mma.sync by switch)
            return (self.fuse_bf16 and T > max(GEMV_MAX_TOKENS, self.quant_matvec_max_tokens)
                    and (not gemm_takes(T, w.N, w.K, self.k.wgmma, self.k.wgmma_t256)
                         or (w.marlin is not None and (self.q4_bf16_input or wgmma_takes(self, T)))))
        return self.fuse_bf16 and T > self.matvec_max_tokens

    def _gemm_out_bf16(self, w: Any, T: int) -> bool:
        """Whether `_linear` over `w` with T tokens can write bf16 words (out_bf16): cuBLAS only, i.e. a bf16
        weight on the GEMM path or a quantized one dequantized for cuBLAS (not the 4-bit GEMMs, which write f32)."""
        if isinstance(w, DeviceQuantWeight):
            return self._gemm_takes_bf16(w, T) and not gemm_takes(T, w.N, w.K, self.k.wgmma, self.k.wgmma_t256)
        return self._gemm_takes_bf16(w, T)

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

    def _gate_up_bf16(self, layer: Any, T: int) -> bool:
        """Whether gate/up comes out of cuBLAS as bf16 words and silu_mul_bf16_bf16 reads them (LLMRS_GATE_UP_BF16):
        both gate_up and down on the bf16 GEMM path (`_gemm_takes_bf16`), so the f32 [T, 2I] product is never
        written or read."""
        return (self.gate_up_bf16 and self._gemm_out_bf16(layer.gate_up, T)
                and self._gemm_takes_bf16(layer.down, T))

    def _attn_choice(self, T: int, max_len: int | None = None) -> str:
        """The decode attention kernel of a T-token step over contexts up to max_len: "tc", "gqa" or "partial"
        (LLMRS_ATTN_KERNEL, or the auto rule: ATTN_TC_MIN_TOKENS; one token of small heads takes decode_attn_tc
        only where attn_cluster does not cover max_len, ATTN_TC_SMALL_HEADS_CLUSTER)."""
        if self.attn_kernel != "auto":
            return self.attn_kernel
        tc = getattr(self, "_tc_ok", None)  # (asked twice a layer of every eager step: the answer is kept)
        if tc is None:
            from llmrs.backends.cuda_prefill import decode_tc_supported

            tc = self._tc_ok = decode_tc_supported(self)
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
        under attn_cluster_warps (LLMRS_ATTN_CLUSTER_WARPS)."""
        w16 = hg == 4 and self.attn_cluster_warps == 16
        name = f"attn_cluster{cl}_d{self.dpl}" + ("_g4" if hg == 4 else "") + ("_w16" if w16 else "")
        return name, 2 * ATTN_CLUSTER_THREADS if w16 else ATTN_CLUSTER_THREADS

    def _attn_cluster_max(self, cl: int, hg: int) -> int:
        """The clusters of the attn_cluster{cl} form with hg heads a block that the GPU runs at once. H200 (session 31
        call2): 15 of 8 and 7 of 16 in the 16-warp _g4 forms, so the 7B's 8 clusters of 16 (contexts 513-1024) ran
        in two waves: `llmrs profile --synthetic qwen2.5-7b --batch 1 --context 768 --timeline`, the attention 356.0
        us a step in clusters of 16 against 229.4 in clusters of 8 (LLMRS_ATTN_CLUSTER=8), the step 4.257 -> 4.075
        ms."""
        return self._max_clusters(*self._attn_cluster_kernel(cl, hg), cl)

    def _max_clusters(self, name: str, threads: int, cl: int) -> int:
        """How many clusters of cl blocks of `threads` threads of kernel `name` the GPU runs at once (the driver's
        cuOccupancyMaxActiveClusters; a launch of more runs in waves), asked once a kernel; stand-in kernels without
        a compiled function (CPU tests) count one block an SM. Kept in `_cluster_counts`, never in `_ws`: an int
        among the workspace's buffers broke every decode graph captured after it (session 32)."""
        got = self._cluster_counts.get(name)
        if got is None:
            from llmrs.backends.cuda_kernels import max_active_clusters

            raw = getattr(getattr(self.k, name, None), "raw", None)
            got = self._cluster_counts[name] = (max_active_clusters(raw, (1, self.num_sms // cl, cl), (threads,))
                                                if raw is not None else self.num_sms // cl)
        return got

    def _attn_o_cluster(self, o: Any, db: DeviceBatch) -> int:
        """The cluster size of attn_o_cluster for this step's attention + o projection, 0 where attn_cluster and the
        o matvec run instead: one token (no prefill tile), a bf16 o on the one-token matvec path, 128-dim heads where
        the attention would be attn_cluster's (sm_90+, no forced split count or attention kernel, contexts up to
        1024), no tensor parallel; the largest size (of ATTN_O_AUTO_SIZES, or the one LLMRS_ATTN_O_FUSED forces)
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
        """(kernel, threads) of attn_o_cluster{cl}: clusters of 8 take the 8-warp form under LLMRS_ATTN_O_WARPS=8, and
        under auto where the model's Hq clusters of the 16-warp form would not all run at once (the 3B's 16 on an
        H200's 15)."""
        if cl == 8 and (self.attn_o_warps == 8 or not self.attn_o_warps and self.config.num_attention_heads
                        > self._max_clusters("attn_o_cluster8", ATTN_O_THREADS, cl)):
            return "attn_o_cluster8_w8", ATTN_O_THREADS // 2
        return f"attn_o_cluster{cl}", ATTN_O_THREADS

    def _attn_o_max_clusters(self, cl: int) -> int:
        """The clusters of attn_o_cluster{cl} (the form `_attn_o_form` takes) the GPU runs at once (cl SMs of a GPC
        each, one block an SM, two in the 8-warp form): the 3B's 16 heads in clusters of 8 ran in two waves (H200,
        session 30: 2.12 against 2.04 ms/token)."""
        return self._max_clusters(*self._attn_o_form(cl), cl)

    def _attention_o(self, layer: int, q: Any, q_stride: int, db: DeviceBatch, o: Any, x: Any, cl: int) -> None:
        """x += o(attention of q over layer's cache): attn_o_cluster{cl}, one token (`_attn_o_cluster`)."""
        c = self.config
        T, Hq, Hkv, D, N = db.T, c.num_attention_heads, c.num_key_value_heads, c.head_dim, o.shape[0]
        part = self._buf("attn_o_part", (T, Hq, N))
        counts = self._counters(f"attn_o_counts{cl}", T * cl)
        name, threads = self._attn_o_form(cl)
        with self._span("attn_o", name, T, Hq, Hkv, D, db.kv_tokens, db.qk_pairs, cl, N):
            getattr(self.k, name)((T, Hq, cl), (threads,),
                                  (q, np.int32(q_stride), self.k_cache[layer], self.v_cache[layer], db.block_tables,
                                   np.int32(db.max_blocks), db.token_seq, db.positions, o, part, counts, x,
                                   np.int32(Hq), np.int32(Hkv), np.int32(N), np.int32(self.block_size), self.scale))

    def _attention(self, layer: int, q: Any, q_stride: int, db: DeviceBatch, out: Any, out_bf16: Any = None) -> Any:
        """out [T, Hq*D] = paged causal attention of q (row stride q_stride) over layer's cache; returns the buffer
        written: `out_bf16` (bf16 words, the o projection's GEMM input) where a tensor-core kernel (prefill,
        decode_attn_tc) runs the step and one is given, else `out` (f32)."""
        if db.n_prefill_tiles:
            from llmrs.backends.cuda_prefill import prefill_attention

            dst = out if out_bf16 is None else out_bf16
            if prefill_attention(self, layer, q, q_stride, db, db.prefill_tiles, db.n_prefill_tiles, dst):
                return dst
        if self._attn_choice(db.T, db.max_len) == "tc":
            from llmrs.backends.cuda_prefill import decode_attention_tc

            dst = decode_attention_tc(self, layer, q, q_stride, db, out, out_bf16)
            if dst is not None:
                return dst
        c = self.config
        T, Hq, Hkv, D = db.T, c.num_attention_heads, c.num_key_value_heads, c.head_dim
        gqa = self._use_gqa(T)
        groups = -(-c.num_queries_per_kv // ATTN_MAXG)
        cl, hg = (0, ATTN_MAXG) if gqa else self._cluster_form(T, db.max_len)
        if cl:
            name, threads = self._attn_cluster_kernel(cl, hg)
            with self._span("attention", name, T, Hq, Hkv, D, db.kv_tokens, db.qk_pairs, cl):
                getattr(self.k, name)((T, Hkv * -(-c.num_queries_per_kv // hg), cl), (threads,),
                                      (q, np.int32(q_stride), self.k_cache[layer], self.v_cache[layer],
                                       db.block_tables, np.int32(db.max_blocks), db.token_seq, db.positions, out,
                                       np.int32(Hq), np.int32(Hkv), np.int32(D), np.int32(self.block_size),
                                       self.scale))
            return out
        S = self._splits(T, db.max_len, gqa)
        chunk = -(-db.max_len // S)
        part_acc, part_ml = self._attn_partials(T, Hq, D, S)
        name = f"attn_partial{'_gqa' if gqa else ''}_d{self.dpl}"
        fn = getattr(self.k, name)
        with self._span("attention", name, T, Hq, Hkv, D, db.kv_tokens, db.qk_pairs, S):
            fn((T, Hkv * groups, S), (ATTN_THREADS,),
               (q, np.int32(q_stride), self.k_cache[layer], self.v_cache[layer], db.block_tables,
                np.int32(db.max_blocks), db.token_seq, db.positions, out, part_acc, part_ml, np.int32(Hq),
                np.int32(Hkv), np.int32(D), np.int32(self.block_size), np.int32(chunk), self.scale))
        self._attn_merge(part_acc, part_ml, out, T, Hq, D, S)
        return out

    def _attn_partials(self, T: int, Hq: int, D: int, S: int) -> tuple[Any, Any]:
        """The per-split partial sums and (m, l) pairs a decode attention launch of S splits writes for attn_merge
        (NULL, NULL for one split: the kernel writes the output itself)."""
        if S == 1:
            return NULL, NULL
        return self._buf("attn_acc", (T * Hq * S * D,)), self._buf("attn_ml", (T * Hq * S * 2,))

    def _attn_merge(self, part_acc: Any, part_ml: Any, dst: Any, T: int, Hq: int, D: int, S: int) -> None:
        """dst [T, Hq*D] = the S splits' partials combined (attn_merge; attn_merge_bf16 where dst holds bf16 words);
        nothing for one split."""
        if S == 1:
            return
        name = "attn_merge_bf16" if dst.dtype == np.uint16 else "attn_merge"
        with self._span("attn_merge", name, T, Hq, D, S):
            getattr(self.k, name)((T, Hq), (-(-D // 32) * 32,),
                                  (part_acc, part_ml, dst, np.int32(Hq), np.int32(D), np.int32(S)))

    # ------------------------------------------------------------------ the fused step
    def forward(self, w: ModelWeights, batch: StepBatch, to_host: bool = True) -> Any:
        """Logits of batch.sample_rows [S, vocab]: host f32, or (to_host=False) a device view that the next
        step overwrites."""
        if self.graphs is not None and self.profiler is None:
            logits = self.graphs.run(w, batch)
            if logits is None and self.prefill_graphs is not None and batch.feed is None:
                logits = self.prefill_graphs.run(w, batch)
            if logits is not None:
                return self.cp.asnumpy(logits) if to_host else logits
        tr("fwd_begin")
        db = self.device_batch(batch)
        if batch.feed is not None:
            self.feed(db.token_ids, batch.feed)
        tr("fwd_batch")
        logits = self._forward_device(w, db)
        tr("fwd_queued")
        return self.cp.asnumpy(logits) if to_host else logits

    def _forward_device(self, w: ModelWeights, db: DeviceBatch) -> Any:
        """The step's launches on the current stream (also what a decode graph captures); logits [S, vocab]."""
        c, k = self.config, self.k
        T, S, H = db.T, db.S, c.hidden_size
        Hq, Hkv, D, I = c.num_attention_heads, c.num_key_value_heads, c.head_dim, c.intermediate_size
        n_qkv = (Hq + 2 * Hkv) * D
        eps = c.rms_norm_eps
        x = self._buf("x", (T, H))
        qkv = self._buf("qkv", (T, n_qkv))
        att = self._buf("att", (T, Hq * D))
        gu = self._buf("gu", (T, 2 * I))
        tp = self.tp
        start, rows = (0, c.vocab_size) if tp is None else tp.vocab_range
        with self._span("embedding", "embedding_gather", T, H):
            k.embedding_gather((T,), (256,), (w.embed, db.token_ids, x, np.int32(H), np.int32(start), np.int32(rows)))
        if tp is not None:
            self._all_reduce(x)  # every rank embedded the tokens of its vocabulary slice, zeros for the rest
        # tensor parallel: o and down write the rank's partial sum into `part`, summed over the ranks in place
        # (NCCL, on this stream), then added to the residual by the RMSNorm that follows (add_rms_norm)
        part = self._buf("tp_part", (T, H)) if tp is not None else None
        pending = False  # `part` holds a reduced down_proj output not yet added to x
        threads_rope = rope_threads(Hq, Hkv, D)
        # NOTE: the norms and silu_mul feeding qkv, gate_up and down write bf16 words when that GEMM runs on a bf16
        # matrix (`_norm_for`, `_silu_mul_for`), and so does the tensor-core prefill attention for o; the other
        # attention kernels' f32 output is cast before o
        # 4-bit decode: the norms between the GEMVs carried by them (q4_norm_chain): xg = x * g, ssp the 32-column
        # tiles' sums of x^2, written by o / down, read by gate_up / the next qkv
        chain = tp is None and q4_norm_chain(self, w.layers, T, D)
        xg = self._buf("norm_xg", (T, H)) if chain else None
        ssp = self._buf("norm_ssp", (T, H // 32)) if chain else None
        for n, layer in enumerate(w.layers):
            pair = self._pair_epilogue(layer.qkv, T)
            norm_in = pair and not pending and self._norm_folds(layer.qkv)  # input_norm folded into the matvec
            carried = chain and n > 0  # the previous down wrote this layer's xg / ssp
            h = (xg if carried else x if norm_in
                 else self._norm_for(layer.qkv, x, layer.input_norm, eps, y=part if pending else None))
            if pair:
                self._matvec_pair("rope", h, layer.qkv, qkv, bias=layer.qkv_bias, db=db, layer=n,
                                  norm=(layer.input_norm, eps) if norm_in else None)
            elif gemv_pair_takes(self, "rope", layer.qkv, T, D):  # 4-bit: the GEMV with RoPE + KV write fused
                gemv_q4_pair(self, "rope", h, layer.qkv.marlin, qkv, layer.qkv_bias,
                             (db.positions, self.inv_freq, db.slots, self.k_cache[n], self.v_cache[n], Hq, Hkv, D,
                              self.block_size), layer.qkv.nbytes, norm_in=(ssp, eps) if carried else None)
            else:
                # on the bf16 GEMM path the bias rides in rope_write_kv (the same f32 add as add_bias, one launch less)
                fold = layer.qkv_bias is not None and self._bias_in_rope(layer.qkv, T)
                self._linear(h, layer.qkv, None if fold else layer.qkv_bias, qkv, name="qkv")
                with self._span("rope_kv", "rope_write_kv", T, Hq, Hkv, D):
                    k.rope_write_kv((T,), (threads_rope,),
                                    (qkv, db.positions, self.inv_freq, db.slots, self.k_cache[n], self.v_cache[n],
                                     np.int32(Hq), np.int32(Hkv), np.int32(D), np.int32(self.block_size),
                                     layer.qkv_bias if fold else NULL))
            # one token: the attention and o as one kernel where it takes the shapes (x += o(att), `_attn_o_cluster`)
            ao = 0 if chain else self._attn_o_cluster(layer.o, db)
            if ao:
                self._attention_o(n, qkv, n_qkv, db, layer.o, x, ao)
                o_in = None
            else:
                # the tensor-core kernels (a prefill step, decode_attn_tc) write the attention output as o's bf16
                # GEMM input: no cast
                att_bf16 = (self._buf("att_bf16", (T, Hq * D), np.uint16)
                            if ((db.n_prefill_tiles or self._attn_choice(T, db.max_len) == "tc")
                                and self._gemm_takes_bf16(layer.o, T)) else None)
                o_in = self._attention(n, qkv, n_qkv, db, att, out_bf16=att_bf16)
            pair = self._pair_epilogue(layer.gate_up, T)
            norm_in = pair and tp is None and self._norm_folds(layer.gate_up)  # post_norm folded into gate_up
            if chain:  # o writes gate_up's xg / ssp too
                if not gemv_q4(self, o_in, layer.o.marlin, None, x, True, "o", layer.o.nbytes,
                               norm_out=(layer.post_norm, xg, ssp)):
                    raise RuntimeError(f"o: the norm chain's GEMV refused its input {o_in.shape} {o_in.dtype}")
                h = xg
            elif tp is None:
                if not ao:
                    self._linear(o_in, layer.o, None, x, accumulate=True, name="o", preload=True)
                h = x if norm_in else self._norm_for(layer.gate_up, x, layer.post_norm, eps)
            else:
                self._linear(o_in, layer.o, None, part, name="o", preload=True)
                self._all_reduce(part)
                h = self._norm_for(layer.gate_up, x, layer.post_norm, eps, y=part)
            if pair:
                act = self._buf("act", (T, I))
                self._matvec_pair("silu", h, layer.gate_up, act, norm=(layer.post_norm, eps) if norm_in else None)
            elif gemv_pair_takes(self, "silu", layer.gate_up, T):  # 4-bit: the GEMV with SiLU x up fused
                act = self._buf("act", (T, I))
                gemv_q4_pair(self, "silu", h, layer.gate_up.marlin, act, nbytes=layer.gate_up.nbytes,
                             norm_in=(ssp, eps) if chain else None)
            elif (h.dtype == np.uint16 and gemm_silu_takes(self, layer.gate_up, T)
                  and self._gemm_takes_bf16(layer.down, T)):  # the 4-bit GEMM's SiLU form, bf16 out: down's input
                act = self._buf("act_bf16", (T, I), np.uint16)
                gemm_q4_silu(self, h, layer.gate_up.marlin, act)
            elif self._gate_up_bf16(layer, T):  # bf16 gate / up straight from cuBLAS, SiLU x up bf16 to bf16
                gu16 = self._buf("gu_bf16", (T, 2 * I), np.uint16)
                self._linear(h, layer.gate_up, None, gu16, name="gate_up", out_bf16=True)
                act = self._silu_mul_for(layer.down, gu16)
            else:
                self._linear(h, layer.gate_up, None, gu, name="gate_up")
                act = self._silu_mul_for(layer.down, gu)
            if chain and n + 1 < len(w.layers):  # down writes the next qkv's xg / ssp too
                if not gemv_q4(self, act, layer.down.marlin, None, x, True, "down", layer.down.nbytes,
                               norm_out=(w.layers[n + 1].input_norm, xg, ssp)):
                    raise RuntimeError(f"down: the norm chain's GEMV refused its input {act.shape} {act.dtype}")
            elif tp is None:
                self._linear(act, layer.down, None, x, accumulate=True, name="down")
            else:
                self._linear(act, layer.down, None, part, name="down")
                self._all_reduce(part)
                pending = True
            if trace.PATH is not None and n % 7 == 6:  # (no tag string built per layer without tracing)
                tr(f"fwd_layer{n + 1}")
        if pending:
            with self._span("add", "add_inplace", T * H):
                k.add_inplace((min(65535, -(-T * H // 256)),), (256,), (x, part, np.int64(T * H)))
        if self._gemm_takes_bf16(w.lm_head, S):  # many sampled rows (a large decode batch): lm_head on cuBLAS
            hs = self._buf("h_final_bf16", (S, H), np.uint16)
            self._rms_norm_bf16(x, w.norm, eps, hs, rows=db.sample_rows, n_rows=S)
        else:
            hs = self._buf("h_final", (S, H))
            if S:
                self._rms_norm(x, w.norm, eps, hs, rows=db.sample_rows, n_rows=S)
        logits = self._buf("logits", (S, c.vocab_size))
        if S:
            self._linear(hs, w.lm_head, None, logits, name="lm_head")
        if tp is not None:  # every rank computed its vocabulary slice: gather them, rank order = vocabulary order
            return self._gather_logits(logits, S)
        return logits

    # ------------------------------------------------------------------ tensor parallel
    def _all_reduce(self, x: Any) -> None:
        """Sum `x` (contiguous f32) over the tensor-parallel ranks, in place, on the current stream."""
        n = self.tp.world_size
        with self._span("allreduce", "all_reduce", x.size * 4, n):
            self.tp.comm.all_reduce(x)

    def _add_rms_norm(self, x: Any, y: Any, w: Any, eps: float, out: Any) -> None:
        """x += y (the residual), out = rms_norm(x): one launch."""
        T, H = x.shape
        with self._span("rms_norm", "add_rms_norm", T, H):
            self.k.add_rms_norm((T,), (norm_threads(H),), (x, y, w, out, np.int32(H), np.float32(eps)))

    def _gather_logits(self, part: Any, S: int) -> Any:
        """[S, vocab] logits (a view of a workspace buffer) from every rank's [S, vocab_shard] slice."""
        tp, cp = self.tp, self.cp
        N, Vs = tp.world_size, part.shape[1]
        full = self._buf("tp_logits_ranks", (N, S, Vs))
        if S:
            with self._span("allgather", "all_gather", part.size * 4, N):
                tp.comm.all_gather_into(part, full)
        if S <= 1:
            flat = full.reshape(S, N * Vs)  # [N, 1, Vs] is already [1, N * Vs] in vocabulary order
        else:
            flat = self._buf("tp_logits", (S, N * Vs))
            with self._span("copy", "logits_transpose", S * N * Vs):
                cp.copyto(flat.reshape(S, N, Vs), full.transpose(1, 0, 2))
        return flat[:, : tp.vocab_size]

    # ------------------------------------------------------------------ sampling
    def sample(self, logits: Any, states: list) -> list:
        """One token per row of device `logits` [S, V] (row i belongs to states[i]); see sample_launch."""
        return self.sample_launch(logits, states).wait()

    def sample_launch(self, logits: Any, states: list) -> Any:
        """Queue the sampling of one token per row of device `logits` [S, V] (row i belongs to states[i]) in one
        launch and the copy of the tokens to the host; `.wait()` on the result gives the SampleResults. The tokens
        also stay on the device for the next step's `feed`. At most two launches may be outstanding (their
        read-back buffers take turns).

        The rows of requests that need penalties, logprobs or a min_tokens mask (`needs_cpu_sampler`) go to the CPU
        sampler (llmrs.engine.sampling.sample; the step is then synchronous): only those rows' logits are copied to
        the host, the others are sampled on the GPU as always (the same tokens the CPU sampler gives them: GPU
        tests), so one such request in a large batch costs a row's copy, not the step's (256 x 152k f32 = 155 MB,
        and the CPU sampler over every row). Draws one uniform per non-greedy request from its own generator.
        """
        from llmrs.engine.runner import Launched
        from llmrs.engine.sampling import SampleResult
        from llmrs.engine.sampling import sample as cpu_sample

        cp = self.cp
        S = len(states)
        assert logits.shape[0] == S
        if S == 0:
            return Launched([])
        if self._samples.size < S:  # grown, keeping what a feed of the next step may still read
            grown = cp.zeros(max(S, 2 * self._samples.size), dtype=cp.int32)
            grown[: self._samples.size] = self._samples
            self._samples = grown
        out = self._samples[:S]
        on_host = [i for i, st in enumerate(states) if needs_cpu_sampler(st)]
        if len(on_host) == S:
            results = cpu_sample(cp.asnumpy(logits).astype(np.float32), states)
            out.set(np.fromiter((r.token_id for r in results), dtype=np.int32, count=S))
            return Launched(results)
        host = set(on_host)
        V = logits.shape[1]
        # one staged copy: [temperature | top_p | min_p | uniform | top_k bits]
        params = np.zeros(5 * S, dtype=np.float32)
        f, top_k = params[: 4 * S].reshape(4, S), params[4 * S :].view(np.int32)
        for i, st in enumerate(states):
            if i in host:  # greedy on the GPU (no draw from its generator), replaced by the CPU sampler's token
                continue
            p = st.params
            f[0, i] = p.temperature
            f[1, i] = p.top_p
            f[2, i] = p.min_p
            top_k[i] = p.top_k if p.top_k and p.top_k > 0 else 0
            if not p.greedy:
                f[3, i] = st.generator.random()
        tr("sample_begin")
        d = self._stage("sample_params", params)
        fd, kd = d[: 4 * S].reshape(4, S), d[4 * S :].view(cp.int32)
        nb = sample_row_blocks(S, V, self.num_sms)  # S x nb <= num_sms: the hand-off's buffers
        part_v = self._buf("sample_part_v", (self.num_sms,))
        part_i = self._buf("sample_part_i", (self.num_sms,), np.int32)
        sem = self._counters("sample_sem", self.num_sms)
        with self._span("sample", "sample_tokens", S, V, sum(not st.params.greedy for st in states)):
            self.k.sample_tokens((S, nb), (1024,), (cp.ascontiguousarray(logits), np.int32(V), fd[0], kd, fd[1],
                                                    fd[2], fd[3], part_v, part_i, sem, out))
        self._launches += 1
        if on_host:  # those rows' logits only, sampled on the CPU; their tokens into `out` for the next step's feed
            idx = cp.asarray(np.asarray(on_host, dtype=np.int32))
            cpu_results = cpu_sample(cp.asnumpy(logits[idx]).astype(np.float32), [states[i] for i in on_host])
            out[idx] = cp.asarray(np.fromiter((r.token_id for r in cpu_results), dtype=np.int32, count=len(on_host)))
            results = [SampleResult(int(t)) for t in cp.asnumpy(out)]
            for i, r in zip(on_host, cpu_results):
                results[i] = r
            return Launched(results)
        tokens = self._pinned(f"sample_tokens.{self._launches % 2}", S, np.int32)
        stream = cp.cuda.get_current_stream()
        cp.cuda.runtime.memcpyAsync(tokens.ctypes.data, out.data.ptr, 4 * S, cp.cuda.runtime.memcpyDeviceToHost,
                                    stream.ptr)
        done = cp.cuda.Event(disable_timing=True)
        done.record(stream)
        tr("sample_queued")
        return SampledOnDevice(done, tokens)

    # ------------------------------------------------------------------ Backend protocol (Model.forward, tests)
    def embedding(self, table: Any, token_ids: Any) -> Any:
        cp = self.cp
        ids = cp.asarray(np.asarray(token_ids, dtype=np.int32)) if isinstance(token_ids, np.ndarray) else token_ids
        T, H = int(ids.shape[0]), table.shape[1]
        out = cp.empty((T, H), dtype=cp.float32)
        self.k.embedding_gather((T,), (256,), (table, ids.astype(cp.int32), out, np.int32(H), np.int32(0),
                                               np.int32(table.shape[0])))
        return out

    def rms_norm(self, x: Any, weight: Any, eps: float) -> Any:
        x = self.cp.ascontiguousarray(x, dtype=self.cp.float32)
        out = self.cp.empty_like(x)
        self._rms_norm(x, weight, eps, out)
        return out

    def add_rms_norm(self, x: Any, y: Any, weight: Any, eps: float) -> Any:
        """x += y in place (the residual), returns rms_norm(x)."""
        out = self.cp.empty_like(x)
        self._add_rms_norm(x, self.cp.ascontiguousarray(y), weight, eps, out)
        return out

    def linear(self, x: Any, w: Any, bias: Any | None = None) -> Any:
        x = self.cp.ascontiguousarray(x, dtype=self.cp.float32)
        out = self.cp.empty((x.shape[0], w.shape[0]), dtype=self.cp.float32)
        self._linear(x, w, bias, out)
        return out

    def rope(self, q: Any, k: Any, positions: Any) -> tuple[Any, Any]:
        cp, c = self.cp, self.config
        T, Hq, Hkv, D = q.shape[0], c.num_attention_heads, c.num_key_value_heads, c.head_dim
        buf = cp.zeros((T, (Hq + 2 * Hkv) * D), dtype=cp.float32)
        buf[:, : Hq * D] = q.reshape(T, -1)
        buf[:, Hq * D : (Hq + Hkv) * D] = k.reshape(T, -1)
        pos = cp.asarray(np.asarray(positions, dtype=np.int32)) if isinstance(positions, np.ndarray) else positions
        threads = rope_threads(Hq, Hkv, D)
        self.k.rope_write_kv((T,), (threads,), (buf, pos.astype(cp.int32), self.inv_freq, NULL, NULL, NULL,
                                                np.int32(Hq), np.int32(Hkv), np.int32(D), np.int32(self.block_size),
                                                NULL))
        return buf[:, : Hq * D].reshape(T, Hq, D), buf[:, Hq * D : (Hq + Hkv) * D].reshape(T, Hkv, D)

    def write_kv(self, layer: int, k: Any, v: Any, slot_mapping: Any) -> None:
        cp, c = self.cp, self.config
        T = k.shape[0]
        slots = cp.asarray(np.asarray(slot_mapping, dtype=np.int32))
        kk = cp.ascontiguousarray(k.reshape(T, -1), dtype=cp.float32)
        vv = cp.ascontiguousarray(v.reshape(T, -1), dtype=cp.float32)
        self.k.write_kv((T,), (min(1024, max(32, -(-c.kv_size // 32) * 32)),),
                        (kk, vv, slots, self.k_cache[layer], self.v_cache[layer], np.int32(c.num_key_value_heads),
                         np.int32(c.head_dim), np.int32(self.block_size)))

    def attention(self, layer: int, q: Any, batch: StepBatch) -> Any:
        cp, c = self.cp, self.config
        T = q.shape[0]
        qq = cp.ascontiguousarray(q.reshape(T, -1), dtype=cp.float32)
        out = cp.empty((T, c.q_size), dtype=cp.float32)
        self._attention(layer, qq, c.q_size, self.device_batch(batch), out)
        return out

    def silu_mul(self, gate_up: Any) -> Any:
        cp = self.cp
        gate_up = cp.ascontiguousarray(gate_up, dtype=cp.float32)
        T, I = gate_up.shape[0], gate_up.shape[1] // 2
        out = cp.empty((T, I), dtype=cp.float32)
        n = T * I
        self.k.silu_mul((max(1, min(65535, -(-n // 256))),), (256,), (gate_up, out, np.int32(T), np.int32(I)))
        return out

    def add(self, x: Any, y: Any) -> Any:
        cp = self.cp
        out = cp.array(x, dtype=cp.float32, copy=True, order="C")
        y = cp.ascontiguousarray(y, dtype=cp.float32)
        n = out.size
        self.k.add_inplace((max(1, min(65535, -(-n // 256))),), (256,), (out, y, np.int64(n)))
        return out

    def gather_rows(self, x: Any, rows: Any) -> Any:
        cp = self.cp
        r = cp.asarray(np.asarray(rows, dtype=np.int64)) if isinstance(rows, np.ndarray) else rows
        return cp.ascontiguousarray(x[r])

    def to_host(self, x: Any) -> np.ndarray:
        return self.cp.asnumpy(x).astype(np.float32, copy=False)

    def synchronize(self) -> None:
        self.cp.cuda.Device().synchronize()


class SampledOnDevice:
    """A step's sampling queued on the GPU: wait() blocks until its tokens are on the host."""

    __slots__ = ("done", "tokens")

    def __init__(self, done: Any, tokens: np.ndarray) -> None:
        self.done, self.tokens = done, tokens

    def wait(self) -> list:
        self.done.synchronize()
        return [SampleResult(t) for t in self.tokens.tolist()]


def needs_cpu_sampler(st: Any) -> bool:
    """What the GPU sampler does not do: penalties, logprobs, a pending min_tokens mask."""
    return penalized_or_logprobs(st.params) or min_tokens_pending(st)


class CUDAModel(Model):
    """The decoder on the CUDA backend: the fused step (`CUDABackend.forward`) instead of op-by-op."""

    backend: CUDABackend

    def forward(self, batch: StepBatch) -> np.ndarray:
        return self.backend.forward(self.w, batch)

    def forward_device(self, batch: StepBatch) -> Any:
        """Logits left on the GPU (feed them to `backend.sample`)."""
        return self.backend.forward(self.w, batch, to_host=False)
