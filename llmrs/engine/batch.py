"""StepBatch: what one engine step computes (contract shared by the scheduler and every backend).

A prefill chunk and a decode token are the same thing to a backend: tokens with positions, written into
cache slots, attending over their sequence's cached context through a block table.

Fields (all plain numpy host arrays):
- token_ids[T], positions[T]: every token computed this step, all sequences flattened in batch order;
- query_start[B+1]: cumulative count of new tokens per sequence (sequence b owns rows
  query_start[b]:query_start[b+1]);
- context_lens[B]: tokens in the cache for sequence b after this step (cached prefix + new tokens);
- block_tables[B, max_blocks]: block ids per sequence, padded with -1;
- slot_mapping[T]: cache slot (block_id * block_size + offset) each new token's K/V is written to;
- sample_rows[S]: rows of the flattened token axis whose logits are returned (the last token of each
  sequence that finishes its prompt this step or decodes);
- feed[T] (None in most steps): for a step planned before the previous step's tokens were known, the rows whose
  token id is a placeholder: feed[t] = j >= 0 means "row t's token is sample j of the step launched just before
  this one on the same runner" (the runner fills it in, on the device), -1 keeps token_ids[t].
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(slots=True)
class StepBatch:
    token_ids: np.ndarray
    positions: np.ndarray
    query_start: np.ndarray
    context_lens: np.ndarray
    block_tables: np.ndarray
    slot_mapping: np.ndarray
    sample_rows: np.ndarray
    feed: np.ndarray | None = None

    @property
    def num_tokens(self) -> int:
        return int(self.token_ids.shape[0])

    @property
    def num_seqs(self) -> int:
        return int(self.context_lens.shape[0])

    def validate(self, block_size: int) -> None:
        """Check the invariants every backend relies on (cheap; used by tests and debug runs)."""
        T, B = self.num_tokens, self.num_seqs
        assert self.positions.shape == (T,) and self.slot_mapping.shape == (T,)
        assert self.query_start.shape == (B + 1,) and self.query_start[0] == 0 and self.query_start[-1] == T
        assert self.block_tables.shape[0] == B
        for b in range(B):
            s, e = int(self.query_start[b]), int(self.query_start[b + 1])
            ctx = int(self.context_lens[b])
            assert e > s, "every sequence in a step computes at least one token"
            # the new tokens are the last (e - s) positions of the context
            assert np.array_equal(self.positions[s:e], np.arange(ctx - (e - s), ctx))
            for t in range(s, e):
                pos = int(self.positions[t])
                block = int(self.block_tables[b, pos // block_size])
                assert block >= 0
                assert int(self.slot_mapping[t]) == block * block_size + pos % block_size


def build_step_batch(
    seqs: list[tuple[list[int], int, list[int], bool]], block_size: int
) -> StepBatch:
    """Build a StepBatch from (new_token_ids, num_cached_before, block_table, sample) per sequence.

    `num_cached_before` is how many of the sequence's tokens are already in the cache; the new tokens take
    positions num_cached_before, num_cached_before + 1, ...; `sample` says whether the last new token's
    logits are wanted.
    """
    token_ids: list[int] = []
    positions: list[int] = []
    slots: list[int] = []
    query_start = [0]
    context_lens: list[int] = []
    sample_rows: list[int] = []
    max_blocks = max((len(bt) for _, _, bt, _ in seqs), default=0)
    block_tables = np.full((len(seqs), max(max_blocks, 1)), -1, dtype=np.int32)
    for b, (new_tokens, cached, table, sample) in enumerate(seqs):
        n = len(new_tokens)
        assert n > 0
        block_tables[b, : len(table)] = table
        for i, tok in enumerate(new_tokens):
            pos = cached + i
            token_ids.append(tok)
            positions.append(pos)
            slots.append(table[pos // block_size] * block_size + pos % block_size)
        query_start.append(query_start[-1] + n)
        context_lens.append(cached + n)
        if sample:
            sample_rows.append(query_start[-1] - 1)
    return StepBatch(
        token_ids=np.asarray(token_ids, dtype=np.int32),
        positions=np.asarray(positions, dtype=np.int32),
        query_start=np.asarray(query_start, dtype=np.int32),
        context_lens=np.asarray(context_lens, dtype=np.int32),
        block_tables=block_tables,
        slot_mapping=np.asarray(slots, dtype=np.int64),
        sample_rows=np.asarray(sample_rows, dtype=np.int32),
    )


def build_step_batch_arrays(token_ids: list[int], num_cached: list[int], num_new: list[int],
                            block_tables: np.ndarray, sample: list[bool], block_size: int) -> StepBatch:
    """`build_step_batch` vectorized (what the scheduler calls every step): the same StepBatch, from the new
    tokens of all sequences flattened, per-sequence counts, and the block tables already as one padded array."""
    B = len(num_new)
    cached = np.asarray(num_cached, dtype=np.int64)
    new = np.asarray(num_new, dtype=np.int64)
    assert B > 0 and int(new.min()) > 0
    query_start = np.zeros(B + 1, dtype=np.int64)
    np.cumsum(new, out=query_start[1:])
    T = int(query_start[-1])
    if T == B:  # one new token per sequence: a decode step
        seq_of = np.arange(B)
        positions = cached
    else:
        seq_of = np.repeat(np.arange(B), new)
        positions = np.arange(T) - query_start[seq_of] + cached[seq_of]
    slots = block_tables[seq_of, positions // block_size].astype(np.int64) * block_size + positions % block_size
    return StepBatch(
        token_ids=np.asarray(token_ids, dtype=np.int32),
        positions=positions.astype(np.int32),
        query_start=query_start.astype(np.int32),
        context_lens=(cached + new).astype(np.int32),
        block_tables=block_tables,
        slot_mapping=slots,
        sample_rows=(query_start[1:][np.asarray(sample, dtype=bool)] - 1).astype(np.int32),
    )
