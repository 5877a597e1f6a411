"""LLMEngine (schedule -> run -> sample -> update, one `step()`; with async scheduling the next step is planned
and launched before the one in flight is finished) and AsyncEngine (the step loop in one background thread,
handing each request's deltas to its own asyncio stream)."""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import itertools
import os
import queue
import sys
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from llmrs.engine.config import OFF_VALUES, EngineConfig, ModelConfig, async_scheduling_default, env_int
from llmrs.engine.kv_cache import KVCacheManager
from llmrs.model.loader import LoadedModel, load
from llmrs.engine.runner import ModelRunner, resolve_device
from llmrs.engine.sampling import SampleResult, SamplingParams, needs_host_sampler
from llmrs.engine.scheduler import Scheduler
from llmrs.engine.sequence import Sequence, StepOutput
from llmrs.errors import UserError
from llmrs.trace import tr, tr_tokens


class EngineOverloaded(Exception):
    """Too many requests already wait (the server answers 429)."""


class EngineDeadError(RuntimeError):
    """The engine loop (thread or core process) is gone: new requests get a 503, open streams end in an error."""


def check_request(prompt_ids: list[int], params: SamplingParams, vocab_size: int, max_model_len: int,
                  num_blocks: int, block_size: int) -> tuple[list[int], SamplingParams]:
    """Validate a request (raises UserError); returns its prompt as ints and its own copy of the params, with
    max_tokens filled in. Pure, so the API server process can run it without the engine (--engine-process)."""
    params = dataclasses.replace(params)  # the request's own copy: max_tokens may be filled in below
    params.validate()
    prompt_ids = list(map(int, prompt_ids))  # (map, min and max loop in C: ~5 us for 256 ids, not ~40)
    if not prompt_ids:
        raise UserError("the prompt is empty")
    if min(prompt_ids) < 0 or max(prompt_ids) >= vocab_size:
        raise UserError(f"prompt token ids must be in [0, {vocab_size})")
    if any(t >= vocab_size for t in params.stop_token_ids):
        raise UserError(f"stop_token_ids must be in [0, {vocab_size})")
    if any(t >= vocab_size for t in params.logit_bias):
        raise UserError(f"logit_bias keys must be token ids in [0, {vocab_size})")
    if params.max_tokens is None:
        params.max_tokens = max_model_len - len(prompt_ids)
    total = len(prompt_ids) + params.max_tokens
    if len(prompt_ids) >= max_model_len:
        raise UserError(
            f"this model's maximum context length is {max_model_len} tokens; the prompt has {len(prompt_ids)} "
            f"(it must leave room for at least one generated token)"
        )
    if total > max_model_len:
        raise UserError(
            f"this model's maximum context length is {max_model_len} tokens; the request needs {total} "
            f"({len(prompt_ids)} in the prompt, {params.max_tokens} in max_tokens)"
        )
    if -(-total // block_size) > num_blocks:
        raise UserError(
            f"the request needs {total} tokens of KV cache; the cache holds "
            f"{num_blocks * block_size} (raise --kv-cache-tokens)"
        )
    return prompt_ids, params


@dataclass(slots=True)
class RequestOutput:
    """One event on a request's stream: a delta for one choice."""

    request_id: str
    index: int
    text: str
    token_ids: list[int]
    logprobs: list[SampleResult]
    finish_reason: str | None
    num_prompt_tokens: int
    num_output_tokens: int


MERGE_DELTAS = os.environ.get("LLMRS_MERGE_DELTAS", "1").strip().lower() not in OFF_VALUES


def take_merged(pending: Any, q: asyncio.Queue | None = None) -> Any:
    """Pop the oldest of a stream's queued deltas (a deque of RequestOutput or StepOutput, oldest first, after
    everything waiting in its queue `q`; an exception ends it) with every later delta of the same choice merged into
    it, up to and including that choice's last one (text, token ids and logprobs joined; the rest, finish_reason and
    counts, the latest delta's). Other choices' deltas keep their order.

    NOTE: a consumer that finds several deltas queued is behind the engine (a host-bound server: an event-loop pass
    over 256 streams takes longer than a small model's step). Sent one by one they cost an SSE event and a socket
    send each, so it falls further behind; merged, each stream costs one a pass. vLLM's RequestOutputCollector
    merges the same way. A consumer that keeps up finds one delta at a time: nothing changes. LLMRS_MERGE_DELTAS=0
    sends every delta as it came (A/B)."""
    while q is not None and not q.empty():
        pending.append(q.get_nowait())
    item = pending.popleft()
    if isinstance(item, BaseException) or item.finish_reason is not None or not pending or not MERGE_DELTAS:
        return item
    texts, ids, lps = [item.text], list(item.token_ids), list(item.logprobs)
    last, keep = item, []
    while pending:
        other = pending.popleft()
        if isinstance(other, BaseException):
            keep.append(other)
            keep.extend(pending)
            pending.clear()
            break
        if other.index != item.index or last.finish_reason is not None:
            keep.append(other)
            continue
        texts.append(other.text)
        ids += other.token_ids
        lps += other.logprobs
        last = other
    pending.extend(keep)
    if last is item:
        return item
    return dataclasses.replace(last, text="".join(texts), token_ids=ids, logprobs=lps)


@dataclass(slots=True)
class EngineStats:
    num_running: int
    num_waiting: int
    kv_usage: float
    num_free_blocks: int
    num_blocks: int
    prefix_queries: int
    prefix_hits: int
    prompt_tokens_total: int
    generation_tokens_total: int
    computed_tokens_total: int
    num_preemptions: int
    # CUDA graphs (decode and lone-prefill buckets) captured since the start, and the shapes whose capture failed,
    # which then run eagerly and slower (both 0 without graphs: the CPU, --no-graphs)
    graph_captures: int = 0
    graph_capture_failures: int = 0


@dataclass(slots=True)
class RequestResult:
    """Offline result of one request (all its choices)."""

    request_id: str
    prompt_ids: list[int]
    texts: list[str] = field(default_factory=list)
    token_ids: list[list[int]] = field(default_factory=list)
    finish_reasons: list[str | None] = field(default_factory=list)


def warm_up_for_serving(engine: "LLMEngine") -> None:
    """`LLMEngine.warmup` where it pays: an engine on the GPU; LLMRS_WARMUP=0 skips it. Then one line on stderr
    where some of the graphs it captured failed: those step shapes will run eagerly."""
    if getattr(engine.runner, "device", "cpu") == "cuda" and os.environ.get("LLMRS_WARMUP", "1") not in (
            "0", "false", "no", "off"):
        engine.warmup()
        counts = engine._graph_counts()
        if counts["graph_capture_failures"]:
            print(f"llmrs: warning: {counts['graph_capture_failures']} of "
                  f"{counts['graph_capture_failures'] + counts['graph_captures']} CUDA graph captures failed (the "
                  "lines above say why): those step shapes run eagerly, slower", file=sys.stderr)


def serving_config(**options: Any) -> EngineConfig:
    """The EngineConfig of `llmrs serve`'s engine factories (AsyncEngine.from_args, ProcessEngine.from_args,
    tp_nccl.tp_async_engine): their keyword options are EngineConfig's fields, the device `auto` unless given."""
    return EngineConfig(**{"device": "auto", **options})


def serving_engine(model: str | None, config: EngineConfig, keep_quantized: bool | None = None) -> "LLMEngine":
    """The LLMEngine `llmrs serve` runs, in its own process (AsyncEngine) or in the engine core's (ProcessEngine):
    loaded, built and warmed up. keep_quantized None: load()'s reading of LLMRS_KEEP_QUANTIZED."""
    engine = LLMEngine(load(model, keep_quantized=keep_quantized), config)
    if getattr(engine.runner, "device", "cpu") == "cuda" and engine.loaded.tensors is not None:
        # the weights are on the GPU now: the host copy (f32, twice a bf16 checkpoint: ~28 GB for a 7B) would only
        # sit in the serving process's memory (nothing reads it after the upload; ModelRunner refuses it)
        engine.loaded.tensors = None
    warm_up_for_serving(engine)
    return engine


def use_async_scheduling(cfg: EngineConfig, runner: Any) -> bool:
    """EngineConfig.async_scheduling resolved: only runners that can launch a step without waiting for it."""
    if not hasattr(runner, "launch"):
        return False
    if cfg.async_scheduling is not None:
        return cfg.async_scheduling
    return async_scheduling_default(getattr(runner, "device", "cpu"))


def gpu_weight_bytes(loaded: LoadedModel, num_sms: int | None = None) -> int:
    """Bytes the CUDA backend holds for the weights: bf16 matrices, f32 vectors, and a quantized linear's packed
    arrays: for 4-bit, the 4-bit GEMM's reordered copy and the matvec's row-major form where the backend keeps it
    (cuda_q4gemm.row_form_needed, which depends on the GPU's `num_sms`; None counts both everywhere, the upper
    bound). Synthetic models (drawn on the GPU): 2 bytes a parameter (an upper bound for the -awq ones)."""
    from llmrs.backends.cuda import CUDABackend
    from llmrs.backends.cuda_q4gemm import has_gemm_layout, row_form_needed
    from llmrs.model.quant import QuantWeight

    if loaded.tensors is None:
        return 2 * loaded.config.num_parameters()
    gemv = CUDABackend.q4_gemv
    total = 0
    for t in loaded.tensors.values():
        if isinstance(t, QuantWeight):
            copies = 1
            if has_gemm_layout(t.kind, t.N, t.K, t.group_size):
                copies = 1 + int(num_sms is None or row_form_needed(t.N, t.K, num_sms, gemv))
            total += t.nbytes * copies
        else:
            total += (2 if t.ndim == 2 else 4) * int(t.size)
    return total


def kv_blocks(loaded: LoadedModel, cfg: EngineConfig) -> int:
    """KV blocks to allocate: --kv-cache-tokens when given (or on the CPU, 16,384 tokens by default); on the
    GPU, what fits in --gpu-memory-utilization of its memory after the weights (`gpu_weight_bytes`: bf16, or the
    packed bytes of weights kept quantized) and an activation reserve."""
    if cfg.kv_cache_tokens is not None:
        return -(-cfg.kv_cache_tokens // cfg.block_size)
    if resolve_device(cfg.device) != "cuda":
        return -(-16384 // cfg.block_size)
    from llmrs.backends.cuda import CUDABackend

    c = loaded.config
    weight_bytes = gpu_weight_bytes(loaded, CUDABackend.device_sms())
    blocks = CUDABackend.blocks_that_fit(c, weight_bytes, cfg.gpu_memory_utilization, cfg.block_size)
    if blocks < 1:
        raise UserError(f"no room for a KV cache: {weight_bytes / 1e9:.1f} GB of weights at "
                        f"--gpu-memory-utilization {cfg.gpu_memory_utilization}")
    return min(blocks, max_kv_blocks(c, cfg))


def max_kv_blocks(c: ModelConfig, cfg: EngineConfig) -> int:
    """Never more KV blocks than every sequence at full length could use."""
    return -(-(cfg.max_model_len or c.max_position_embeddings) * cfg.max_num_seqs // cfg.block_size)


SERVING_BATCHED_TOKENS_SMALL, SERVING_BATCHED_TOKENS_LARGE = 2048, 8192


def serving_batched_tokens(device: str, memory_bytes: int = 0, gpu_name: str = "") -> int:
    """The default token budget of a step (`--max-num-batched-tokens`) for the device: vLLM's API-server defaults,
    8192 on GPUs of >= 70 GiB except the A100 (where vLLM measured larger steps slower), 2048 elsewhere (CPU
    included). H200, synthetic 7B, 256 requests with new prompts (reports/h200-qwen2.5/session9/call3-5): 8192 gives
    15,414-16,261 output tok/s (4 runs) against 15,094 / 15,466 with 2048 (fewer, larger prefill GEMMs), at 64
    requests TTFT mean 284-314 vs ~187 ms (a stream waits behind larger prefill chunks); one stream unchanged."""
    if device == "cuda" and memory_bytes >= 70 * 2**30 and "a100" not in gpu_name.lower():
        return SERVING_BATCHED_TOKENS_LARGE
    return SERVING_BATCHED_TOKENS_SMALL


def _runner_batched_tokens(runner: Any) -> int:
    """serving_batched_tokens for the GPU the runner's step runs on (its current CUDA device)."""
    device = getattr(runner, "device", "cpu")
    if device != "cuda":
        return serving_batched_tokens(device)
    from llmrs.backends.cuda import gpu_name_memory

    try:
        import cupy as cp

        name, memory = gpu_name_memory(cp, cp.cuda.Device().id)
    except Exception:  # noqa: BLE001 - a runner whose GPUs this process does not see (tensor-parallel workers)
        return serving_batched_tokens("cpu")
    return serving_batched_tokens(device, memory, name)


class LLMEngine:
    def __init__(self, loaded: LoadedModel, config: EngineConfig | None = None, runner: Any = None):
        """`runner` replaces the single-device ModelRunner (tensor parallelism); it owns `num_blocks` KV blocks."""
        self.loaded = loaded
        self.engine_config = cfg = config or EngineConfig()
        self.tokenizer = loaded.tokenizer
        if runner is None:
            runner = ModelRunner(loaded, num_blocks=kv_blocks(loaded, cfg), block_size=cfg.block_size,
                                 device=cfg.device)
        self.runner = runner
        num_blocks = runner.num_blocks
        mpe = loaded.config.max_position_embeddings
        if cfg.max_model_len is not None and not 2 <= cfg.max_model_len <= mpe:
            raise UserError(f"--max-model-len {cfg.max_model_len}: the model's context is {mpe} tokens "
                            f"(give 2..{mpe})")
        self.max_model_len = cfg.max_model_len or mpe
        if cfg.max_num_batched_tokens is None:
            cfg.max_num_batched_tokens = _runner_batched_tokens(runner)
        self.kv = KVCacheManager(num_blocks, cfg.block_size, cfg.enable_prefix_caching)
        self.scheduler = Scheduler(self.kv, cfg.max_num_seqs, cfg.max_num_batched_tokens, self.max_model_len)
        self.requests: dict[str, list[Sequence]] = {}
        self.async_scheduling = use_async_scheduling(cfg, runner)
        self._inflight: tuple[Any, Any] | None = None  # (plan, runner handle) of the step launched ahead
        self._host_sampled: set[str] = set()  # requests whose sampling needs the step before it done
        self.prompt_tokens_total = 0
        self.generation_tokens_total = 0
        self.computed_tokens_total = 0  # tokens actually run through the model (prefix hits excluded)

    @classmethod
    def from_model(cls, model: str | None, **engine_kwargs) -> "LLMEngine":
        return cls(load(model), EngineConfig(**engine_kwargs))

    # ------------------------------------------------------------------ requests
    def make_sequences(self, request_id: str, prompt_ids: list[int], params: SamplingParams) -> list[Sequence]:
        """Validate a request and build its n sequences (raises UserError; changes no engine state)."""
        prompt_ids, params = check_request(prompt_ids, params, self.loaded.config.vocab_size, self.max_model_len,
                                           self.kv.pool.num_blocks, self.kv.block_size)
        stop = self.loaded.stop_token_ids
        return [Sequence(request_id, list(prompt_ids), params, self.tokenizer, stop, self.max_model_len, index=i)
                for i in range(params.n)]

    def add_sequences(self, request_id: str, seqs: list[Sequence]) -> None:
        assert request_id not in self.requests, f"duplicate request id {request_id}"
        self.requests[request_id] = seqs
        if needs_host_sampler(seqs[0].params):
            self._host_sampled.add(request_id)
        self.prompt_tokens_total += len(seqs[0].prompt_ids)
        for s in seqs:
            self.scheduler.add(s)

    def add_request(self, request_id: str, prompt_ids: list[int], params: SamplingParams) -> None:
        self.add_sequences(request_id, self.make_sequences(request_id, prompt_ids, params))

    def abort(self, request_id: str) -> list[StepOutput]:
        """Finish every choice of a request with reason "abort", freeing its blocks now."""
        outs = []
        self._host_sampled.discard(request_id)
        for seq in self.requests.pop(request_id, []):
            if not seq.is_finished:
                seq.finish("abort")
                self.scheduler.finish(seq)
                outs.append(StepOutput(request_id, seq.index, "", [], [], "abort"))
        return outs

    def has_unfinished(self) -> bool:
        return self._inflight is not None or self.scheduler.has_unfinished()

    def warmup(self, prompt_len: int = 256, decode_steps: int = 4) -> float:
        """Run one throwaway request (a prefill of `prompt_len` tokens, then `decode_steps` decodes) before serving,
        so that the first real request does not pay the one-time costs of a step on the GPU (cuBLAS set-up and
        algorithm choice, workspace growth, the first decode graphs): on the H200 the first request's TTFT was 86 ms
        against 13-30 ms for the next ones. Then forget it: blocks free, prefix cache empty, counters zero.
        Returns the seconds it took. Only on an idle engine."""
        assert not self.has_unfinished(), "warm-up of an engine with requests"
        t0 = time.perf_counter()
        n = max(1, min(prompt_len, self.engine_config.max_num_batched_tokens, self.max_model_len - decode_steps - 1,
                       (self.kv.pool.num_blocks - 1) * self.kv.block_size - decode_steps))
        vocab = self.loaded.config.vocab_size
        ids = [1 + (i * 7919) % (vocab - 1) for i in range(n)]  # any ordinary ids: the output is thrown away
        self.add_request("llmrs-warmup", ids, SamplingParams(max_tokens=decode_steps, temperature=0.0,
                                                             ignore_eos=True))
        while self.has_unfinished():
            self.step()
        self.requests.pop("llmrs-warmup", None)
        self.precapture_graphs()
        self.kv.pool.forget_cached()
        self.kv.prefix_queries = self.kv.prefix_hits = 0
        self.prompt_tokens_total = self.generation_tokens_total = self.computed_tokens_total = 0
        self.scheduler.num_preemptions = 0
        return time.perf_counter() - t0

    def precapture_graphs(self) -> int:
        """The decode graphs of every batch bucket up to max_num_seqs at the context caps up to
        LLMRS_WARMUP_GRAPH_CAP (default 512 tokens, within max_model_len; 0: none), captured now (cuda_graphs.py
        DecodeGraphs.precapture); longer contexts capture theirs when they first come. Returns how many."""
        backend = getattr(self.runner, "backend", None)
        graphs = getattr(backend, "graphs", None)
        model = getattr(self.runner, "model", None)
        if graphs is None or model is None:
            return 0
        from llmrs.backends.cuda_graphs import len_cap_for

        cap = min(env_int("LLMRS_WARMUP_GRAPH_CAP", 512), len_cap_for(self.max_model_len))
        if cap <= 0:
            return 0
        n = graphs.precapture(model.w, self.engine_config.max_num_seqs, cap)
        prefill = getattr(backend, "prefill_graphs", None)  # the lone-prefill buckets too (LLMRS_PREFILL_GRAPHS)
        if prefill is not None:
            idle = not self.has_unfinished()  # then its capture batches may use the pool's blocks (distinct slots)
            n += prefill.precapture(model.w, min(self.engine_config.max_num_batched_tokens, self.max_model_len),
                                    pool_blocks=idle)
            if idle:
                self.kv.pool.forget_cached()  # (what the captures wrote into those blocks is no prefix of anything)
        return n

    # ------------------------------------------------------------------ the step
    def step(self) -> list[StepOutput]:
        """Plan a step, run it, sample, apply the tokens; returns the outputs it released.

        With async scheduling the step planned here is launched before the step in flight is finished (its
        decode inputs still in flight are filled in on the device), then that earlier step's tokens are applied
        and its outputs returned: the first call returns [], and the host's work on step n overlaps the GPU's
        on step n+1. Requests whose sampling reads their earlier tokens (penalties, min_tokens, logprobs) make
        the engine finish the step in flight first and then run step by step while they are there."""
        if self.async_scheduling and not self._host_sampled:
            plan = self.scheduler.schedule()
            tr("step_planned")
            launched = None if plan is None else (plan, self.runner.launch(plan.batch, self._states(plan)))
            tr("step_launched")
            outputs = self._finish_inflight()
            self._inflight = launched
            return outputs
        if self._inflight is not None:
            return self._finish_inflight()
        plan = self.scheduler.schedule()
        if plan is None:
            return []
        return self._apply(plan, self.runner.execute_and_sample(plan.batch, self._states(plan)))

    @staticmethod
    def _states(plan: Any) -> list:
        return [s.sampling for s in plan.sample_seqs]

    def _finish_inflight(self) -> list[StepOutput]:
        if self._inflight is None:
            return []
        plan, handle = self._inflight
        self._inflight = None
        return self._apply(plan, handle.wait())

    def _apply(self, plan: Any, results: list[SampleResult]) -> list[StepOutput]:
        outputs = self.scheduler.update(plan, results)
        self.computed_tokens_total += plan.batch.num_tokens
        self.generation_tokens_total += len(outputs)
        for o in outputs:
            if o.finish_reason is not None and all(s.is_finished for s in self.requests.get(o.request_id, [])):
                self.requests.pop(o.request_id, None)
                self._host_sampled.discard(o.request_id)
        return outputs

    def stats(self) -> EngineStats:
        return EngineStats(
            num_running=len(self.scheduler.running), num_waiting=len(self.scheduler.waiting),
            kv_usage=self.kv.usage(), num_free_blocks=self.kv.num_free_blocks, num_blocks=self.kv.pool.num_blocks,
            prefix_queries=self.kv.prefix_queries, prefix_hits=self.kv.prefix_hits,
            prompt_tokens_total=self.prompt_tokens_total, generation_tokens_total=self.generation_tokens_total,
            computed_tokens_total=self.computed_tokens_total, num_preemptions=self.scheduler.num_preemptions,
            **self._graph_counts(),
        )

    def _graph_counts(self) -> dict[str, int]:
        """EngineStats' graph_captures and graph_capture_failures, over the backend's decode and prefill graphs."""
        backend = getattr(self.runner, "backend", None)
        sets = [g for g in (getattr(backend, "graphs", None), getattr(backend, "prefill_graphs", None))
                if g is not None]
        return {"graph_captures": sum(g.captures for g in sets),
                "graph_capture_failures": sum(len(g.failed) for g in sets)}

    # ------------------------------------------------------------------ offline
    def generate(self, prompts: list[list[int] | str], params: SamplingParams | list[SamplingParams]
                 ) -> list[RequestResult]:
        """Run a list of prompts to completion, batched; results in input order."""
        plist = params if isinstance(params, list) else [params] * len(prompts)
        results: dict[str, RequestResult] = {}
        order = []
        for i, (p, sp) in enumerate(zip(prompts, plist)):
            ids = self.tokenizer.encode(p) if isinstance(p, str) else list(p)
            rid = f"gen-{i}"
            self.add_request(rid, ids, sp)
            results[rid] = RequestResult(rid, ids, [""] * sp.n, [[] for _ in range(sp.n)], [None] * sp.n)
            order.append(rid)
        while self.has_unfinished():
            for o in self.step():
                r = results[o.request_id]
                r.texts[o.index] += o.text
                r.token_ids[o.index] += o.token_ids
                r.finish_reasons[o.index] = o.finish_reason
        return [results[r] for r in order]


def _put_all(items: list[tuple[asyncio.Queue, Any]]) -> None:
    for q, item in items:
        q.put_nowait(item)


class AsyncEngine:
    """The engine loop in one background thread; each request's deltas go to its own asyncio queue."""

    def __init__(self, engine: LLMEngine, max_waiting: int | None = None, model_name: str | None = None):
        self.engine = engine
        self.tokenizer = engine.tokenizer
        self.config = engine.loaded.config
        self.max_model_len = engine.max_model_len
        self.max_num_batched_tokens = engine.engine_config.max_num_batched_tokens
        self.block_size = engine.engine_config.block_size
        self.kv_cache_tokens = engine.kv.pool.num_blocks * self.block_size
        self.model_name = model_name or engine.loaded.source.name
        self.max_waiting = max_waiting
        self._commands: queue.SimpleQueue = queue.SimpleQueue()
        self._wake = threading.Event()
        self._streams: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Queue]] = {}
        self._stats = engine.stats()
        self._stop = False
        self._thread: threading.Thread | None = None
        self._ids = itertools.count()
        self.error: BaseException | None = None

    @classmethod
    def from_args(cls, model: str | None, max_waiting: int | None = None, served_model_name: str | None = None,
                  **engine_options: Any) -> "AsyncEngine":
        """`engine_options`: EngineConfig's fields (serving_config)."""
        engine = serving_engine(model, serving_config(**engine_options))
        return cls(engine, max_waiting=max_waiting, model_name=served_model_name)

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        assert self._thread is None
        self._thread = threading.Thread(target=self._loop, name="llmrs-engine", daemon=True)
        self._thread.start()

    async def shutdown(self, abort_running: bool = True) -> None:
        if abort_running:
            for rid in list(self._streams):
                await self.abort(rid)
        else:
            while self._streams:
                await asyncio.sleep(0.01)
        self._stop = True
        self._wake.set()
        if self._thread is not None:
            await asyncio.get_running_loop().run_in_executor(None, self._thread.join)

    def stats(self) -> EngineStats:
        return self._stats

    @property
    def device(self) -> str:
        return self.engine.runner.device

    @property
    def async_scheduling(self) -> bool:
        return self.engine.async_scheduling

    # ------------------------------------------------------------------ requests
    def add_request(self, request_id: str | None, prompt_ids: list[int], params: SamplingParams
                    ) -> AsyncIterator[RequestOutput]:
        """Validate and queue a request; returns its stream (raises UserError / EngineOverloaded at once)."""
        if self.error is not None:
            raise EngineDeadError(f"engine loop died: {self.error}")
        request_id = request_id or f"req-{next(self._ids)}"
        if request_id in self._streams:
            raise UserError(f"duplicate request id {request_id}")
        if self.max_waiting is not None and self._stats.num_waiting + self._commands.qsize() >= self.max_waiting:
            raise EngineOverloaded(f"{self._stats.num_waiting} requests already wait (--max-waiting {self.max_waiting})")
        seqs = self.engine.make_sequences(request_id, prompt_ids, params)  # pure: safe off the engine thread
        q: asyncio.Queue = asyncio.Queue()
        self._streams[request_id] = (asyncio.get_running_loop(), q)
        self._commands.put(("add", request_id, seqs))
        tr("cmd_sent")
        self._wake.set()
        return self._stream(request_id, q, len(seqs), len(prompt_ids))

    async def _stream(self, request_id: str, q: asyncio.Queue, n: int, n_prompt: int
                      ) -> AsyncIterator[RequestOutput]:
        finished = 0
        counts = [0] * n
        pending: collections.deque = collections.deque()
        try:
            while finished < n:
                if not pending:
                    pending.append(await q.get())
                item = take_merged(pending, q)  # with everything queued meanwhile, merged per choice
                if isinstance(item, BaseException):
                    raise item
                counts[item.index] += len(item.token_ids)
                if item.finish_reason is not None:
                    finished += 1
                yield RequestOutput(request_id, item.index, item.text, item.token_ids, item.logprobs,
                                    item.finish_reason, n_prompt, counts[item.index])
        finally:
            if finished < n:  # the consumer went away (client disconnect, cancellation): abort now
                self._commands.put(("abort", request_id, None))
                self._wake.set()
            self._streams.pop(request_id, None)

    async def abort(self, request_id: str) -> None:
        self._commands.put(("abort", request_id, None))
        self._wake.set()

    # ------------------------------------------------------------------ the loop (engine thread)
    def _deliver(self, outputs: list[StepOutput]) -> None:
        """Hand a step's outputs to their streams: one thread-safe call per event loop, not one per output.

        NOTE: each `call_soon_threadsafe` writes to the loop's self-pipe (a syscall, taken under the GIL); at 256
        streams that was milliseconds per step."""
        by_loop: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Queue, StepOutput]]] = {}
        streams = self._streams
        for o in outputs:
            target = streams.get(o.request_id)
            if target is not None:
                loop, q = target
                items = by_loop.get(loop)
                if items is None:
                    items = by_loop[loop] = []
                items.append((q, o))
        for loop, items in by_loop.items():
            loop.call_soon_threadsafe(_put_all, items)

    def _drain_commands(self) -> None:
        while True:
            try:
                cmd, rid, payload = self._commands.get_nowait()
            except queue.Empty:
                return
            if cmd == "add":
                if rid in self._streams:  # not aborted before it arrived
                    self.engine.add_sequences(rid, payload)
            else:
                self._deliver(self.engine.abort(rid))
                self._streams.pop(rid, None)  # its queue already holds the abort; a never-read stream is dropped

    def _loop(self) -> None:
        try:
            while True:
                self._drain_commands()  # also after a stop: queued aborts are delivered before the loop ends
                if self._stop:
                    break
                if self.engine.has_unfinished():
                    t0 = time.perf_counter()
                    tr("core_step")
                    outputs = self.engine.step()
                    tr_tokens(outputs)
                    self._stats = self.engine.stats()
                    self._deliver(outputs)
                    self.last_step_s = time.perf_counter() - t0
                else:
                    self._stats = self.engine.stats()
                    self._wake.wait(timeout=0.1)
                    self._wake.clear()
        except BaseException as e:  # a bug, not a user error: fail every open stream loudly
            self.error = e
            for loop, q in list(self._streams.values()):
                loop.call_soon_threadsafe(q.put_nowait, EngineDeadError(f"engine loop failed: {e!r}"))
            raise
