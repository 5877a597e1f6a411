"""Tensor parallelism over NCCL: one process per GPU, rank 0 in the engine's own process.

Checked on 2 H200s by tests/gpu/test_tp_gpu.py and the server suite at TP=2.

Layout:
- rank 0 is the calling process (the engine: scheduler, one block pool, sampler) on GPU 0; ranks 1..N-1 are
  `multiprocessing` "spawn" workers, rank r on GPU r. Each step rank 0 sends the StepBatch (plain numpy arrays)
  down a pipe to every worker, then every rank runs its shard; the collectives are NCCL's, on the current CuPy
  stream (the one the backend launches on). Every rank runs the fused CUDA step (`CUDABackend(..., tp=TPRank)`, cuda.py): decode steps replay CUDA graphs per batch
  bucket with the all-reduces and the logits all-gather captured inside, exactly as on one GPU. Every rank
  ends the step with the full logits; rank 0 samples them on its GPU, workers drop them.
- start-up, over the pipes: workers say "ready" (CuPy imported, device selected) -> every rank creates its
  NCCL communicator (ncclCommInitRank, unique id made by rank 0) -> every rank loads the model and says how
  many KV blocks fit beside its shard -> rank 0 takes the minimum (the block pool is one) -> every rank builds
  its CUDABackend + shard weights and says "built". A worker that fails sends its traceback and exits; rank 0
  raises it (before the first step, or at the next step).
- NVLink multicast (NVLS) stays off in every process: `MULTICAST_OFF` is set in os.environ before CuPy / NCCL
  load, in rank 0 and in each worker (a spawned child also inherits it).

Limits: all-reduce in bf16 (activations are f32 here: twice the bytes of the roofline's bf16
figure; at decode the payload is a few KB and latency-bound); GGUF and AWQ checkpoints still load whole in
each process (every tensor on the host first; plain safetensors checkpoints are read rank by rank, each process
only its slices: llmrs/model/shard_load.py); the step's broadcast is a pickle down a pipe per worker (a few KB,
~50-100 us of host time per step).
"""

from __future__ import annotations

import multiprocessing as mp
import os
import traceback
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from llmrs.backends.base import Launched
from llmrs.engine.batch import StepBatch
from llmrs.backends.cuda import CUDAModel
from llmrs.engine.tp import ShardPlan, shard_tensors
from llmrs.errors import UserError

if TYPE_CHECKING:
    from llmrs.engine.async_engine import AsyncEngine

MULTICAST_OFF = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
START_TIMEOUT_S = 300.0
LOAD_TIMEOUT_S = 3600.0  # a 72B synthetic model draws ~145 GB of weights across the ranks


def multicast_off() -> None:
    """NVLink SHARP / multicast off for NCCL (and PyTorch, NVSHMEM should they load): see the module doc."""
    # NCCL reads its settings from the environment only, so this is how it is told (not an llmrs setting)
    os.environ.update(MULTICAST_OFF)


def visible_gpus() -> int:
    """GPUs CuPy can see (CUDA_VISIBLE_DEVICES applies); 0 without CuPy or a driver."""
    try:
        import cupy as cp

        return int(cp.cuda.runtime.getDeviceCount())
    except Exception:
        return 0


def check_tp_size(n: int, device: str = "auto") -> None:
    """The CLI's check of --tensor-parallel-size before anything loads: one GPU per rank."""
    if n < 1:
        raise UserError(f"--tensor-parallel-size must be at least 1 (got {n})")
    if n == 1:
        return
    if device == "cpu":
        raise UserError(f"--tensor-parallel-size {n} runs one rank per GPU; --device cpu has none")
    have = visible_gpus()
    if have < n:
        raise UserError(f"--tensor-parallel-size {n} needs {n} GPUs; {have} visible")


