"""The bf16 wgmma GEMM (llmrs/kernels_cu/gemm_q4.cu's gemm_bf16wg_s{S}, sm_90a) for the bf16 linears whose output
tiles alone leave the GPU half empty at a batched step's token counts.

At 256 tokens a 7B's qkv (4608 columns), o (3584) and down (3584 x 18944) have 72 / 56 / 56 output tiles of
128 x 128 for 132 SMs; cuBLAS ran qkv and o there at ~42% of the bandwidth / FLOP roof (session 13: ~20 us each,
TunableOp offered no other algorithm). This kernel splits K over S = 1-4 blocks of a thread-block cluster that sum
their partials through distributed shared memory (no partials in global memory, no reduce launch; deterministic),
S chosen so the tiles x S fill about 2 blocks an SM. `gemm_bf16wg` runs out[T, N] (=|+=) x_bf16 @ W^T (+ bias) with
f32 out; `bf16_wgmma_takes` says where the backend's `_linear` takes it instead of cuBLAS: only with
LLMRS_BF16_WGMMA=1 on an sm_90a GPU, for LLMRS_BF16_WGMMA_FROM <= T <= LLMRS_BF16_WGMMA_MAX_TOKENS (read at import;
64 / 512) where the tiles number fewer than the SMs (gate_up keeps cuBLAS).

Off by default: correct, but slower than cuBLAS on the H200 at every measured shape (fifteenth session,
`scripts/bench_gemm_bf16_forms.py`, 28-layer sums of qkv + o + down, ms, cuBLAS / this kernel at the backend's
cluster: T 64 2.371 / 2.516, 128 2.399 / 2.649, 256 2.623 / 3.376, 512 4.081 / 6.290; its best cluster size per
shape came within ~5% of cuBLAS at qkv / o, 20-40% behind at down). What it would need: more than one warpgroup a
block (cuBLAS's kernels keep two consumer warpgroups and a producer), TMA loads instead of cp.async.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from llmrs.backends.cuda_kernels import GEMM_BF16WG_SMEM_BYTES, WG_BLOCKS_PER_SM, WG_SPLITS, wg_cluster
from llmrs.engine.config import env_int

NULL = np.uint64(0)
TILE = 128  # columns and tokens a block
BK = 64  # k a stage
WGB_FROM = env_int("LLMRS_BF16_WGMMA_FROM", 64)
WGB_MAX_TOKENS = env_int("LLMRS_BF16_WGMMA_MAX_TOKENS", 512)


def tiles(T: int, N: int) -> int:
    return -(-N // TILE) * -(-T // TILE)


def bf16_wgmma_takes(backend: Any, T: int, N: int, K: int) -> bool:
    """Whether `_linear` runs T tokens of a bf16 N x K weight through gemm_bf16wg rather than cuBLAS."""
    return (bool(getattr(backend.k, "bf16_wgmma", False)) and WGB_FROM <= T <= WGB_MAX_TOKENS and N % 8 == 0
            and K % BK == 0 and tiles(T, N) < backend.num_sms)


def bf16_splits(backend: Any, T: int, N: int, K: int) -> int:
    """S: the K slices (cluster size) that bring the tiles to about WG_BLOCKS_PER_SM blocks an SM, a compiled
    cluster size (cuda_kernels.wg_cluster) of at most the k64 tiles of K."""
    return wg_cluster(min(WG_BLOCKS_PER_SM * backend.num_sms // tiles(T, N), K // BK))


def gemm_bf16wg(backend: Any, x_bf16: Any, w: Any, bias: Any | None, out: Any, accumulate: bool = False,
                name: str = "linear", splits: int | None = None) -> None:
    """out[T, N] (=|+=) x_bf16[T, K] @ w[N, K]^T (+ bias): x and w bf16 words (uint16) contiguous, out f32 [T, N]
    contiguous, bias f32 [N] or None; `splits` forces S (tests). RuntimeError without sm_90a (Kernels.wgmma_fns)."""
    T, K = x_bf16.shape
    N = w.shape[0]
    assert w.shape[1] == K and out.shape == (T, N) and out.dtype == np.float32 and x_bf16.dtype == np.uint16
    assert N % 8 == 0 and K % BK == 0, (N, K)
    S = bf16_splits(backend, T, N, K) if splits is None else int(splits)
    assert S in WG_SPLITS, S
    per = -(-(K // BK) // S)
    fn = backend.k.wgmma_fns()[f"gemm_bf16wg_s{S}"]
    with backend._span("gemm", name, T, N, K, accumulate, bias is not None, 4):
        fn((-(-N // TILE), -(-T // TILE), S), (128,),
           (w, x_bf16, NULL if bias is None else bias, out, np.int32(T), np.int32(N), np.int32(K),
            np.int32(1 if accumulate else 0), np.int32(per)), shared_mem=GEMM_BF16WG_SMEM_BYTES)
