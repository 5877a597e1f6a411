"""Prefill attention on tensor cores (kernels_cu/prefill_attention.cu): the host-side tile plan and the launch.

The kernel gives one CTA to (one query head, one work tile): up to `PREFILL_BLOCK_Q` consecutive new tokens of
ONE sequence, which walks that sequence's keys 0 .. (the tile's last position) in 64-key tiles through the
block table. `plan_prefill_tiles` lists the tiles from the step's `query_start`/`positions` (host numpy, once
per step, next to `device_batch`'s other index arrays); `prefill_attention` launches the kernel over a device
copy of that plan and returns False where the shape is not supported, so the caller keeps attn_partial.

Plan row (int32 x 4): (sequence index, first token row, rows <= block_q, key count = last row's position + 1),
sorted by key count, longest first: the long causal tiles start first and the short ones fill in behind.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

PREFILL_BLOCK_Q = 64  # query rows per CTA (PF_BQ in prefill_attention.cu)
PREFILL_BLOCK_K = 64  # keys per K/V tile (PF_BK)
PREFILL_THREADS = 128
PREFILL_HEAD_DIMS = (64, 128)
MAX_GRID_Y = 65535
TILE_FIELDS = 4
_smem_set: set[int] = set()  # ids of kernels whose dynamic shared memory limit was raised


def plan_prefill_tiles(query_start: np.ndarray, positions: np.ndarray, block_q: int = PREFILL_BLOCK_Q) -> np.ndarray:
    """Work tiles [n_tiles, 4] int32 of (seq, first row, rows, key count) covering every token row once.

    Sequence b's rows query_start[b]:query_start[b+1] are cut into runs of at most block_q rows (a decode
    row is a tile of one); a tile never crosses sequences. NOTE: the kernel takes row r's causal limit from
    positions[], but assumes a sequence's new tokens have increasing positions (StepBatch's contract: they are
    the last positions of the context), so that a tile's key range ends at its last row's position.
    """
    qs = np.asarray(query_start, dtype=np.int64)
    pos = np.asarray(positions, dtype=np.int64)
    assert block_q >= 1 and qs.ndim == 1 and qs[0] == 0 and qs[-1] == pos.shape[0]
    lens = np.diff(qs)
    assert (lens > 0).all(), "every sequence in a step computes at least one token"
    if pos.size > 1:  # consecutive positions within each sequence
        step = np.diff(pos)
        same_seq = np.ones(pos.size - 1, dtype=bool)
        same_seq[qs[1:-1] - 1] = False
        assert (step[same_seq] == 1).all(), "a sequence's new tokens must have consecutive positions"
    per_seq = -(-lens // block_q)  # tiles of each sequence
    seq = np.repeat(np.arange(lens.size, dtype=np.int64), per_seq)
    k = np.arange(seq.size, dtype=np.int64) - np.repeat(np.cumsum(per_seq) - per_seq, per_seq)  # tile # in seq
    first = qs[seq] + k * block_q
    rows = np.minimum(block_q, qs[seq + 1] - first)
    kv_len = pos[first + rows - 1] + 1 if seq.size else np.zeros(0, dtype=np.int64)
    tiles = np.stack([seq, first, rows, kv_len], axis=1).astype(np.int32).reshape(-1, TILE_FIELDS)
    order = np.argsort(-kv_len, kind="stable")
    return np.ascontiguousarray(tiles[order])


def prefill_supported(backend: Any) -> bool:
    """Whether prefill_attention can run this backend's shapes (else keep attn_partial)."""
    c = backend.config
    bs = backend.block_size
    return (c.head_dim in PREFILL_HEAD_DIMS and bs >= 1 and bs & (bs - 1) == 0
            and c.num_attention_heads % c.num_key_value_heads == 0 and _compute_capability(backend) >= 80)


def _compute_capability(backend: Any) -> int:
    cc = getattr(backend, "_prefill_cc", None)
    if cc is None:
        cc = int(backend.cp.cuda.Device().compute_capability)
        backend._prefill_cc = cc
    return cc


def prefill_attention(backend: Any, layer: int, q: Any, q_stride: int, db: Any, tiles: Any, n_tiles: int,
                      out: Any) -> bool:
    """out [T, Hq*D] = causal attention of q (f32, row stride q_stride, head h at columns h*D) over layer's
    paged cache, on the tiles of `plan_prefill_tiles` (`tiles`: device int32, n_tiles x 4, any offset). out is
    f32, or bf16 words (uint16: the o projection's cuBLAS input, the bits cast_f32_bf16 makes of the f32 output).

    `db` is the step's DeviceBatch (positions, block_tables, max_blocks; T, kv_tokens, qk_pairs for the
    profiler). Every row of out covered by the plan is written. Returns False (launching nothing) for
    unsupported shapes.
    """
    c = backend.config
    Hq, Hkv, D = c.num_attention_heads, c.num_key_value_heads, c.head_dim
    if not prefill_supported(backend) or q_stride % 4 or q.data.ptr % 16 or out.data.ptr % 8:
        return False
    if n_tiles == 0:
        return True
    assert n_tiles <= MAX_GRID_Y, f"{n_tiles} prefill tiles: more than the grid's y limit"
    fn = backend.k.fns[f"prefill_attn_{'bf16_' if out.dtype == np.uint16 else ''}d{D}"]
    smem = 4 * PREFILL_BLOCK_K * D * 2  # K and V, two stages each, bf16
    if id(fn) not in _smem_set:
        if smem > 48 * 1024:
            fn.max_dynamic_shared_size_bytes = smem
        _smem_set.add(id(fn))
    scale_log2 = np.float32(float(backend.scale) * math.log2(math.e))
    with backend._span("attention", f"prefill_attn_d{D}", db.T, Hq, Hkv, D, db.kv_tokens, db.qk_pairs, 1):
        fn((Hq, n_tiles), (PREFILL_THREADS,),
           (q, np.int32(q_stride), backend.k_cache[layer], backend.v_cache[layer], db.block_tables,
            np.int32(db.max_blocks), db.positions, tiles, out, np.int32(Hq), np.int32(Hkv),
            np.int32(backend.block_size.bit_length() - 1), scale_log2), shared_mem=smem)
    return True


