"""Prefill attention on tensor cores (kernels_cu/prefill_attention.cu): the host-side tile plan and the constants.

The kernel gives one CTA to (one query head, one work tile): up to `PREFILL_BLOCK_Q` consecutive new tokens of
ONE sequence, which walks that sequence's keys 0 .. (the tile's last position) in 64-key tiles through the
block table. `plan_prefill_tiles` lists the tiles from the step's `query_start`/`positions` (host numpy, once
per step, next to `device_batch`'s other index arrays); `AttentionOps._prefill_attention` (attention.py) launches
the kernel over a device copy of that plan and returns False where the shape is not supported (`prefill_supported`
there), so the caller keeps attn_partial. The decode form (decode_attn_tc): the constants here, the rules
(`decode_tc_supported`, `decode_tc_splits`) and `_decode_attention_tc` in attention.py.

Plan row (int32 x 4): (sequence index, first token row, rows <= block_q, key count = last row's position + 1),
sorted by key count, longest first: the long causal tiles start first and the short ones fill in behind.
"""

from __future__ import annotations

import numpy as np

PREFILL_BLOCK_Q = 64  # query rows per CTA (PF_BQ in prefill_attention.cu)
PREFILL_BLOCK_K = 64  # keys per K/V tile (PF_BK)
PREFILL_THREADS = 128
PREFILL_HEAD_DIMS = (64, 128)
MAX_GRID_Y = 65535
TILE_FIELDS = 4


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


# ---------------------------------------------------------------------- decode attention on tensor cores
TC_WARPS = 4  # DT_WARPS in prefill_attention.cu
TC_BLOCK_K = 16  # DT_BK: keys of a warp's tile
TC_MAX_GROUP = 16  # query heads per KV head: the 16 rows of the MMA
TC_MIN_SPLIT_KEYS = 32  # keys a split at least (decode_tc_splits)
