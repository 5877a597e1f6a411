"""A StepBatch on the GPU: its index arrays packed into one int32 array (one host-to-device copy a step) and the
DeviceBatch of views into that copy that the launches read."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from llmrs.backends.cuda.prefill import plan_prefill_tiles
from llmrs.engine.batch import StepBatch


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
    prefill_tiles: Any = None  # the tensor-core prefill kernel's work tiles (prefill.plan_prefill_tiles)
    n_prefill_tiles: int = 0  # 0: attention runs attn_partial


def pack_batch(batch: StepBatch, prefill_min_tokens: int | None) -> tuple[np.ndarray, int]:
    """A StepBatch's index arrays as one int32 array (token ids, positions, slots, token_seq [T] each, sample rows
    [S], block tables, prefill tiles) and the number of prefill tiles: tiles where a sequence brings at least
    `prefill_min_tokens` new tokens (None: never)."""
    T, B = batch.num_tokens, batch.num_seqs
    lens = np.diff(batch.query_start)
    token_seq = np.repeat(np.arange(B, dtype=np.int32), lens)
    bt = np.ascontiguousarray(batch.block_tables, dtype=np.int32)
    tiles = np.zeros((0, 4), dtype=np.int32)
    if prefill_min_tokens is not None and T and int(lens.max()) >= prefill_min_tokens:
        tiles = plan_prefill_tiles(batch.query_start, batch.positions)
    packed = np.concatenate([batch.token_ids.astype(np.int32), batch.positions.astype(np.int32),
                             batch.slot_mapping.astype(np.int32), token_seq,
                             batch.sample_rows.astype(np.int32), bt.reshape(-1), tiles.reshape(-1)])
    return packed, len(tiles)


def unpack_batch(d: Any, batch: StepBatch, n_tiles: int) -> DeviceBatch:
    """The DeviceBatch whose arrays are views of `d`, a device copy of `pack_batch(batch)`'s array."""
    T, S = batch.num_tokens, int(batch.sample_rows.shape[0])
    bt = batch.block_tables
    o = np.cumsum([0, T, T, T, T, S, bt.size])
    return DeviceBatch(T=T, S=S, token_ids=d[o[0]:o[1]], positions=d[o[1]:o[2]], slots=d[o[2]:o[3]],
                       token_seq=d[o[3]:o[4]], sample_rows=d[o[4]:o[5]], block_tables=d[o[5]:o[6]],
                       max_blocks=int(bt.shape[1]), max_len=int(batch.positions.max()) + 1 if T else 0,
                       prefill_tiles=d[o[6]:], n_prefill_tiles=n_tiles)
