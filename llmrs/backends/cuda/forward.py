"""The fused step the engine runs (`FusedStep.forward`): one decoder step as the fewest launches, top to bottom.

Residual adds ride in the o/down projections (matvec `accumulate`, GEMM beta = 1); RoPE is fused with the K/V cache
write (and, on the matvec path, both ride in the qkv projection's epilogue, as SiLU x up rides in gate_up's:
`fuse_epilogues`; up to a hidden size of NORM_FOLD_MAX_K the RMSNorm before each rides in its prologue:
`fuse_norm`); the sampled rows are gathered inside the final RMSNorm. Each layer: input norm -> qkv (+ RoPE + KV
write) -> attention (-> o, fused where `_attn_o_cluster` takes the shape) -> post norm -> gate_up (+ SiLU x up) ->
down. 4-bit decode carries the norms between its GEMVs (QuantLinearOps.q4_norm_chain).

Tensor parallelism: with `tp=TPRank` (engine/tp_nccl.py) the same step embeds the rank's vocabulary slice, sums
the embeddings and every o/down partial over the ranks with NCCL on the step's stream, and gathers the logits.
A pure decode step replays a CUDA graph instead (graphs.py), and a lone prefill a prefill graph, unless a profiler
is set.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from llmrs import trace
from llmrs.backends.cuda.dispatch import rope_threads
from llmrs.backends.cuda.kernels import NULL
from llmrs.trace import tr

if TYPE_CHECKING:
    from llmrs.backends.cuda.batch import DeviceBatch
    from llmrs.engine.batch import StepBatch
    from llmrs.model.decoder import ModelWeights


class FusedStep:
    """The fused step and its tensor-parallel collectives, mixed into CUDABackend (module docstring)."""

    # ------------------------------------------------------------------ the fused step
    def forward(self, w: ModelWeights, batch: StepBatch, to_host: bool = True) -> Any:
        """Logits of batch.sample_rows [S, vocab]: host f32, or (to_host=False) a device view that the next
        step overwrites."""
        if self.graphs is not None and self.profiler is None:
            logits = self.graphs.run(w, batch)
            if logits is None and self.prefill_graphs is not None and batch.feed is None:
                logits = self.prefill_graphs.run(w, batch)
            if logits is not None:
                return self.cp.asnumpy(logits) if to_host else logits
        tr("fwd_begin")
        db = self.device_batch(batch)
        if batch.feed is not None:
            self.feed(db.token_ids, batch.feed)
        tr("fwd_batch")
        logits = self._forward_device(w, db)
        tr("fwd_queued")
        return self.cp.asnumpy(logits) if to_host else logits

    def _forward_device(self, w: ModelWeights, db: DeviceBatch) -> Any:
        """The step's launches on the current stream (also what a decode graph captures); logits [S, vocab]."""
        c, k = self.config, self.k
        T, S, H = db.T, db.S, c.hidden_size
        Hq, Hkv, D, I = c.num_attention_heads, c.num_key_value_heads, c.head_dim, c.intermediate_size
        n_qkv = (Hq + 2 * Hkv) * D
        eps = c.rms_norm_eps
        x = self._buf("x", (T, H))
        qkv = self._buf("qkv", (T, n_qkv))
        att = self._buf("att", (T, Hq * D))
        gu = self._buf("gu", (T, 2 * I))
        tp = self.tp
        start, rows = (0, c.vocab_size) if tp is None else tp.vocab_range
        with self._span("embedding", "embedding_gather", T, H):
            k.embedding_gather((T,), (256,), (w.embed, db.token_ids, x, np.int32(H), np.int32(start), np.int32(rows)))
        if tp is not None:
            self._all_reduce(x)  # every rank embedded the tokens of its vocabulary slice, zeros for the rest
        # tensor parallel: o and down write the rank's partial sum into `part`, summed over the ranks in place
        # (NCCL, on this stream), then added to the residual by the RMSNorm that follows (add_rms_norm)
        part = self._buf("tp_part", (T, H)) if tp is not None else None
        pending = False  # `part` holds a reduced down_proj output not yet added to x
        threads_rope = rope_threads(Hq, Hkv, D)
        # NOTE: the norms and silu_mul feeding qkv, gate_up and down write bf16 words when that GEMM runs on a bf16
        # matrix (`_norm_for`, `_silu_mul_for`), and so does the tensor-core prefill attention for o; the other
        # attention kernels' f32 output is cast before o
        # 4-bit decode: the norms between the GEMVs carried by them (q4_norm_chain): xg = x * g, ssp the 32-column
        # tiles' sums of x^2, written by o / down, read by gate_up / the next qkv
        chain = tp is None and self.q4_norm_chain(w.layers, T, D)
        xg = self._buf("norm_xg", (T, H)) if chain else None
        ssp = self._buf("norm_ssp", (T, H // 32)) if chain else None
        for n, layer in enumerate(w.layers):
            pair = self._pair_epilogue(layer.qkv, T)
            norm_in = pair and not pending and self._norm_folds(layer.qkv)  # input_norm folded into the matvec
            carried = chain and n > 0  # the previous down wrote this layer's xg / ssp
            h = (xg if carried else x if norm_in
                 else self._norm_for(layer.qkv, x, layer.input_norm, eps, y=part if pending else None))
            if pair:
                self._matvec_pair("rope", h, layer.qkv, qkv, bias=layer.qkv_bias, db=db, layer=n,
                                  norm=(layer.input_norm, eps) if norm_in else None)
            elif self.gemv_pair_takes("rope", layer.qkv, T, D):  # 4-bit: the GEMV with RoPE + KV write fused
                self.gemv_q4_pair("rope", h, layer.qkv.marlin, qkv, layer.qkv_bias,
                             (db.positions, self.inv_freq, db.slots, self.k_cache[n], self.v_cache[n], Hq, Hkv, D,
                              self.block_size), layer.qkv.nbytes, norm_in=(ssp, eps) if carried else None)
            else:
                # on the bf16 GEMM path the bias rides in rope_write_kv (the same f32 add as add_bias, one launch less)
                fold = layer.qkv_bias is not None and self._bias_in_rope(layer.qkv, T)
                self._linear(h, layer.qkv, None if fold else layer.qkv_bias, qkv, name="qkv")
                with self._span("rope_kv", "rope_write_kv", T, Hq, Hkv, D):
                    k.rope_write_kv((T,), (threads_rope,),
                                    (qkv, db.positions, self.inv_freq, db.slots, self.k_cache[n], self.v_cache[n],
                                     np.int32(Hq), np.int32(Hkv), np.int32(D), np.int32(self.block_size),
                                     layer.qkv_bias if fold else NULL))
            # one token: the attention and o as one kernel where it takes the shapes (x += o(att), `_attn_o_cluster`)
            ao = 0 if chain else self._attn_o_cluster(layer.o, db)
            if ao:
                self._attention_o(n, qkv, n_qkv, db, layer.o, x, ao)
                o_in = None
            else:
                # the tensor-core kernels (a prefill step, decode_attn_tc) write the attention output as o's bf16
                # GEMM input: no cast
                att_bf16 = (self._buf("att_bf16", (T, Hq * D), np.uint16)
                            if ((db.n_prefill_tiles or self._attn_choice(T, db.max_len) == "tc")
                                and self._gemm_takes_bf16(layer.o, T)) else None)
                o_in = self._attention(n, qkv, n_qkv, db, att, out_bf16=att_bf16)
            pair = self._pair_epilogue(layer.gate_up, T)
            norm_in = pair and tp is None and self._norm_folds(layer.gate_up)  # post_norm folded into gate_up
            if chain:  # o writes gate_up's xg / ssp too
                if not self.gemv_q4(o_in, layer.o.marlin, None, x, True, "o", layer.o.nbytes,
                               norm_out=(layer.post_norm, xg, ssp)):
                    raise RuntimeError(f"o: the norm chain's GEMV refused its input {o_in.shape} {o_in.dtype}")
                h = xg
            elif tp is None:
                if not ao:
                    self._linear(o_in, layer.o, None, x, accumulate=True, name="o", preload=True)
                h = x if norm_in else self._norm_for(layer.gate_up, x, layer.post_norm, eps)
            else:
                self._linear(o_in, layer.o, None, part, name="o", preload=True)
                self._all_reduce(part)
                h = self._norm_for(layer.gate_up, x, layer.post_norm, eps, y=part)
            if pair:
                act = self._buf("act", (T, I))
                self._matvec_pair("silu", h, layer.gate_up, act, norm=(layer.post_norm, eps) if norm_in else None)
            elif self.gemv_pair_takes("silu", layer.gate_up, T):  # 4-bit: the GEMV with SiLU x up fused
                act = self._buf("act", (T, I))
                self.gemv_q4_pair("silu", h, layer.gate_up.marlin, act, nbytes=layer.gate_up.nbytes,
                             norm_in=(ssp, eps) if chain else None)
            elif (h.dtype == np.uint16 and self.gemm_silu_takes(layer.gate_up, T)
                  and self._gemm_takes_bf16(layer.down, T)):  # the 4-bit GEMM's SiLU form, bf16 out: down's input
                act = self._buf("act_bf16", (T, I), np.uint16)
                self.gemm_q4_silu(h, layer.gate_up.marlin, act)
            elif self._gate_up_bf16(layer, T):  # bf16 gate / up straight from cuBLAS, SiLU x up bf16 to bf16
                gu16 = self._buf("gu_bf16", (T, 2 * I), np.uint16)
                self._linear(h, layer.gate_up, None, gu16, name="gate_up", out_bf16=True)
                act = self._silu_mul_for(layer.down, gu16)
            else:
                self._linear(h, layer.gate_up, None, gu, name="gate_up")
                act = self._silu_mul_for(layer.down, gu)
            if chain and n + 1 < len(w.layers):  # down writes the next qkv's xg / ssp too
                if not self.gemv_q4(act, layer.down.marlin, None, x, True, "down", layer.down.nbytes,
                               norm_out=(w.layers[n + 1].input_norm, xg, ssp)):
                    raise RuntimeError(f"down: the norm chain's GEMV refused its input {act.shape} {act.dtype}")
            elif tp is None:
                self._linear(act, layer.down, None, x, accumulate=True, name="down")
            else:
                self._linear(act, layer.down, None, part, name="down")
                self._all_reduce(part)
                pending = True
            if trace.PATH is not None and n % 7 == 6:  # (no tag string built per layer without tracing)
                tr(f"fwd_layer{n + 1}")
        if pending:
            with self._span("add", "add_inplace", T * H):
                k.add_inplace((min(65535, -(-T * H // 256)),), (256,), (x, part, np.int64(T * H)))
        if self._gemm_takes_bf16(w.lm_head, S):  # many sampled rows (a large decode batch): lm_head on cuBLAS
            hs = self._buf("h_final_bf16", (S, H), np.uint16)
            self._rms_norm_bf16(x, w.norm, eps, hs, rows=db.sample_rows, n_rows=S)
        else:
            hs = self._buf("h_final", (S, H))
            if S:
                self._rms_norm(x, w.norm, eps, hs, rows=db.sample_rows, n_rows=S)
        logits = self._buf("logits", (S, c.vocab_size))
        if S:
            self._linear(hs, w.lm_head, None, logits, name="lm_head")
        if tp is not None:  # every rank computed its vocabulary slice: gather them, rank order = vocabulary order
            return self._gather_logits(logits, S)
        return logits

    # ------------------------------------------------------------------ tensor parallel
    def _all_reduce(self, x: Any) -> None:
        """Sum `x` (contiguous f32) over the tensor-parallel ranks, in place, on the current stream."""
        n = self.tp.world_size
        with self._span("allreduce", "all_reduce", x.size * 4, n):
            self.tp.comm.all_reduce(x)

    def _gather_logits(self, part: Any, S: int) -> Any:
        """[S, vocab] logits (a view of a workspace buffer) from every rank's [S, vocab_shard] slice."""
        tp, cp = self.tp, self.cp
        N, Vs = tp.world_size, part.shape[1]
        full = self._buf("tp_logits_ranks", (N, S, Vs))
        if S:
            with self._span("allgather", "all_gather", part.size * 4, N):
                tp.comm.all_gather_into(part, full)
        if S <= 1:
            flat = full.reshape(S, N * Vs)  # [N, 1, Vs] is already [1, N * Vs] in vocabulary order
        else:
            flat = self._buf("tp_logits", (S, N * Vs))
            with self._span("copy", "logits_transpose", S * N * Vs):
                cp.copyto(flat.reshape(S, N, Vs), full.transpose(1, 0, 2))
        return flat[:, : tp.vocab_size]
