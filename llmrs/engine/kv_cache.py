"""Block pool and KV cache manager: fixed-size blocks, per-sequence block tables, prefix caching.

Backend-agnostic: this module hands out block ids; the backend owns the memory they index.

Prefix caching (vLLM V1's design): every *full* block of a sequence gets a hash chained over all tokens up to
it, hash(parent_hash, block_tokens). A new request walks its prompt block by block and reuses every block
whose hash is cached and whose stored tokens match (the hit is confirmed by tokens, not trusted to the hash),
stopping at the first miss. The hit is capped so at least the prompt's last token is computed: its logits are
what the first sampled token comes from.

Block tables live twice: as `Block` lists (`req_blocks`, what ref counts and hashes hang on) and as rows of one
growing int32 array (`table`, -1 past each sequence's blocks), kept in step by every change, so a step's
`block_tables` is one fancy-indexing gather instead of a Python loop over sequences.

Freed blocks keep their hash and go to the tail of the free queue; allocation takes from the head, so cached
blocks are evicted in LRU order and a block freed just now is the last to go. A request frees its blocks in
reverse order, so a sequence's tail (the least shareable part) is evicted before its head.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import numpy as np


@dataclass(slots=True, eq=False)
class Block:
    block_id: int
    ref_cnt: int = 0
    block_hash: int | None = None
    tokens: tuple[int, ...] | None = None  # the tokens the hash was computed over (hit confirmation)


class BlockPool:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True):
        assert num_blocks > 0 and block_size > 0
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.blocks = [Block(i) for i in range(num_blocks)]
        self.free_queue: OrderedDict[int, Block] = OrderedDict((b.block_id, b) for b in self.blocks)
        self.cached: dict[int, Block] = {}  # block hash -> block holding it

    @property
    def num_free_blocks(self) -> int:
        """Blocks no sequence holds (cached-but-free blocks count: they are evictable)."""
        return len(self.free_queue)

    def usage(self) -> float:
        return 1.0 - self.num_free_blocks / self.num_blocks

    def lookup(self, block_hash: int, tokens: tuple[int, ...]) -> Block | None:
        b = self.cached.get(block_hash)
        return b if b is not None and b.tokens == tokens else None

    def allocate(self, n: int) -> list[Block]:
        assert n <= self.num_free_blocks
        out = []
        for _ in range(n):
            _, b = self.free_queue.popitem(last=False)
            self._evict(b)
            b.ref_cnt = 1
            out.append(b)
        return out

    def touch(self, blocks: list[Block]) -> None:
        """Take a reference on blocks found by prefix lookup (pulls free-but-cached ones out of the queue)."""
        for b in blocks:
            if b.ref_cnt == 0:
                del self.free_queue[b.block_id]
            b.ref_cnt += 1

    def free(self, blocks: list[Block]) -> None:
        for b in reversed(blocks):
            assert b.ref_cnt > 0, f"double free of block {b.block_id}"
            b.ref_cnt -= 1
            if b.ref_cnt == 0:
                self.free_queue[b.block_id] = b

    def cache(self, b: Block, block_hash: int, tokens: tuple[int, ...]) -> None:
        if not self.enable_prefix_caching or b.block_hash is not None:
            return
        if block_hash in self.cached:  # same content computed twice (e.g. two requests in one step): keep one
            return
        b.block_hash, b.tokens = block_hash, tokens
        self.cached[block_hash] = b

    def forget_cached(self) -> None:
        """Empty the prefix cache (every block keeps its place in the free queue): after the engine's warm-up, so
        that no request finds its throwaway prompt. Only with no sequence holding a block."""
        assert self.num_free_blocks == self.num_blocks, "forget_cached with blocks in use"
        for b in self.cached.values():
            b.block_hash, b.tokens = None, None
        self.cached.clear()

    def _evict(self, b: Block) -> None:
        if b.block_hash is not None:
            if self.cached.get(b.block_hash) is b:
                del self.cached[b.block_hash]
            b.block_hash, b.tokens = None, None


def chain_hash(parent: int | None, tokens: tuple[int, ...]) -> int:
    return hash((parent, tokens))


class KVCacheManager:
    """Block tables per sequence on top of a BlockPool. Sequences are identified by a hashable key."""

    def __init__(self, num_blocks: int, block_size: int = 16, enable_prefix_caching: bool = True):
        self.pool = BlockPool(num_blocks, block_size, enable_prefix_caching)
        self.block_size = block_size
        self.req_blocks: dict[object, list[Block]] = {}
        self.req_hashes: dict[object, list[int]] = {}  # chain hashes of the sequence's full, cached blocks
        self.prefix_queries = 0  # prompt tokens looked up
        self.prefix_hits = 0  # of those, tokens found in the cache
        # the block tables as array rows: row_of[key] is the key's row; -1 past its blocks
        self.table = np.full((8, 8), -1, dtype=np.int32)
        self.row_of: dict[object, int] = {}
        self._free_rows: list[int] = list(range(7, -1, -1))

    @property
    def num_free_blocks(self) -> int:
        return self.pool.num_free_blocks

    def usage(self) -> float:
        return self.pool.usage()

    def block_ids(self, key: object) -> list[int]:
        return [b.block_id for b in self.req_blocks.get(key, [])]

    def block_tables(self, keys: list) -> np.ndarray:
        """[len(keys), max blocks among them] int32 block ids, padded with -1 (the StepBatch's block_tables)."""
        rows = [self.row_of[k] for k in keys]
        width = max((len(self.req_blocks[k]) for k in keys), default=0)
        return self.table[rows, : max(width, 1)]

    # ------------------------------------------------------------------ table rows
    def _write_row(self, key: object, blocks: list[Block], start: int) -> None:
        """Mirror blocks[start:] into the key's table row (taking a row, growing the table, as needed)."""
        row = self.row_of.get(key)
        if row is None:
            if not self._free_rows:
                n = self.table.shape[0]
                self.table = np.concatenate([self.table, np.full_like(self.table, -1)])
                self._free_rows = list(range(2 * n - 1, n - 1, -1))
            row = self.row_of[key] = self._free_rows.pop()
        if len(blocks) > self.table.shape[1]:
            grown = np.full((self.table.shape[0], max(len(blocks), 2 * self.table.shape[1])), -1, dtype=np.int32)
            grown[:, : self.table.shape[1]] = self.table
            self.table = grown
        if len(blocks) > start:
            self.table[row, start : len(blocks)] = [b.block_id for b in blocks[start:]]

    def _release_row(self, key: object, n: int) -> None:
        row = self.row_of.pop(key, None)
        if row is not None:
            self.table[row, :n] = -1
            self._free_rows.append(row)

    def blocks_needed(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def get_computed_blocks(self, token_ids: list[int]) -> list[Block]:
        """Longest cached prefix of full blocks, capped so at least the last token is computed."""
        if not self.pool.enable_prefix_caching:
            return []
        bs = self.block_size
        max_blocks = (len(token_ids) - 1) // bs
        hits: list[Block] = []
        parent = None
        for i in range(max_blocks):
            tokens = tuple(token_ids[i * bs : (i + 1) * bs])
            h = chain_hash(parent, tokens)
            b = self.pool.lookup(h, tokens)
            if b is None:
                break
            hits.append(b)
            parent = h
        self.prefix_queries += len(token_ids)
        self.prefix_hits += len(hits) * bs
        return hits

    def allocate_slots(self, key: object, total_tokens: int, computed: list[Block] | None = None) -> bool:
        """Make the sequence's table cover `total_tokens`; False (nothing changed) if the pool is short.

        `computed` are prefix-cache hits for a sequence being admitted: they are referenced, not allocated.
        """
        blocks = self.req_blocks.get(key)
        if blocks is None:
            blocks = []
        elif not computed and total_tokens <= len(blocks) * self.block_size:
            return True  # already covered (every decode step but one in block_size)
        computed = computed or []
        start = len(blocks)
        # hits that sit in the free queue stop being free once touched: count them against the free pool
        free_hits = sum(1 for b in computed if b.ref_cnt == 0)
        need = self.blocks_needed(total_tokens) - len(blocks) - len(computed)
        if need > self.pool.num_free_blocks - free_hits:
            return False
        if computed:
            assert not blocks
            self.pool.touch(computed)
            blocks = list(computed)
            self.req_hashes[key] = [b.block_hash for b in computed]  # type: ignore[misc]
        if need > 0:
            blocks = blocks + self.pool.allocate(need)
        self.req_blocks[key] = blocks
        self._write_row(key, blocks, start)
        return True

    def num_hashed_blocks(self, key: object) -> int:
        """Blocks of the sequence already registered in the prefix cache (cache_full_blocks has nothing to do
        until num_computed // block_size exceeds it)."""
        h = self.req_hashes.get(key)
        return len(h) if h is not None else 0

    def cache_full_blocks(self, key: object, token_ids: list[int], num_computed: int) -> None:
        """Register the hashes of the sequence's blocks that are full and computed."""
        if not self.pool.enable_prefix_caching:
            return
        bs = self.block_size
        blocks = self.req_blocks[key]
        hashes = self.req_hashes.setdefault(key, [])
        parent = hashes[-1] if hashes else None
        for i in range(len(hashes), num_computed // bs):
            tokens = tuple(token_ids[i * bs : (i + 1) * bs])
            h = chain_hash(parent, tokens)
            self.pool.cache(blocks[i], h, tokens)
            hashes.append(h)
            parent = h

    def fork(self, parent: object, child: object, num_computed: int) -> int:
        """Give `child` the parent's full computed blocks (shared, ref-counted); returns tokens shared."""
        full = num_computed // self.block_size
        shared = self.req_blocks[parent][:full]
        self.pool.touch(shared)
        self.req_blocks[child] = list(shared)
        self._write_row(child, shared, 0)
        self.req_hashes[child] = list(self.req_hashes.get(parent, []))[:full]
        return full * self.block_size

    def free(self, key: object) -> None:
        blocks = self.req_blocks.pop(key, [])
        self.req_hashes.pop(key, None)
        self._release_row(key, len(blocks))
        self.pool.free(blocks)
