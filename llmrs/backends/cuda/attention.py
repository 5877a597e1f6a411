"""The CUDA backend's decode attention launches over the paged bf16 KV cache: the tensor-core prefill and
decode kernels (prefill.py), attn_cluster (the splits of a (token, KV head) merged in distributed shared memory),
attn_partial / attn_partial_gqa + attn_merge, and attn_o_cluster (one token's attention fused with the o
projection). Which one a step takes is dispatch.py's rules (`_attn_choice`, `_cluster_form`, `_attn_o_cluster`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from llmrs.backends.cuda.dispatch import ATTN_MAXG, ATTN_THREADS
from llmrs.backends.cuda.kernels import NULL
from llmrs.backends.cuda.prefill import decode_attention_tc, prefill_attention

if TYPE_CHECKING:
    from llmrs.backends.cuda.batch import DeviceBatch


class AttentionOps:
    """The attention launches, mixed into CUDABackend (module docstring)."""

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
            if prefill_attention(self, layer, q, q_stride, db, db.prefill_tiles, db.n_prefill_tiles, dst):
                return dst
        if self._attn_choice(db.T, db.max_len) == "tc":
            dst = decode_attention_tc(self, layer, q, q_stride, db, out, out_bf16)
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