# ---------------------------------------------------------------------------------------------- NCCL
class NcclCommunicator:
    """One rank's NCCL communicator (cupy.cuda.nccl); collectives on the current stream, float32 payloads."""

    def __init__(self, rank: int, world_size: int, unique_id: Any):
        multicast_off()
        import cupy as cp
        from cupy.cuda import nccl

        if not getattr(nccl, "available", True):
            raise UserError("CuPy was built without NCCL here: pip install nvidia-nccl-cu12 (or -cu13, as your CuPy)")
        self.cp, self.nccl = cp, nccl
        self.rank, self.world_size = rank, world_size
        self.comm = nccl.NcclCommunicator(world_size, unique_id, rank)

    def _stream(self) -> int:
        return self.cp.cuda.get_current_stream().ptr

    def all_reduce(self, x: Any) -> Any:
        """Sum over ranks, IN PLACE when `x` is already contiguous float32 (the forward passes fresh arrays)."""
        cp, nccl = self.cp, self.nccl
        x = cp.ascontiguousarray(x, dtype=cp.float32)
        self.comm.allReduce(x.data.ptr, x.data.ptr, x.size, nccl.NCCL_FLOAT32, nccl.NCCL_SUM, self._stream())
        return x

    def all_gather(self, x: Any) -> Any:
        x = self.cp.ascontiguousarray(x, dtype=self.cp.float32)
        return self.all_gather_into(x, self.cp.empty((self.world_size, *x.shape), dtype=self.cp.float32))

    def all_gather_into(self, x: Any, out: Any) -> Any:
        """out [world_size, *x.shape] (contiguous f32, preallocated: what a CUDA graph captures) <- every rank's x."""
        assert x.flags.c_contiguous and out.flags.c_contiguous and out.size == x.size * self.world_size
        self.comm.allGather(x.data.ptr, out.data.ptr, x.size, self.nccl.NCCL_FLOAT32, self._stream())
        return out

    def abort(self) -> None:
        """End this rank's communicator now (ncclCommAbort): never waits for a peer, unlike a destroy, which can
        hang when a peer is gone (and runs at garbage collection if not called: so call this at shutdown)."""
        comm, self.comm = self.comm, None
        if comm is not None:
            comm.abort()


def new_unique_id() -> Any:
    multicast_off()
    from cupy.cuda import nccl

    return nccl.get_unique_id()


# ---------------------------------------------------------------------------------------------- one rank
@dataclass(frozen=True, slots=True)
class TPRank:
    """What a CUDABackend on a tensor-parallel rank needs (`CUDABackend(..., tp=TPRank(...))`): its fused step
    then embeds its vocabulary slice, all-reduces the embeddings and every o_proj / down_proj partial sum, and
    all-gathers the logits slices into the full vocabulary (cuda.py, `_forward_device`)."""

    comm: Any  # NcclCommunicator
    rank: int
    world_size: int
    vocab_range: tuple[int, int]  # (first token id, real rows) of the rank's embedding / lm_head slice
    vocab_size: int  # the whole model's (the gathered logits are cut to it)

    @classmethod
    def of(cls, plan: ShardPlan, rank: int, comm: Any) -> "TPRank":
        s, e = plan.vocab_range(rank)
        return cls(comm, rank, plan.world_size, (s, e - s), plan.config.vocab_size)


