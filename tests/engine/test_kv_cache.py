"""Block pool: property test over allocate / append / fork / free / abort, plus prefix-cache unit cases."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmrs.engine.kv_cache import KVCacheManager

BS = 4
NUM_BLOCKS = 12


def check_invariants(kv: KVCacheManager, live: dict[int, list[int]]) -> None:
    """Every block is either free (ref 0, in the free queue) or held, with ref_cnt == number of holders."""
    holders = Counter(b.block_id for blocks in kv.req_blocks.values() for b in blocks)
    assert set(kv.req_blocks) == set(live)
    for b in kv.pool.blocks:
        assert b.ref_cnt == holders.get(b.block_id, 0), (b.block_id, b.ref_cnt, holders.get(b.block_id))
        assert (b.block_id in kv.pool.free_queue) == (b.ref_cnt == 0)
    for key, blocks in kv.req_blocks.items():
        assert len({b.block_id for b in blocks}) == len(blocks), "a sequence holds a block twice"
        assert len(blocks) >= kv.blocks_needed(len(live[key]))
    # a cached hash always points at a block whose stored tokens are its own
    for h, b in kv.pool.cached.items():
        assert b.block_hash == h and b.tokens is not None
    # the incrementally kept table rows equal the block lists, -1 past them; freed rows are all -1
    assert set(kv.row_of) == set(kv.req_blocks)
    assert len(set(kv.row_of.values())) == len(kv.row_of)
    for key, blocks in kv.req_blocks.items():
        row = kv.table[kv.row_of[key]]
        assert row[: len(blocks)].tolist() == [b.block_id for b in blocks]
        assert (row[len(blocks):] == -1).all()
    for r in kv._free_rows:
        assert (kv.table[r] == -1).all()
    keys = sorted(kv.req_blocks)
    if keys:
        rebuilt = np.full((len(keys), max(1, max(len(kv.req_blocks[k]) for k in keys))), -1, dtype=np.int32)
        for i, k in enumerate(keys):
            rebuilt[i, : len(kv.req_blocks[k])] = kv.block_ids(k)
        got = kv.block_tables(keys)
        assert got.dtype == np.int32 and np.array_equal(got, rebuilt)


ops = st.lists(
    st.tuples(st.sampled_from(["alloc", "append", "fork", "free", "abort"]), st.integers(0, 7),
              st.lists(st.integers(0, 3), min_size=1, max_size=10)),
    max_size=60,
)


@pytest.mark.parametrize("num_blocks", [NUM_BLOCKS, 48])  # 48: past the table's first 8 x 8, so it grows
@settings(max_examples=300, deadline=None)
@given(program=ops)
def test_any_op_sequence_leaks_nothing_and_refcounts_return_to_zero(num_blocks, program):
    kv = KVCacheManager(num_blocks, BS, enable_prefix_caching=True)
    live: dict[int, list[int]] = {}  # seq key -> its tokens, all computed
    next_key = 0
    for op, pick, tokens in program:
        keys = sorted(live)
        if op == "alloc":  # admit a new sequence, with prefix-cache lookup like the scheduler
            hits = kv.get_computed_blocks(tokens)
            if kv.allocate_slots(next_key, len(tokens), hits):
                live[next_key] = list(tokens)
                kv.cache_full_blocks(next_key, tokens, len(tokens))
            next_key += 1
        elif op == "append" and keys:
            key = keys[pick % len(keys)]
            new = live[key] + tokens
            if kv.allocate_slots(key, len(new)):
                live[key] = new
                kv.cache_full_blocks(key, new, len(new))
        elif op == "fork" and keys:
            parent = keys[pick % len(keys)]
            shared = kv.fork(parent, next_key, len(live[parent]))
            live[next_key] = live[parent][:shared]
            next_key += 1
        elif op in ("free", "abort") and keys:
            key = keys[pick % len(keys)]
            kv.free(key)
            del live[key]
        check_invariants(kv, live)
    for key in list(live):
        kv.free(key)
    check_invariants(kv, {})
    assert kv.num_free_blocks == num_blocks
    assert all(b.ref_cnt == 0 for b in kv.pool.blocks)


def test_hit_requires_matching_tokens_and_chain():
    kv = KVCacheManager(8, BS)
    a = [1, 2, 3, 4, 5, 6, 7, 8, 9]
    assert kv.allocate_slots("a", len(a), kv.get_computed_blocks(a))
    kv.cache_full_blocks("a", a, len(a))
    assert len(kv.get_computed_blocks([1, 2, 3, 4, 5, 6, 7, 8, 0])) == 2
    assert len(kv.get_computed_blocks([9, 2, 3, 4, 5, 6, 7, 8, 9])) == 0  # first block differs: chain broken
    assert len(kv.get_computed_blocks([1, 2, 3, 4, 5, 6, 7, 8])) == 1  # capped at length - 1


def test_freed_cached_blocks_are_reused_then_evicted_lru():
    kv = KVCacheManager(4, BS)
    a = [1, 2, 3, 4, 5, 6, 7, 8, 9]
    kv.allocate_slots("a", len(a), kv.get_computed_blocks(a))
    kv.cache_full_blocks("a", a, len(a))
    kv.free("a")
    assert kv.num_free_blocks == 4
    hits = kv.get_computed_blocks(a)
    assert len(hits) == 2  # still cached after free
    assert kv.allocate_slots("b", len(a), hits) and kv.num_free_blocks == 1
    kv.free("b")
    big = list(range(100, 116))
    assert kv.allocate_slots("c", len(big), kv.get_computed_blocks(big))  # needs all 4: evicts the cache
    assert kv.pool.cached == {}
    assert not kv.allocate_slots("d", 1)  # pool exhausted: refused, nothing changed
    assert "d" not in kv.req_blocks
