"""Tensor parallelism (Megatron-style): the sharding, the per-rank forward over a communicator, and an
in-process simulation of N ranks that the CPU tests run.

How a model is cut into N ranks (`ShardPlan`):

    q/k/v           by heads: rank r owns q heads [r*Hq/N, (r+1)*Hq/N) and kv heads [r*Hkv/N, (r+1)*Hkv/N);
                    GQA groups are contiguous (q head h reads kv head h // group), so a rank's q heads read
                    only its own kv heads. Fused qkv per rank = its q rows, then its k rows, then its v rows.
    o_proj          by rows of its input (columns of the weight): each rank's partial sum -> all-reduce
    gate/up         by columns of the output (rows of the weights): rank r owns intermediate slice r
    down            by rows of its input: partial sums -> all-reduce
    embedding       by vocabulary: each rank embeds the tokens of its slice, zeros elsewhere -> all-reduce
    lm_head         by vocabulary: each rank computes its slice of the logits -> all-gather
    KV cache        by KV heads: rank r's backend holds [num_blocks, Hkv/N, block_size, D] per layer; the block
                    pool (KVCacheManager) stays one, in rank 0, and every rank uses the same block ids.

So one layer costs two all-reduces of [T, hidden] (after o_proj and after down), plus one all-reduce of the
embeddings and one all-gather of the sampled logits per step.

Shapes that do not divide evenly:
- N must divide num_key_value_heads (and so num_attention_heads, a multiple of it), else UserError.
- intermediate_size: uneven shards, as even as possible (the first `I % N` ranks get one column more); nothing
  is gathered along it, so no padding is needed and each rank's config carries its own size.
- vocabulary: padded to a multiple of N (vLLM's choice): every rank holds ceil(V/N) rows, the padding rows are
  zero, so the all-gather moves equal-sized slices (NCCL's allGather needs that) and the padded logits columns
  are cut off after the gather.

Each rank runs its shard with an unchanged backend (CPUBackend, CUDABackend): `ShardPlan.rank_config(r)` is a
ModelConfig with the rank's head counts, intermediate size and vocabulary slice, and `shard_tensors` gives the
rank's canonical tensors in the shapes that config implies, so `build_weights` takes them as they are.

`Communicator` is the two collectives the forward needs. `SimulatedGroup` runs every rank in one process (one
thread per rank, a barrier at each collective) and sums partials in rank order, as an all-reduce would; the
NCCL communicator (one process per GPU) is in `tp_nccl.py`.
"""

from __future__ import annotations

import dataclasses
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable, Protocol

import numpy as np

from llmrs.backends.base import Launched
from llmrs.engine.batch import StepBatch
from llmrs.engine.config import EngineConfig, ModelConfig
from llmrs.model.decoder import Backend, Model, ModelWeights, build_weights
from llmrs.errors import UserError


