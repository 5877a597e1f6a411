"""The CUDA backend's decode attention launches over the paged bf16 KV cache: the tensor-core prefill and
decode kernels (prefill.py), attn_cluster (the splits of a (token, KV head) merged in distributed shared memory),
attn_partial / attn_partial_gqa + attn_merge, and attn_o_cluster (one token's attention fused with the o
projection). Which one a step takes is dispatch.py's rules (`_attn_choice`, `_cluster_form`, `_attn_o_cluster`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import math

import numpy as np

from llmrs.backends.cuda.dispatch import ATTN_MAXG, ATTN_THREADS
from llmrs.backends.cuda.kernels import NULL
from llmrs.backends.cuda.prefill import (MAX_GRID_Y, PREFILL_BLOCK_K, PREFILL_HEAD_DIMS, PREFILL_THREADS, TC_BLOCK_K,
                                         TC_MAX_GROUP, TC_MIN_SPLIT_KEYS, TC_WARPS)

if TYPE_CHECKING:
    from llmrs.backends.cuda.batch import DeviceBatch

_smem_set: set[int] = set()  # ids of kernels whose dynamic shared memory limit was raised


class AttentionOps:
    """The attention launches, mixed into CUDABackend (module docstring)."""

    def prefill_supported(self) -> bool:
        """Whether prefill_attention can run this backend's shapes (else keep attn_partial)."""
        c = self.config
        bs = self.block_size
        return (c.head_dim in PREFILL_HEAD_DIMS and bs >= 1 and bs & (bs - 1) == 0
                and c.num_attention_heads % c.num_key_value_heads == 0 and self.k.cc >= 80)

    def decode_tc_supported(self) -> bool:
        """Whether decode_attn_tc (prefill_attention.cu) can run this backend's shapes: prefill_attention's head dims
        and GPUs, at most 16 query heads per KV head, cache blocks of a multiple of its 16-key tiles (a tile reads
        one block: one block-table read a tile)."""
        return (self.prefill_supported() and self.config.num_queries_per_kv <= TC_MAX_GROUP
                and self.block_size % TC_BLOCK_K == 0)

    def decode_tc_splits(self, T: int, max_len: int) -> int:
        """Key splits of a decode_attn_tc launch: one when the (token, kv head) blocks already fill two per SM, else
        enough to (about) do so, each split keeping at least 32 keys (two warps' 16-key tiles), at most 64 splits.
        H200, one token at context 512 inside graphs (bench_kernels_graph.py --only attention), us a
        layer at 8 / 16 / 32 splits: 7B 8.27 / 7.45 / 9.51, 0.5B 6.10 / 4.91 / 6.36 (64-key minimum: 9 splits)."""
        if self.attn_splits is not None:
            return max(1, min(self.attn_splits, max_len))
        blocks = T * self.config.num_key_value_heads
        per_split = TC_MIN_SPLIT_KEYS
        if blocks >= 2 * self.num_sms or max_len <= per_split:
            return 1
        return max(1, min(-(-max_len // per_split), -(-2 * self.num_sms // blocks), 64))

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
            dst = out if out_bf16 is None else out_bf16
            if self._prefill_attention(layer, q, q_stride, db, db.prefill_tiles, db.n_prefill_tiles, dst):
                return dst
        if self._attn_choice(db.T, db.max_len) == "tc":
            dst = self._decode_attention_tc(layer, q, q_stride, db, out, out_bf16)
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

    def _prefill_attention(self, layer: int, q: Any, q_stride: int, db: DeviceBatch, tiles: Any, n_tiles: int,
                           out: Any) -> bool:
        """out [T, Hq*D] = causal attention of q (f32, row stride q_stride, head h at columns h*D) over layer's
        paged cache, on the tiles of `plan_prefill_tiles` (`tiles`: device int32, n_tiles x 4, any offset). out is
        f32, or bf16 words (uint16: the o projection's cuBLAS input, the bits cast_f32_bf16 makes of the f32 output).

        `db` is the step's DeviceBatch (positions, block_tables, max_blocks; T, kv_tokens, qk_pairs for the
        profiler). Every row of out covered by the plan is written. Returns False (launching nothing) for
        unsupported shapes.
        """
        c = self.config
        Hq, Hkv, D = c.num_attention_heads, c.num_key_value_heads, c.head_dim
        if not self.prefill_supported() or q_stride % 4 or q.data.ptr % 16 or out.data.ptr % 8:
            return False
        if n_tiles == 0:
            return True
        assert n_tiles <= MAX_GRID_Y, f"{n_tiles} prefill tiles: more than the grid's y limit"
        fn = self.k.fns[f"prefill_attn_{'bf16_' if out.dtype == np.uint16 else ''}d{D}"]
        smem = 4 * PREFILL_BLOCK_K * D * 2  # K and V, two stages each, bf16
        if id(fn) not in _smem_set:
            if smem > 48 * 1024:
                fn.max_dynamic_shared_size_bytes = smem
            _smem_set.add(id(fn))
        scale_log2 = np.float32(float(self.scale) * math.log2(math.e))
        with self._span("attention", f"prefill_attn_d{D}", db.T, Hq, Hkv, D, db.kv_tokens, db.qk_pairs, 1):
            fn((Hq, n_tiles), (PREFILL_THREADS,),
               (q, np.int32(q_stride), self.k_cache[layer], self.v_cache[layer], db.block_tables,
                np.int32(db.max_blocks), db.positions, tiles, out, np.int32(Hq), np.int32(Hkv),
                np.int32(self.block_size.bit_length() - 1), scale_log2), shared_mem=smem)
        return True

    def _decode_attention_tc(self, layer: int, q: Any, q_stride: int, db: DeviceBatch, out: Any,
                             out_bf16: Any = None) -> Any:
        """out [T, Hq*D] (f32) = paged causal attention of q (f32, row stride q_stride) over layer's cache for every
        token of the step (its own causal limit), on tensor cores; attn_merge combines the splits. With `out_bf16`
        (uint16 [T, Hq*D], o's bf16 GEMM input) the result goes there as bf16 words instead (the bits a cast of the
        f32 value makes). Returns the buffer written, or None (launching nothing) where the shapes or alignments are
        not supported: the caller keeps attn_partial."""
        c = self.config
        T, Hq, Hkv, D = db.T, c.num_attention_heads, c.num_key_value_heads, c.head_dim
        if not self.decode_tc_supported() or q_stride % 4 or q.data.ptr % 16:
            return None
        S = self.decode_tc_splits(T, db.max_len)
        chunk = -(-db.max_len // S)
        chunk = -(-chunk // TC_BLOCK_K) * TC_BLOCK_K  # each split starts on a tile of one cache block
        dst = out if out_bf16 is None else out_bf16
        bf16 = "_bf16" if out_bf16 is not None else ""
        fn = self.k.fns[f"decode_attn_tc{bf16 if S == 1 else ''}_d{D}"]
        smem = TC_WARPS * 2 * 2 * TC_BLOCK_K * D * 2 + 16 * D * 2  # stages (K + V, two a warp) + Q
        if id(fn) not in _smem_set:
            if smem > 48 * 1024:  # (a PDL kernel: the attribute goes on its RawKernel, the function both launch)
                getattr(fn, "raw", fn).max_dynamic_shared_size_bytes = smem
            _smem_set.add(id(fn))
        part_acc, part_ml = self._attn_partials(T, Hq, D, S)
        scale_log2 = np.float32(float(self.scale) * math.log2(math.e))
        with self._span("attention", f"decode_attn_tc_d{D}", T, Hq, Hkv, D, db.kv_tokens, db.qk_pairs, S):
            fn((T, Hkv, S), (TC_WARPS * 32,),
               (q, np.int32(q_stride), self.k_cache[layer], self.v_cache[layer], db.block_tables,
                np.int32(db.max_blocks), db.token_seq, db.positions, dst if S == 1 else out, part_acc, part_ml,
                np.int32(Hq), np.int32(Hkv), np.int32(self.block_size.bit_length() - 1), np.int32(chunk), scale_log2),
               shared_mem=smem)
        self._attn_merge(part_acc, part_ml, dst, T, Hq, D, S)
        return dst