# ---------------------------------------------------------------------- decode attention on tensor cores
TC_WARPS = 4  # DT_WARPS in prefill_attention.cu
TC_BLOCK_K = 16  # DT_BK: keys of a warp's tile
TC_MAX_GROUP = 16  # query heads per KV head: the 16 rows of the MMA
TC_MIN_SPLIT_KEYS = 32  # keys a split at least (decode_tc_splits)


def decode_tc_supported(backend: Any) -> bool:
    """Whether decode_attn_tc (prefill_attention.cu) can run this backend's shapes: prefill_attention's head dims
    and GPUs, at most 16 query heads per KV head, cache blocks of a multiple of its 16-key tiles (a tile reads one
    block: one block-table read a tile)."""
    c = backend.config
    return (prefill_supported(backend) and c.num_queries_per_kv <= TC_MAX_GROUP
            and backend.block_size % TC_BLOCK_K == 0)


def decode_tc_splits(backend: Any, T: int, max_len: int) -> int:
    """Key splits of a decode_attn_tc launch: one when the (token, kv head) blocks already fill two per SM, else
    enough to (about) do so, each split keeping at least 32 keys (two warps' 16-key tiles), at most 64 splits.
    H200, one token at context 512 inside graphs (bench_kernels_graph.py --only attention), us a
    layer at 8 / 16 / 32 splits: 7B 8.27 / 7.45 / 9.51, 0.5B 6.10 / 4.91 / 6.36 (64-key minimum: 9 splits)."""
    if backend.attn_splits is not None:
        return max(1, min(backend.attn_splits, max_len))
    blocks = T * backend.config.num_key_value_heads
    per_split = TC_MIN_SPLIT_KEYS
    if blocks >= 2 * backend.num_sms or max_len <= per_split:
        return 1
    return max(1, min(-(-max_len // per_split), -(-2 * backend.num_sms // blocks), 64))


def decode_attention_tc(backend: Any, layer: int, q: Any, q_stride: int, db: Any, out: Any,
                        out_bf16: Any = None) -> Any:
    """out [T, Hq*D] (f32) = paged causal attention of q (f32, row stride q_stride) over layer's cache for every
    token of the step (its own causal limit), on tensor cores; attn_merge combines the splits. With `out_bf16`
    (uint16 [T, Hq*D], o's bf16 GEMM input) the result goes there as bf16 words instead (the bits a cast of the
    f32 value makes). Returns the buffer written, or None (launching nothing) where the shapes or alignments are
    not supported: the caller keeps attn_partial."""
    c = backend.config
    T, Hq, Hkv, D = db.T, c.num_attention_heads, c.num_key_value_heads, c.head_dim
    if not decode_tc_supported(backend) or q_stride % 4 or q.data.ptr % 16:
        return None
    S = decode_tc_splits(backend, T, db.max_len)
    chunk = -(-db.max_len // S)
    chunk = -(-chunk // TC_BLOCK_K) * TC_BLOCK_K  # each split starts on a tile of one cache block
    dst = out if out_bf16 is None else out_bf16
    bf16 = "_bf16" if out_bf16 is not None else ""
    fn = backend.k.fns[f"decode_attn_tc{bf16 if S == 1 else ''}_d{D}"]
    smem = TC_WARPS * 2 * 2 * TC_BLOCK_K * D * 2 + 16 * D * 2  # stages (K + V, two a warp) + Q
    if id(fn) not in _smem_set:
        if smem > 48 * 1024:  # (a PDL kernel: the attribute goes on its RawKernel, the function both launch)
            getattr(fn, "raw", fn).max_dynamic_shared_size_bytes = smem
        _smem_set.add(id(fn))
    part_acc, part_ml = backend._attn_partials(T, Hq, D, S)
    scale_log2 = np.float32(float(backend.scale) * math.log2(math.e))
    with backend._span("attention", f"decode_attn_tc_d{D}", T, Hq, Hkv, D, db.kv_tokens, db.qk_pairs, S):
        fn((T, Hkv, S), (TC_WARPS * 32,),
           (q, np.int32(q_stride), backend.k_cache[layer], backend.v_cache[layer], db.block_tables,
            np.int32(db.max_blocks), db.token_seq, db.positions, dst if S == 1 else out, part_acc, part_ml, np.int32(Hq),
            np.int32(Hkv), np.int32(backend.block_size.bit_length() - 1), np.int32(chunk), scale_log2),
           shared_mem=smem)
    backend._attn_merge(part_acc, part_ml, dst, T, Hq, D, S)
    return dst