# ---------------------------------------------------------------------------------------------- the plan
@dataclass(frozen=True, slots=True)
class ShardPlan:
    """Which slice of every dimension each of `world_size` ranks owns."""

    config: ModelConfig
    world_size: int

    def __post_init__(self) -> None:
        c, n = self.config, self.world_size
        if n < 1:
            raise UserError(f"--tensor-parallel-size must be at least 1 (got {n})")
        if c.num_key_value_heads % n:
            ok = [d for d in range(1, c.num_key_value_heads + 1) if c.num_key_value_heads % d == 0]
            raise UserError(f"--tensor-parallel-size {n} does not divide the model's {c.num_key_value_heads} KV "
                            f"heads; choose one of {', '.join(map(str, ok))}")
        if c.intermediate_size < n:
            raise UserError(f"--tensor-parallel-size {n} exceeds intermediate_size {c.intermediate_size}")

    # -------------------------------------------------------------- sizes per rank
    @property
    def q_heads(self) -> int:
        return self.config.num_attention_heads // self.world_size

    @property
    def kv_heads(self) -> int:
        return self.config.num_key_value_heads // self.world_size

    @property
    def vocab_shard(self) -> int:
        """Rows of embedding / lm_head per rank (the vocabulary padded to a multiple of N)."""
        return -(-self.config.vocab_size // self.world_size)

    def inter_range(self, rank: int) -> tuple[int, int]:
        base, extra = divmod(self.config.intermediate_size, self.world_size)
        start = rank * base + min(rank, extra)
        return start, start + base + (1 if rank < extra else 0)

    def vocab_range(self, rank: int) -> tuple[int, int]:
        """The real token ids [start, stop) of a rank (stop - start < vocab_shard on a padded last rank)."""
        start = rank * self.vocab_shard
        return min(start, self.config.vocab_size), min(start + self.vocab_shard, self.config.vocab_size)

    def rank_config(self, rank: int) -> ModelConfig:
        s, e = self.inter_range(rank)
        return dataclasses.replace(self.config, num_attention_heads=self.q_heads, num_key_value_heads=self.kv_heads,
                                   intermediate_size=e - s, vocab_size=self.vocab_shard)

    # -------------------------------------------------------------- row indices into the fused matrices
    def q_rows(self, rank: int) -> np.ndarray:
        d = self.config.head_dim
        return np.arange(rank * self.q_heads * d, (rank + 1) * self.q_heads * d)

    def kv_rows(self, rank: int) -> np.ndarray:
        d = self.config.head_dim
        return np.arange(rank * self.kv_heads * d, (rank + 1) * self.kv_heads * d)

    def qkv_rows(self, rank: int) -> np.ndarray:
        """Rows of the unsharded fused qkv [q + 2kv, hidden] that make the rank's fused qkv."""
        c = self.config
        kv = self.kv_rows(rank)
        return np.concatenate([self.q_rows(rank), c.q_size + kv, c.q_size + c.kv_size + kv])

    def gate_up_rows(self, rank: int) -> np.ndarray:
        """Rows of the unsharded fused gate_up [2I, hidden] that make the rank's fused gate_up."""
        s, e = self.inter_range(rank)
        return np.concatenate([np.arange(s, e), self.config.intermediate_size + np.arange(s, e)])


def _take_rows(x: Any, rows: np.ndarray) -> Any:
    """x[rows] as a new contiguous array (numpy or CuPy)."""
    if isinstance(x, np.ndarray):
        return np.ascontiguousarray(x[rows])
    import cupy as cp

    return cp.ascontiguousarray(x[cp.asarray(rows)])


def _vocab_rows(x: Any, plan: ShardPlan, rank: int) -> Any:
    """A rank's vocabulary slice of an embedding / lm_head matrix, zero rows padding it to vocab_shard."""
    s, e = plan.vocab_range(rank)
    part = x[s:e]
    if e - s == plan.vocab_shard:
        return part.copy()
    pad = plan.vocab_shard - (e - s)
    if isinstance(x, np.ndarray):
        return np.concatenate([part, np.zeros((pad, x.shape[1]), dtype=x.dtype)])
    import cupy as cp

    return cp.concatenate([part, cp.zeros((pad, x.shape[1]), dtype=x.dtype)])


def shard_tensors(plan: ShardPlan, tensors: dict[str, np.ndarray], rank: int) -> dict[str, np.ndarray]:
    """The rank's canonical tensors (HF names), shaped as `plan.rank_config(rank)` implies."""
    c = plan.config
    q, kv = plan.q_rows(rank), plan.kv_rows(rank)
    s, e = plan.inter_range(rank)
    out: dict[str, np.ndarray] = {"model.norm.weight": tensors["model.norm.weight"],
                                  "model.embed_tokens.weight": _vocab_rows(tensors["model.embed_tokens.weight"],
                                                                           plan, rank)}
    if not c.tie_word_embeddings:
        out["lm_head.weight"] = _vocab_rows(tensors["lm_head.weight"], plan, rank)
    for n in range(c.num_hidden_layers):
        p = f"model.layers.{n}."
        t = lambda name: tensors[p + name]  # noqa: E731
        out.update({
            p + "input_layernorm.weight": t("input_layernorm.weight"),
            p + "post_attention_layernorm.weight": t("post_attention_layernorm.weight"),
            p + "self_attn.q_proj.weight": t("self_attn.q_proj.weight")[q],
            p + "self_attn.k_proj.weight": t("self_attn.k_proj.weight")[kv],
            p + "self_attn.v_proj.weight": t("self_attn.v_proj.weight")[kv],
            p + "self_attn.o_proj.weight": np.ascontiguousarray(t("self_attn.o_proj.weight")[:, q]),
            p + "mlp.gate_proj.weight": t("mlp.gate_proj.weight")[s:e],
            p + "mlp.up_proj.weight": t("mlp.up_proj.weight")[s:e],
            p + "mlp.down_proj.weight": np.ascontiguousarray(t("mlp.down_proj.weight")[:, s:e]),
        })
        if c.attention_bias:
            out.update({p + "self_attn.q_proj.bias": t("self_attn.q_proj.bias")[q],
                        p + "self_attn.k_proj.bias": t("self_attn.k_proj.bias")[kv],
                        p + "self_attn.v_proj.bias": t("self_attn.v_proj.bias")[kv]})
    return out


def shard_fused(plan: ShardPlan, w: ModelWeights, rank: int) -> ModelWeights:
    """The rank's slice of already-fused weights (numpy or CuPy, any storage dtype): what `shard_tensors` +
    `build_weights` give, for weights that exist only fused (synthetic weights drawn on the GPU)."""
    from llmrs.model.decoder import LayerWeights

    q = plan.q_rows(rank)
    qs, qe = int(q[0]), int(q[-1]) + 1
    s, e = plan.inter_range(rank)
    qkv_rows, gu_rows = plan.qkv_rows(rank), plan.gate_up_rows(rank)
    layers = [LayerWeights(
        input_norm=lw.input_norm, qkv=_take_rows(lw.qkv, qkv_rows),
        qkv_bias=None if lw.qkv_bias is None else _take_rows(lw.qkv_bias, qkv_rows),
        o=lw.o[:, qs:qe].copy(), post_norm=lw.post_norm, gate_up=_take_rows(lw.gate_up, gu_rows),
        down=lw.down[:, s:e].copy(),
    ) for lw in w.layers]
    embed = _vocab_rows(w.embed, plan, rank)
    lm_head = embed if w.lm_head is w.embed else _vocab_rows(w.lm_head, plan, rank)
    return ModelWeights(embed=embed, layers=layers, norm=w.norm, lm_head=lm_head)


# ---------------------------------------------------------------------------------------------- collectives
class Communicator(Protocol):
    """The collectives of one rank. Arrays are backend-native (numpy, CuPy)."""

    rank: int
    world_size: int

    def all_reduce(self, x: Any) -> Any:
        """Elementwise sum of every rank's `x` (same shape everywhere); every rank gets the sum."""
        ...

    def all_gather(self, x: Any) -> Any:
        """[world_size, *x.shape]: every rank's `x`, stacked in rank order; every rank gets all of it."""
        ...


class SimulatedGroup:
    """N ranks in one process: `communicator(r)` for each rank's thread. A collective waits for every rank
    (a barrier), then sums (all_reduce, in rank order) or stacks (all_gather) what they contributed.

    NOTE: a rank that fails must call `abort()`, or the others would wait at the next barrier forever."""

    def __init__(self, world_size: int, timeout_s: float = 300.0):
        self.world_size = world_size
        self._barrier = threading.Barrier(world_size, timeout=timeout_s)
        self._slots: list[Any] = [None] * world_size
        self.calls = {"all_reduce": 0, "all_gather": 0}  # per rank-0 call: what one step costs
        self.bytes = {"all_reduce": 0, "all_gather": 0}  # payload bytes per rank

    def communicator(self, rank: int) -> "SimCommunicator":
        return SimCommunicator(self, rank)

    def abort(self) -> None:
        self._barrier.abort()

    def _exchange(self, rank: int, x: Any, op: str) -> list[Any]:
        if rank == 0:
            self.calls[op] += 1
            self.bytes[op] += int(x.nbytes)
        self._slots[rank] = x
        self._barrier.wait()  # every rank has contributed
        parts = list(self._slots)
        self._barrier.wait()  # every rank has read: the slots may be reused by the next collective
        return parts


class SimCommunicator:
    def __init__(self, group: SimulatedGroup, rank: int):
        self.group, self.rank, self.world_size = group, rank, group.world_size

    def all_reduce(self, x: Any) -> Any:
        parts = self.group._exchange(self.rank, x, "all_reduce")
        out = parts[0].copy()
        for p in parts[1:]:
            out += p
        return out

    def all_gather(self, x: Any) -> Any:
        parts = self.group._exchange(self.rank, x, "all_gather")
        return np.stack(parts)


# ---------------------------------------------------------------------------------------------- one rank
class TPShardModel(Model):
    """One rank's shard of the decoder: `Model.forward` with the collectives where the sharding needs them.

    Runs on any backend through the Backend protocol (its op-by-op methods): the CPU simulation's path. On GPUs
    each rank runs the fused CUDA step instead (CUDABackend with `tp=`, llmrs/engine/tp_nccl.py), the same
    collectives at the same points."""

    def __init__(self, plan: ShardPlan, rank: int, weights: ModelWeights, backend: Backend):
        super().__init__(plan.rank_config(rank), weights, backend)
        self.plan, self.rank = plan, rank

    def embed(self, token_ids: np.ndarray, comm: Communicator) -> Any:
        B = self.backend
        start, stop = self.plan.vocab_range(self.rank)
        local = token_ids.astype(np.int64) - start
        mine = (local >= 0) & (local < stop - start)
        x = B.embedding(self.w.embed, np.where(mine, local, 0).astype(np.int32))
        x = x * B.upload(mine.astype(np.float32))[:, None]  # zeros for the other ranks' tokens
        return comm.all_reduce(x)

    def forward_tp(self, batch: StepBatch, comm: Communicator) -> Any:
        """Logits of batch.sample_rows [S, vocab] (backend-native, the same on every rank; a host array of
        shape [0, vocab] when the step samples nothing)."""
        B, w = self.backend, self.w
        eps = self.config.rms_norm_eps
        x = self.decoder_layers(self.embed(batch.token_ids, comm), batch, comm.all_reduce)
        if len(batch.sample_rows) == 0:  # prefill chunks only: K/V written, no logits (and no zero-sized launches);
            return np.zeros((0, self.plan.config.vocab_size), dtype=np.float32)  # every rank skips the gather alike
        x = B.gather_rows(x, batch.sample_rows)
        x = B.rms_norm(x, w.norm, eps)
        part = B.linear(x, w.lm_head)  # [S, vocab_shard]
        full = comm.all_gather(part)  # [N, S, vocab_shard]
        S = part.shape[0]
        return full.transpose(1, 0, 2).reshape(S, -1)[:, : self.plan.config.vocab_size]

    def forward(self, batch: StepBatch) -> np.ndarray:  # pragma: no cover - a shard alone cannot run
        raise TypeError("a tensor-parallel shard runs with its communicator: forward_tp(batch, comm)")


# ---------------------------------------------------------------------------------------------- N ranks, one process
class SimulatedTP:
    """Every rank's shard on CPUBackends in one process, one thread per rank: the CPU check of the sharding."""

    def __init__(self, config: ModelConfig, tensors: dict[str, np.ndarray], world_size: int, num_blocks: int,
                 block_size: int = 16):
        from llmrs.backends.cpu import CPUBackend

        self.plan = ShardPlan(config, world_size)
        self.group = SimulatedGroup(world_size)
        self.shards = []
        for r in range(world_size):
            rc = self.plan.rank_config(r)
            backend = CPUBackend(rc, num_blocks=num_blocks, block_size=block_size)
            weights = build_weights(rc, shard_tensors(self.plan, tensors, r), backend)
            self.shards.append(TPShardModel(self.plan, r, weights, backend))
        self._pool = ThreadPoolExecutor(max_workers=world_size, thread_name_prefix="llmrs-tp-rank")

    def forward(self, batch: StepBatch) -> np.ndarray:
        """Logits [S, vocab] of rank 0 (every rank gets the same; the test checks that too via forward_all)."""
        return self.forward_all(batch)[0]

    def forward_all(self, batch: StepBatch) -> list[np.ndarray]:
        def run(rank: int) -> np.ndarray:
            try:
                return self.shards[rank].forward_tp(batch, self.group.communicator(rank))
            except BaseException:
                self.group.abort()
                raise

        return list(self._pool.map(run, range(self.plan.world_size)))

    def close(self) -> None:
        self._pool.shutdown(wait=True)


class SimulatedTPRunner:
    """A ModelRunner stand-in over `SimulatedTP` (CPU): the engine, its one block pool and sampler in rank 0."""

    def __init__(self, loaded: Any, num_blocks: int, block_size: int, world_size: int):
        if loaded.tensors is None:
            raise UserError("simulated tensor parallelism needs real weights (not a synthetic model)")
        self.loaded, self.config = loaded, loaded.config
        self.num_blocks, self.block_size = num_blocks, block_size
        self.device = f"cpu (simulated TP={world_size})"
        self.max_model_len = self.config.max_position_embeddings
        self.tp = SimulatedTP(self.config, loaded.tensors, world_size, num_blocks, block_size)

    def execute(self, batch: StepBatch) -> np.ndarray:
        return self.tp.forward(batch)

    def execute_and_sample(self, batch: StepBatch, states: list) -> list:
        from llmrs.engine.sampling import sample

        return sample(self.execute(batch), states)

    def launch(self, batch: StepBatch, states: list) -> Launched:
        """The step run to the end (tp_engine runs step by step: no `batch.feed`)."""
        assert batch.feed is None, "tensor-parallel runners run step by step"
        return Launched(self.execute_and_sample(batch, states))

    def graph_sets(self) -> tuple:
        return ()

    def precapture_graphs(self, max_num_seqs: int, len_cap: int, prefill_tokens: int, pool_blocks: bool) -> int:
        return 0

    def shutdown(self) -> None:
        self.tp.close()


# ---------------------------------------------------------------------------------------------- the engine
def tp_engine(loaded: Any, config: EngineConfig, make_runner: Callable[[int], Any]) -> Any:
    """An LLMEngine whose runner is tensor-parallel. `make_runner(num_blocks)` builds it (the NCCL runner may
    settle on fewer blocks, what fits on every GPU: the engine takes `runner.num_blocks`). It runs step by step:
    the tensor-parallel runners finish each step before the next is planned (no async scheduling)."""
    from llmrs.engine.llm_engine import LLMEngine, kv_blocks

    wanted = kv_blocks(loaded, config) if config.kv_cache_tokens is not None or config.device == "cpu" else None
    return LLMEngine(loaded, dataclasses.replace(config, async_scheduling=False), runner=make_runner(wanted))


# ---------------------------------------------------------------------------------------------- head widening
def widen_heads(config: ModelConfig, tensors: dict[str, np.ndarray], n: int) -> tuple[ModelConfig, dict[str, np.ndarray]]:
    """The same function with head counts that `n` divides: every KV head copied r = n / gcd(Hkv, n) times, the
    G query heads of a KV head spread over its copies, and the slots left over filled with dummy query heads
    whose q_proj rows and o_proj columns are zero (their attention output is multiplied by zero), so the logits
    equal the original's up to float summation order. What it costs: r x the K/V cache and k/v weights, and
    the dummy heads' attention. For tests that need a real model (SmolLM2: 9 query / 3 KV heads) at TP=2."""
    import math

    c = config
    Hkv, D, G = c.num_key_value_heads, c.head_dim, c.num_queries_per_kv
    r = n // math.gcd(Hkv, n)
    g2 = -(-G // r)  # query slots per KV copy
    Hkv2, Hq2 = Hkv * r, Hkv * r * g2
    src = np.full(Hq2, -1, dtype=np.int64)  # original query head in each new slot (-1: a dummy)
    for k in range(Hkv):
        for i in range(G):
            src[(k * r + i // g2) * g2 + i % g2] = k * G + i
    kv_src = np.repeat(np.arange(Hkv), r)  # original KV head of each new KV head

    def heads(w: np.ndarray, which: np.ndarray) -> np.ndarray:  # rows of [H*D, ...] (or a bias [H*D]) by head
        parts = w.reshape(-1, D, *w.shape[1:])
        out = np.zeros((len(which), D, *w.shape[1:]), dtype=w.dtype)
        real = which >= 0
        out[real] = parts[which[real]]
        return out.reshape(len(which) * D, *w.shape[1:])

    out = dict(tensors)
    for layer in range(c.num_hidden_layers):
        p = f"model.layers.{layer}.self_attn."
        out[p + "q_proj.weight"] = heads(tensors[p + "q_proj.weight"], src)
        out[p + "k_proj.weight"] = heads(tensors[p + "k_proj.weight"], kv_src)
        out[p + "v_proj.weight"] = heads(tensors[p + "v_proj.weight"], kv_src)
        out[p + "o_proj.weight"] = np.ascontiguousarray(heads(tensors[p + "o_proj.weight"].T, src).T)
        if c.attention_bias:
            out[p + "q_proj.bias"] = heads(tensors[p + "q_proj.bias"], src)
            out[p + "k_proj.bias"] = heads(tensors[p + "k_proj.bias"], kv_src)
            out[p + "v_proj.bias"] = heads(tensors[p + "v_proj.bias"], kv_src)
    return dataclasses.replace(c, num_attention_heads=Hq2, num_key_value_heads=Hkv2), out
