"""CUDA graphs for a lone prompt's prefill (on with the decode graphs; `LLMRS_PREFILL_GRAPHS=0` turns it off): time
to first token without the host's launch speed in it, nor cuBLAS's first call of each new token count.

Measured on the H200 (session 18, 7B bf16 synthetic, fresh servers, reports/h200-qwen2.5/session18): 256-token
prompts, TTFT medians 9.03 / 9.53 / 8.75 / 9.25 ms against 9.28 / 9.70 / 9.50 / 9.28 eager (four servers each);
prompts of varied lengths (192-576 tokens, 32 a pass), first pass on a fresh server 13.79 / 15.09 ms against
18.07 / 18.70 eager, second pass 15.31 / 15.20 against 15.62 / 15.18. Eager, cuBLAS spends ~2.6 ms of host time
on its first call of a (token count, shape) against ~0.05 ms later (scripts/cublas_first_shape.py): every new
prompt length paid it up to five times; a graph per bucket pays it once, at warm-up.

An eager 256-token prefill of a 7B enqueues ~230 launches (112 cuBLAS calls) in 3.4-7.4 ms depending on the
host, against ~7 ms of GPU work (reports/h200-qwen2.5, sessions 16-17); where the host is the slower one, the first
token waits on it. A step that is one sequence's prefill from position 0 (no cached prefix: the TTFT case) is
padded up to a bucket of PREFILL_BUCKETS tokens and replayed from a graph captured per bucket:
- the padded step (`padded_prefill`): the prompt's L tokens, then token 0 at positions L .. Tb-1; the block-table
  row extended with the backend's pad block, so padding tokens whose positions fall past the sequence's blocks
  write their K/V there (those in its last blocks write slots that the next tokens overwrite before any read);
  the sampled row L - 1. Causal attention keeps the real tokens from seeing the padding keys (they come after
  them), and no padding row's output is read;
- everything the kernels read comes from one static device buffer in `CUDABackend.pack_batch`'s layout, refilled
  by one async copy before each replay; positions and the prefill attention's tiles are the bucket's own (fixed);
- capture as DecodeGraphs does (cuda_graphs.py: cuBLAS through RawCublas, programmatic dependent launch kept only
  if a replay equals the eager step), in a workspace of its own.
The padded rows cost GPU work (at most the bucket's slack); a step that is anything else runs eagerly.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from llmrs.backends.cuda_graphs import DecodeGraphs, _Graph, bucket_for
from llmrs.engine.batch import StepBatch, build_step_batch

PREFILL_BUCKETS = (32, 64, 96, 128, 192, 256, 384, 512, 768, 1024)


def prefill_bucket(n: int, min_tokens: int) -> int | None:
    """The bucket a lone prefill of n tokens is padded to: None below min_tokens or past the largest."""
    return None if n < min_tokens else bucket_for(n, PREFILL_BUCKETS)


def is_lone_prefill(batch: StepBatch) -> bool:
    """One sequence, every token new from position 0, its last row sampled."""
    T = batch.num_tokens
    return (batch.num_seqs == 1 and T > 1 and int(batch.positions[0]) == 0 and int(batch.context_lens[0]) == T
            and batch.sample_rows.shape[0] == 1 and int(batch.sample_rows[0]) == T - 1)


def padded_prefill(batch: StepBatch, Tb: int, pad_block: int, block_size: int) -> StepBatch:
    """The lone prefill `batch` (L tokens) padded to Tb tokens (module docstring): a block-table row of Tb /
    block_size entries (the sequence's own, -1 and past them the pad block), slots from it, sample row L - 1."""
    L = batch.num_tokens
    assert is_lone_prefill(batch) and L <= Tb and Tb % block_size == 0
    nb = Tb // block_size
    table = np.full(nb, pad_block, dtype=np.int64)
    own = np.asarray(batch.block_tables[0][:nb], dtype=np.int64)
    table[:own.size] = np.where(own < 0, pad_block, own)
    tokens = np.zeros(Tb, dtype=np.int64)
    tokens[:L] = batch.token_ids
    out = build_step_batch([(tokens.tolist(), 0, table.tolist(), True)], block_size)
    out.sample_rows[:] = L - 1
    return out


def capture_blocks(Tb: int, block_size: int, num_blocks: int) -> list[int] | None:
    """Distinct blocks for a Tb-token capture batch (blocks 0 .. Tb / block_size - 1 of the pool), or None where the
    pool has fewer. Only while no sequence holds a block (the engine's precapture, right after its warm-up)."""
    nb = Tb // block_size
    return list(range(nb)) if nb <= num_blocks else None


class PrefillGraphs(DecodeGraphs):
    """Captures and replays lone-prefill graphs for one CUDABackend, one per bucket (module docstring)."""

    # The capture's check (its replay against the eager step) runs on the bucket's own batch. With every token's
    # K/V in the one pad block, tokens 16 positions apart share a slot and write different (rotated) values in an
    # unordered race, so the eager step and the replay could read different keys: on the H200 (session 18) 5 of
    # ~10 servers failed the check and, as a decode graph's failure does, turned programmatic launch off for every
    # later capture. Now the precapture (an idle engine: no block holds anything) gives the batch distinct blocks
    # (`capture_blocks`), and a failure here costs only that graph its programmatic launch.
    pdl_failure_is_global = False

    def run(self, w: Any, batch: StepBatch) -> Any | None:  # type: ignore[override]
        """The step's logits [1, vocab] (a device view, overwritten by the next replay) from a graph, or None
        when the step must run eagerly."""
        b = self.b
        if b.tp is not None or b.prefill_min_tokens is None or not is_lone_prefill(batch):
            return None
        Tb = prefill_bucket(batch.num_tokens, b.prefill_min_tokens)
        if Tb is None:
            return None
        key = (Tb, 0)
        g = self.graphs.get(key)
        if g is None:
            if key in self.failed:
                return None
            g = self._capture_prefill(w, Tb)
            if g is None:
                return None
        if g.copied is not None:
            g.copied.synchronize()
        packed, _ = b.pack_batch(padded_prefill(batch, Tb, b.pad_block, b.block_size))
        g.host[:] = packed
        stream = self.cp.cuda.get_current_stream()
        g.dev.set(g.host, stream=stream)
        g.copied = g.copied or self.cp.cuda.Event(disable_timing=True)
        g.copied.record(stream)
        g.graph.launch(stream=stream)
        self.replays += 1
        return g.logits[:1]

    def precapture(self, w: Any, max_tokens: int, max_cap: int = 0,  # type: ignore[override]
                   pool_blocks: bool = False) -> int:
        """Captures every bucket up to `max_tokens` now, largest first (the workspace grows once). pool_blocks: no
        sequence holds a block and the caller forgets the prefix cache after (an idle engine): the capture batches
        then write their K/V into the pool's first blocks, distinct ones (`capture_blocks`). Returns how many."""
        b = self.b
        if b.tp is not None or b.prefill_min_tokens is None:
            return 0
        n = 0
        for Tb in reversed([t for t in PREFILL_BUCKETS if t <= max_tokens]):
            key = (Tb, 0)
            if (key not in self.graphs and key not in self.failed
                    and self._capture_prefill(w, Tb, capture_blocks(Tb, b.block_size, b.num_blocks)
                                              if pool_blocks else None) is not None):
                n += 1
        return n

    def _capture_prefill(self, w: Any, Tb: int, blocks: list[int] | None = None) -> _Graph | None:
        """The bucket's graph, captured on its own padding step: Tb tokens of one sequence over `blocks` (distinct
        blocks nothing holds: the precapture's), or all in the pad block (a capture while serving)."""
        b = self.b
        table = blocks if blocks is not None else [b.pad_block] * (Tb // b.block_size)
        shape = build_step_batch([([0] * Tb, 0, table, True)], b.block_size)
        packed, n_tiles = b.pack_batch(shape)
        host = b._pinned(f"prefill_graph_{Tb}", packed.size, np.int32)
        host[:] = packed
        dev = self.cp.asarray(host)
        return self._capture_db(w, (Tb, 0), host, dev, b.unpack_batch(dev, shape, n_tiles), Tb // b.block_size,
                                f"a {Tb}-token prefill")