class _Rank:
    """What every rank does at start-up, in the order the module doc gives; rank 0 and workers share it."""

    def __init__(self, rank: int, world_size: int):
        multicast_off()
        import cupy as cp

        self.cp, self.rank, self.world_size = cp, rank, world_size
        cp.cuda.Device(rank).use()
        self.comm: NcclCommunicator | None = None
        self.model: CUDAModel | None = None

    def connect(self, unique_id: Any) -> None:
        self.comm = NcclCommunicator(self.rank, self.world_size, unique_id)

    def load(self, spec: str | None, loaded: Any, block_size: int, gpu_memory_utilization: float,
             num_blocks: int | None, max_blocks: int) -> int:
        """Load the rank's tensors (rank 0 passes its own LoadedModel) and return the KV blocks that fit here.

        A plain safetensors checkpoint: the config from `resolve` (config.json) and only this rank's slices from
        disk (`load_rank_tensors`), unless rank 0 was handed every tensor already. GGUF and AWQ checkpoints: every
        tensor on the host, sliced at build. Synthetic models: drawn on the GPU at build."""
        from llmrs.backends.cuda import CUDABackend
        from llmrs.model.loader import load, resolve
        from llmrs.model.shard_load import load_rank_tensors, reads_shards

        src = resolve(spec) if loaded is None else loaded.source
        self.shard: dict[str, np.ndarray] | None = None  # the rank's tensors, read rank by rank
        if reads_shards(src) and (loaded is None or loaded.tensors is None):
            self.loaded = None
            self.plan = ShardPlan(src.config, self.world_size)
            self.shard = load_rank_tensors(src.path, self.plan, self.rank)
        else:
            if loaded is None or (loaded.tensors is None and src.kind != "synthetic"):
                loaded = load(spec)  # e.g. rank 0 of a GGUF checkpoint handed load(spec, read_tensors=False)
            self.loaded = loaded
            self.plan = ShardPlan(loaded.config, self.world_size)
        self.rank_config = self.plan.rank_config(self.rank)
        if num_blocks is not None:
            return num_blocks
        weight_bytes = 2 * self.rank_config.num_parameters()  # bf16 shard (vocab slice + its heads + its MLP)
        fit = CUDABackend.blocks_that_fit(self.rank_config, weight_bytes, gpu_memory_utilization, block_size)
        return min(fit, max_blocks)

    def build(self, num_blocks: int, block_size: int, cuda_graphs: bool | None = None) -> None:
        from llmrs.backends.cuda import CUDABackend
        from llmrs.model.decoder import build_weights

        if num_blocks < 1:
            raise UserError(f"rank {self.rank}: no room for a KV cache beside its weight shard")
        rc = self.rank_config
        backend = CUDABackend(rc, num_blocks=num_blocks, block_size=block_size, cuda_graphs=cuda_graphs,
                              tp=TPRank.of(self.plan, self.rank, self.comm))
        if self.shard is not None:
            weights = build_weights(rc, self.shard, backend)
            self.shard = None
        elif self.loaded.tensors is None:
            weights = synthetic_shard(self.plan, self.rank, backend)
        else:
            weights = build_weights(rc, shard_tensors(self.plan, self.loaded.tensors, self.rank), backend)
            self.loaded.tensors = None  # the host copy is no longer needed (rank 0's LoadedModel too)
        self.model = CUDAModel(rc, weights, backend)

    def step(self, batch: StepBatch) -> Any:
        """The fused step (CUDA graphs for decode, NCCL calls captured in them): full logits on the GPU, every rank."""
        assert self.model is not None and self.comm is not None
        return self.model.forward_device(batch)


def synthetic_shard(plan: ShardPlan, rank: int, backend: Any, seed: int = 0) -> Any:
    """The rank's share of `llmrs.model.synthetic.gpu_weights(config, seed)`: the same draws in the same order, each full
    matrix sliced as soon as it is drawn, so TP=N holds exactly the weights TP=1 would (greedy tokens can be
    compared) while no GPU ever holds more than its shard plus one full matrix.

    NOTE: keep the draw order in step with gpu_weights (both draw through llmrs.model.synthetic.GpuDraws)."""
    from llmrs.model.decoder import LayerWeights, ModelWeights
    from llmrs.engine.tp import _take_rows, _vocab_rows
    from llmrs.model.synthetic import GpuDraws

    cp = backend.cp
    c = plan.config
    draws = GpuDraws(backend, seed)
    mat, vec = draws.mat, draws.vec

    h, i, D = c.hidden_size, c.intermediate_size, c.head_dim
    n_qkv = c.q_size + 2 * c.kv_size
    q0, q1 = rank * plan.q_heads * D, (rank + 1) * plan.q_heads * D
    s, e = plan.inter_range(rank)
    qkv_rows, gu_rows = plan.qkv_rows(rank), plan.gate_up_rows(rank)
    ones = cp.full((h,), 1.0, dtype=cp.float32)
    layers = []
    for _ in range(c.num_hidden_layers):
        qkv = _take_rows(mat(n_qkv, h), qkv_rows)
        bias = _take_rows(vec(n_qkv), qkv_rows) if c.attention_bias else None
        o = mat(h, c.q_size)[:, q0:q1].copy()
        gate_up = _take_rows(mat(2 * i, h), gu_rows)
        down = mat(h, i)[:, s:e].copy()
        layers.append(LayerWeights(input_norm=ones, qkv=qkv, qkv_bias=bias, o=o, post_norm=ones, gate_up=gate_up,
                                   down=down))
    embed = _vocab_rows(mat(c.vocab_size, h), plan, rank)
    lm_head = embed if c.tie_word_embeddings else _vocab_rows(mat(c.vocab_size, h), plan, rank)
    return ModelWeights(embed=embed, layers=layers, norm=ones, lm_head=lm_head)


