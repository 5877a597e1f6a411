"""numpy float32 reference backend: the source of truth every other backend is checked against.

Written for clarity first. The paged KV cache has the contract layout even here, so the scheduler, the
block pool and the attention indexing are exercised by the reference exactly as by the GPU:
K, V per layer: [num_blocks, num_kv_heads, block_size, head_dim].
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from llmrs.engine.batch import StepBatch
from llmrs.engine.config import ModelConfig
from llmrs.model.decoder import rope_inv_freq


def available_cores() -> int:
    """The cores this process may run on (its CPU affinity, else the machine's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # (no affinity API off Linux)
        return os.cpu_count() or 1


def _cpu_times() -> tuple[int, int] | None:
    """(idle, total) jiffies of all CPUs from /proc/stat (idle and iowait count as idle), None off Linux."""
    try:
        with open("/proc/stat") as f:
            fields = [int(v) for v in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    return fields[3] + (fields[4] if len(fields) > 4 else 0), sum(fields[:8])


def free_cores(window_s: float = 0.3) -> int:
    """The cores of this process's affinity that other work leaves free, from the machine's idle time over
    `window_s` (at least 1; every core where /proc/stat is not there)."""
    import time

    cores = available_cores()
    first = _cpu_times()
    if first is None:
        return cores
    time.sleep(window_s)
    second = _cpu_times()
    total = second[1] - first[1]
    if total <= 0:
        return cores
    machine = os.cpu_count() or cores
    idle = machine * (second[0] - first[0]) / total  # idle cores of the whole machine
    return max(1, min(cores, int(idle + 0.5)))


def limit_threads(threads: int) -> None:
    """At most `threads` BLAS threads in this process (numpy's matmuls). A BLAS pool over cores that other work
    keeps busy spins against it: on a 2-core VM with one core taken by another process, `llmrs serve`'s decode
    ran at 226 ms a token on two threads against 107 on one (docs/serving.md)."""
    from threadpoolctl import threadpool_limits

    threadpool_limits(limits=max(1, int(threads)), user_api="blas")


class CPUBackend:
    name = "cpu"
    graphs = prefill_graphs = None  # every step runs as it comes

    def __init__(self, config: ModelConfig, num_blocks: int, block_size: int = 16):
        self.config = config
        self.block_size = block_size
        self.num_blocks = num_blocks
        shape = (num_blocks, config.num_key_value_heads, block_size, config.head_dim)
        self.k_cache = [np.zeros(shape, dtype=np.float32) for _ in range(config.num_hidden_layers)]
        self.v_cache = [np.zeros(shape, dtype=np.float32) for _ in range(config.num_hidden_layers)]
        self.inv_freq = rope_inv_freq(config)
        self.scale = np.float32(1.0 / np.sqrt(config.head_dim))

    # ------------------------------------------------------------------ weights
    def upload(self, w: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(w, dtype=np.float32)

    def upload_quantized(self, w: Any) -> np.ndarray:
        """A llmrs.model.quant.QuantWeight, dequantized exactly to float32."""
        return self.upload(w.dequantize())

    # ------------------------------------------------------------------ elementwise
    def embedding(self, table: np.ndarray, token_ids: np.ndarray) -> np.ndarray:
        return table[token_ids]

    def rms_norm(self, x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
        var = np.mean(x * x, axis=-1, keepdims=True)
        return weight * (x / np.sqrt(var + np.float32(eps)))

    def linear(self, x: np.ndarray, w: np.ndarray, bias: np.ndarray | None = None) -> np.ndarray:
        # NOTE: y = x @ w.T either way. With several rows, OpenBLAS streams the weight faster as the left
        # operand (w @ x.T): measured on 2 cores, 16 rows over SmolLM2's weights 55 ms instead of 74 ms.
        y = x @ w.T if x.shape[0] == 1 else np.ascontiguousarray((w @ np.ascontiguousarray(x.T)).T)
        return y + bias if bias is not None else y

    def silu_mul(self, gate_up: np.ndarray) -> np.ndarray:
        i = gate_up.shape[-1] // 2
        g, u = gate_up[:, :i], gate_up[:, i:]
        return g / (1.0 + np.exp(-g)) * u

    def add(self, x: np.ndarray, y: np.ndarray) -> np.ndarray:
        return x + y

    def gather_rows(self, x: np.ndarray, rows: np.ndarray) -> np.ndarray:
        return x[rows]

    def to_host(self, x: np.ndarray) -> np.ndarray:
        return x

    # ------------------------------------------------------------------ rotary embedding
    def rope_cos_sin(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        freqs = positions.astype(np.float32)[:, None] * self.inv_freq[None, :]
        emb = np.concatenate([freqs, freqs], axis=-1)
        return np.cos(emb), np.sin(emb)

    def rope(self, q: np.ndarray, k: np.ndarray, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Rotate q and k by position (the HF 'rotate_half' layout: first half paired with second half)."""
        c = self.config
        cos, sin = self.rope_cos_sin(positions)
        cos, sin = cos[:, None, :], sin[:, None, :]

        def rotate(x: np.ndarray, heads: int) -> np.ndarray:
            x = x.reshape(x.shape[0], heads, c.head_dim)
            half = c.head_dim // 2
            rotated = np.concatenate([-x[..., half:], x[..., :half]], axis=-1)
            return x * cos + rotated * sin

        return rotate(q, c.num_attention_heads), rotate(k, c.num_key_value_heads)

    # ------------------------------------------------------------------ paged KV cache + attention
    def write_kv(self, layer: int, k: np.ndarray, v: np.ndarray, slot_mapping: np.ndarray) -> None:
        c = self.config
        blocks, offsets = slot_mapping // self.block_size, slot_mapping % self.block_size
        self.k_cache[layer][blocks, :, offsets, :] = k.reshape(-1, c.num_key_value_heads, c.head_dim)
        self.v_cache[layer][blocks, :, offsets, :] = v.reshape(-1, c.num_key_value_heads, c.head_dim)

    def gather_context(self, layer: int, block_table: np.ndarray, ctx: int) -> tuple[np.ndarray, np.ndarray]:
        """A sequence's cached K and V as [num_kv_heads, ctx, head_dim] (follows its block table)."""
        nb = -(-ctx // self.block_size)
        blocks = block_table[:nb]
        c = self.config

        def gather(cache: np.ndarray) -> np.ndarray:
            x = cache[blocks]  # [nb, kv_heads, bs, hd]
            return x.transpose(1, 0, 2, 3).reshape(c.num_key_value_heads, nb * self.block_size, c.head_dim)[:, :ctx]

        return gather(self.k_cache[layer]), gather(self.v_cache[layer])

    def attention(self, layer: int, q: np.ndarray, batch: StepBatch) -> np.ndarray:
        """Causal GQA attention of each sequence's new tokens over its whole cached context."""
        c = self.config
        out = np.empty((q.shape[0], c.num_attention_heads * c.head_dim), dtype=np.float32)
        group = c.num_queries_per_kv
        for b in range(batch.num_seqs):
            s, e = int(batch.query_start[b]), int(batch.query_start[b + 1])
            ctx = int(batch.context_lens[b])
            K, V = self.gather_context(layer, batch.block_tables[b], ctx)  # [kvh, ctx, hd]
            n = e - s
            qb = q[s:e].reshape(n, c.num_key_value_heads, group, c.head_dim).transpose(1, 2, 0, 3)
            scores = (qb @ K[:, None].transpose(0, 1, 3, 2)) * self.scale  # [kvh, group, n, ctx]
            if n > 1:  # the new tokens are the last n of the context: token i sees keys <= ctx - n + i
                key_pos = np.arange(ctx)[None, :]
                query_pos = np.arange(ctx - n, ctx)[:, None]
                scores = np.where(key_pos <= query_pos, scores, np.float32(-np.inf))
            scores = scores - scores.max(axis=-1, keepdims=True)
            p = np.exp(scores)
            p /= p.sum(axis=-1, keepdims=True)
            o = p @ V[:, None]  # [kvh, group, n, hd]
            out[s:e] = o.transpose(2, 0, 1, 3).reshape(n, -1)
        return out
