"""The prefill attention tile plan (host numpy): every query row in exactly one tile of one sequence."""

from __future__ import annotations

import numpy as np
import pytest

from llmrs.backends.cuda.prefill import PREFILL_BLOCK_Q, plan_prefill_tiles
from llmrs.engine.batch import build_step_batch


def random_step(rng, n_seqs: int, block_size: int = 16):
    """A StepBatch mixing fresh prompts, chunks over a cached prefix (p0 > 0) and decode rows."""
    seqs, next_block = [], 0
    for _ in range(n_seqs):
        kind = rng.integers(0, 3)
        if kind == 0:  # fresh prompt
            n, cached = int(rng.integers(1, 300)), 0
        elif kind == 1:  # chunked prefill over cached keys
            n, cached = int(rng.integers(1, 200)), int(rng.integers(1, 500))
        else:  # decode
            n, cached = 1, int(rng.integers(0, 1000))
        nblk = -(-(n + cached) // block_size)
        seqs.append((list(range(n)), cached, list(range(next_block, next_block + nblk)), True))
        next_block += nblk
    batch = build_step_batch(seqs, block_size)
    batch.validate(block_size)
    return batch


def check_plan(tiles: np.ndarray, query_start: np.ndarray, positions: np.ndarray, block_q: int) -> None:
    T = int(query_start[-1])
    assert tiles.dtype == np.int32 and tiles.ndim == 2 and tiles.shape[1] == 4 and tiles.flags.c_contiguous
    seq, first, rows, kv_len = (tiles[:, i].astype(np.int64) for i in range(4))
    assert (rows >= 1).all() and (rows <= block_q).all()
    # tiles never cross sequences
    assert (first >= query_start[seq]).all() and (first + rows <= query_start[seq + 1]).all()
    # every row exactly once
    cover = np.zeros(T, dtype=np.int64)
    for f, r in zip(first, rows):
        cover[f:f + r] += 1
    assert (cover == 1).all()
    # the key count is the tile's last row's position + 1 (the causal end of its longest row)
    assert np.array_equal(kv_len, positions[first + rows - 1].astype(np.int64) + 1)
    # longest key range first
    assert (np.diff(kv_len) <= 0).all()
    # a sequence is cut into the fewest tiles
    lens = np.diff(query_start)
    assert np.array_equal(np.bincount(seq, minlength=lens.size), -(-lens // block_q))


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("block_q", [PREFILL_BLOCK_Q, 16, 1])
def test_plan_covers_every_query_row_once_within_its_sequence(seed, block_q):
    rng = np.random.default_rng(seed)
    batch = random_step(rng, int(rng.integers(1, 12)))
    tiles = plan_prefill_tiles(batch.query_start, batch.positions, block_q)
    check_plan(tiles, batch.query_start, batch.positions, block_q)


def test_plan_of_chunked_prefill_starts_at_the_chunks_first_position():
    # a 37-token chunk at positions 100..136 (keys 0..99 cached) and a 130-token fresh prompt
    batch = build_step_batch([(list(range(37)), 100, list(range(9)), True),
                              (list(range(130)), 0, list(range(9, 18)), True)], 16)
    tiles = plan_prefill_tiles(batch.query_start, batch.positions)
    check_plan(tiles, batch.query_start, batch.positions, PREFILL_BLOCK_Q)
    assert tiles.tolist() == [[0, 0, 37, 137], [1, 165, 2, 130], [1, 101, 64, 128], [1, 37, 64, 64]]


def test_plan_of_decode_rows_is_one_row_tiles():
    batch = build_step_batch([([5], 40, [3, 1, 7], True), ([6], 0, [2], True), ([7], 16, [0, 4], True)], 16)
    tiles = plan_prefill_tiles(batch.query_start, batch.positions)
    assert tiles.tolist() == [[0, 0, 1, 41], [2, 2, 1, 17], [1, 1, 1, 1]]


def test_plan_rejects_non_consecutive_positions():
    with pytest.raises(AssertionError):
        plan_prefill_tiles(np.array([0, 3]), np.array([0, 1, 3]))