def _worker_main(rank: int, world_size: int, conn: Any, spec: str | None, block_size: int,
                 gpu_memory_utilization: float, num_blocks: int | None, max_blocks: int,
                 cuda_graphs: bool | None = None) -> None:
    """Ranks 1..N-1: start-up handshake, then one forward per StepBatch received, until "stop"."""
    multicast_off()
    try:
        r = _Rank(rank, world_size)
        conn.send(("ready", None))
        r.connect(_expect(conn, "nccl"))
        conn.send(("blocks", r.load(spec, None, block_size, gpu_memory_utilization, num_blocks, max_blocks)))
        r.build(_expect(conn, "build"), block_size, cuda_graphs)
        r.cp.cuda.Device().synchronize()
        conn.send(("built", None))
        while True:
            kind, payload = conn.recv()
            if kind == "stop":
                break
            r.step(payload)
        conn.close()
        os._exit(0)  # at once: no wait on a GPU whose collectives rank 0 may have abandoned, no destructors
    except BaseException:
        try:
            conn.send(("error", f"rank {rank}: {traceback.format_exc()}"))
        finally:
            os._exit(1)


def _expect(conn: Any, kind: str) -> Any:
    got, payload = conn.recv()
    if got != kind:
        raise RuntimeError(f"tensor-parallel start-up: expected {kind!r}, got {got!r}")
    return payload


# ---------------------------------------------------------------------------------------------- rank 0
class NcclTPRunner:
    """A ModelRunner stand-in for the engine: rank 0 of N, with N-1 worker processes (ranks 1..N-1)."""

    def __init__(self, loaded: Any, spec: str | None, world_size: int, block_size: int = 16,
                 num_blocks: int | None = None, gpu_memory_utilization: float = 0.9, max_blocks: int = 1 << 30,
                 cuda_graphs: bool | None = None):
        """`cuda_graphs`: every rank's CUDABackend's (None: its default, LLMRS_CUDA_GRAPHS)."""
        check_tp_size(world_size, "cuda")
        ShardPlan(loaded.config, world_size)  # a bad size fails here, before any process starts
        multicast_off()
        self.loaded, self.config, self.block_size = loaded, loaded.config, block_size
        self.max_model_len = self.config.max_position_embeddings
        self.device = f"cuda (tensor parallel x{world_size})"
        self.world_size = world_size
        ctx = mp.get_context("spawn")
        self.conns, self.procs = [], []
        for rank in range(1, world_size):
            parent, child = ctx.Pipe()
            p = ctx.Process(target=_worker_main, name=f"llmrs-tp-rank{rank}", daemon=True,
                            args=(rank, world_size, child, spec, block_size, gpu_memory_utilization, num_blocks,
                                  max_blocks, cuda_graphs))
            p.start()
            self.conns.append(parent)
            self.procs.append(p)
        try:
            self.rank0 = _Rank(0, world_size)
            self._gather("ready", START_TIMEOUT_S)
            uid = new_unique_id()
            for c in self.conns:
                c.send(("nccl", uid))
            self.rank0.connect(uid)  # returns once every rank has joined
            fits = [self.rank0.load(spec, loaded, block_size, gpu_memory_utilization, num_blocks, max_blocks)]
            fits += self._gather("blocks", LOAD_TIMEOUT_S)
            self.num_blocks = min(fits)
            for c in self.conns:
                c.send(("build", self.num_blocks))
            self.rank0.build(self.num_blocks, block_size, cuda_graphs)
            self._gather("built", LOAD_TIMEOUT_S)
        except BaseException:
            self.shutdown()
            raise
        self.backend = self.rank0.model.backend  # type: ignore[union-attr]

    def _gather(self, kind: str, timeout_s: float) -> list[Any]:
        out = []
        for rank, (c, p) in enumerate(zip(self.conns, self.procs), start=1):
            if not c.poll(timeout_s):
                raise RuntimeError(f"tensor-parallel rank {rank} sent no {kind!r} within {timeout_s:.0f}s "
                                   f"(alive: {p.is_alive()})")
            got, payload = c.recv()
            if got == "error":
                raise RuntimeError(f"tensor-parallel worker failed:\n{payload}")
            if got != kind:
                raise RuntimeError(f"tensor-parallel rank {rank}: expected {kind!r}, got {got!r}")
            out.append(payload)
        return out

    def _check_workers(self) -> None:
        for rank, (c, p) in enumerate(zip(self.conns, self.procs), start=1):
            if c.poll():
                got, payload = c.recv()
                raise RuntimeError(f"tensor-parallel rank {rank} stopped ({got}):\n{payload}")
            if not p.is_alive():
                raise RuntimeError(f"tensor-parallel rank {rank} died (exit code {p.exitcode})")

    def forward_device(self, batch: StepBatch) -> Any:
        """Broadcast the step, run rank 0's share: the full logits [S, vocab] on GPU 0."""
        self._check_workers()
        for c in self.conns:  # the broadcast of the step (pickled numpy arrays: a few KB)
            c.send(("step", batch))
        return self.rank0.step(batch)

    def execute(self, batch: StepBatch) -> np.ndarray:
        return self.rank0.cp.asnumpy(self.forward_device(batch)).astype(np.float32, copy=False)

    def execute_and_sample(self, batch: StepBatch, states: list) -> list:
        return self.backend.sample(self.forward_device(batch), states)

    def launch(self, batch: StepBatch, states: list) -> Launched:
        """The step run to the end (tp_engine runs step by step: no `batch.feed`)."""
        assert batch.feed is None, "tensor-parallel runners run step by step"
        return Launched(self.execute_and_sample(batch, states))

    def graph_sets(self) -> tuple:
        """Rank 0's decode / prefill graph sets (every rank captures the same)."""
        return tuple(g for g in (self.backend.graphs, self.backend.prefill_graphs) if g is not None)

    def precapture_graphs(self, max_num_seqs: int, len_cap: int, prefill_tokens: int, pool_blocks: bool) -> int:
        """None ahead of time: each rank captures a graph when its shape first runs, in step with the others."""
        return 0

    def shutdown(self) -> None:
        """Stop the workers (they exit at once), then abort rank 0's communicator. Safe to call twice."""
        for c in self.conns:
            try:
                c.send(("stop", None))
            except (BrokenPipeError, OSError):
                pass
        for p in self.procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
                p.join(timeout=5)
        self.procs, self.conns = [], []
        rank0 = getattr(self, "rank0", None)
        if rank0 is not None and rank0.comm is not None:
            rank0.comm.abort()


# ---------------------------------------------------------------------------------------------- CLI entry points
def tp_runner_for_generate(model: str | None, world_size: int, max_len_hint: int, block_size: int = 16) -> Any:
    """`llmrs generate --tensor-parallel-size N`: the runner stream_generate drives (one sequence)."""
    from llmrs.model.loader import load

    import atexit

    loaded = load(model, read_tensors=False)  # config, tokenizer, stop ids: each rank reads its own tensors
    tokens = min(loaded.config.max_position_embeddings, max_len_hint)
    runner = NcclTPRunner(loaded, model, world_size, block_size=block_size, num_blocks=-(-tokens // block_size))
    atexit.register(runner.shutdown)
    return runner


def tp_async_engine(model: str | None, world_size: int, max_waiting: int | None = None,
                    served_model_name: str | None = None, **engine_options: Any) -> "AsyncEngine":
    """`llmrs serve --tensor-parallel-size N`: AsyncEngine.from_args with a tensor-parallel runner (the weights
    dequantized: every rank slices float tensors)."""
    import atexit
    import dataclasses

    from llmrs.engine.async_engine import AsyncEngine
    from llmrs.engine.llm_engine import max_kv_blocks, serving_config
    from llmrs.model.loader import load
    from llmrs.engine.tp import tp_engine

    cfg = serving_config(**engine_options)
    check_tp_size(world_size, cfg.device)
    cfg = dataclasses.replace(cfg, device="cuda")
    loaded = load(model, read_tensors=False)  # config, tokenizer, stop ids: each rank reads its own tensors
    cap = max_kv_blocks(loaded.config, cfg)

    def make_runner(num_blocks: int | None) -> NcclTPRunner:
        runner = NcclTPRunner(loaded, model, world_size, block_size=cfg.block_size, num_blocks=num_blocks,
                              gpu_memory_utilization=cfg.gpu_memory_utilization, max_blocks=cap)
        atexit.register(runner.shutdown)
        return runner

    engine = tp_engine(loaded, cfg, make_runner)
    return AsyncEngine(engine, max_waiting=max_waiting, model_name=served_model_name)
