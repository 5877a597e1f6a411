"""LLMEngine: schedule -> run -> sample -> update, one `step()`. With async scheduling the next step is planned
and launched before the one in flight is finished. Also the serving helpers that size and build the engine
`llmrs serve` runs (KV blocks, the step's token budget, warm-up)."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import sys
import time
from dataclasses import dataclass, field
from collections.abc import Callable, Iterator
from typing import Any, Protocol

from llmrs import envs
from llmrs.backends.base import StepHandle
from llmrs.engine.batch import StepBatch
from llmrs.engine.config import EngineConfig, ModelConfig, async_scheduling_default
from llmrs.engine.kv_cache import KVCacheManager
from llmrs.engine.protocol import EngineStats
from llmrs.engine.runner import ModelRunner, resolve_device
from llmrs.engine.sampling import SampleResult, SamplingParams, needs_host_sampler
from llmrs.engine.scheduler import Scheduler
from llmrs.engine.sequence import WAITING, Sequence, StepOutput
from llmrs.errors import UserError
from llmrs.model.loader import LoadedModel, load
from llmrs.trace import tr

log = logging.getLogger("llmrs.engine")


class Runner(Protocol):
    """What LLMEngine drives: ModelRunner (one device) or a tensor-parallel runner. It owns `num_blocks` KV blocks."""

    device: str  # "cuda" for one GPU (async scheduling's default), "cpu", or a description of several devices
    num_blocks: int

    def launch(self, batch: StepBatch, states: list) -> StepHandle:
        """Start a step and its sampling; `batch.feed` rows take their tokens from the step launched before."""
        ...

    def execute_and_sample(self, batch: StepBatch, states: list) -> list[SampleResult]:
        """Run a step and sample it, to the end."""
        ...

    # The three below have defaults for a runner without CUDA graphs or processes of its own (a subclass of Runner,
    # as test and tool stand-ins are, inherits them).
    def graph_sets(self) -> tuple:
        """The CUDA graph sets whose captures and failures EngineStats counts (() where there are none)."""
        return ()

    def precapture_graphs(self, max_num_seqs: int, len_cap: int, prefill_tokens: int, pool_blocks: bool) -> int:
        """Capture the decode / lone-prefill graphs now; returns how many (0 where the runner has none)."""
        return 0

    def shutdown(self) -> None:
        """Stop what the runner started (worker processes, communicators); safe to call twice."""
        return None


# the decode graphs captured at warm-up cover contexts up to this many tokens (within max_model_len); longer
# contexts capture theirs when they first come
WARMUP_GRAPH_CAP = 512


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
    if engine.runner.device == "cuda" and envs.LLMRS_WARMUP:
        report_progress("warming up: kernels, CUDA graphs")
        engine.warmup()
        counts = engine._graph_counts()
        if counts["graph_capture_failures"]:
            print(f"llmrs: warning: {counts['graph_capture_failures']} of "
                  f"{counts['graph_capture_failures'] + counts['graph_captures']} CUDA graph captures failed (the "
                  "lines above say why): those step shapes run eagerly, slower", file=sys.stderr)


# where start-up phases go (`progress_to`): `llmrs serve`'s status line; in an engine core process, the pipe to the
# server (core_client), whose reader reports them again on the server's side
_progress_sinks: list[Callable[[str], None]] = []


@contextlib.contextmanager
def progress_to(sink: Callable[[str], None]) -> Iterator[None]:
    """Within the block, `report_progress(phase)` calls `sink(phase)`."""
    _progress_sinks.append(sink)
    try:
        yield
    finally:
        _progress_sinks.remove(sink)


def report_progress(phase: str) -> None:
    """A start-up phase begins (serving_engine's, or one an engine core reported)."""
    for sink in list(_progress_sinks):
        sink(phase)


def serving_config(**options: Any) -> EngineConfig:
    """The EngineConfig of `llmrs serve`'s engine factories (AsyncEngine.from_args, ProcessEngine.from_args,
    tp_nccl.tp_async_engine): their keyword options are EngineConfig's fields, the device `auto` unless given."""
    return EngineConfig(**{"device": "auto", **options})


def serving_engine(model: str | None, config: EngineConfig, keep_quantized: bool = False) -> "LLMEngine":
    """The LLMEngine `llmrs serve` runs, in its own process (AsyncEngine) or in the engine core's (ProcessEngine):
    loaded (quantized linears kept packed with `keep_quantized`), built and warmed up."""
    report_progress("reading the model")
    loaded = load(model, keep_quantized=keep_quantized)
    report_progress("building the engine: weights to the device, KV cache")
    engine = LLMEngine(loaded, config)
    if engine.runner.device == "cpu" and config.cpu_threads is not None:
        from llmrs.backends.cpu import limit_threads

        limit_threads(config.cpu_threads)
    if engine.runner.device == "cuda" and engine.loaded.tensors is not None:
        # the weights are on the GPU now: the host copy (f32, twice a bf16 checkpoint: ~28 GB for a 7B) would only
        # sit in the serving process's memory (nothing reads it after the upload; ModelRunner refuses it)
        engine.loaded.tensors = None
    warm_up_for_serving(engine)
    return engine


def use_async_scheduling(cfg: EngineConfig, runner: Runner) -> bool:
    """EngineConfig.async_scheduling resolved: by default on when the model runs on one GPU."""
    if cfg.async_scheduling is not None:
        return cfg.async_scheduling
    return async_scheduling_default(runner.device)


def gpu_weight_bytes(loaded: LoadedModel, num_sms: int | None = None) -> int:
    """Bytes the CUDA backend holds for the weights: bf16 matrices, f32 vectors, and a quantized linear's packed
    arrays: for 4-bit, the 4-bit GEMM's reordered copy and the matvec's row-major form where the backend keeps it
    (quant_linear.row_form_needed, which depends on the GPU's `num_sms`; None counts both everywhere, the upper
    bound). Synthetic models (drawn on the GPU): 2 bytes a parameter (an upper bound for the -awq ones)."""
    from llmrs.backends.cuda import CudaOptions
    from llmrs.backends.cuda.quant_linear import has_gemm_layout, row_form_needed
    from llmrs.model.quant import QuantWeight

    if loaded.tensors is None:
        return 2 * loaded.config.num_parameters()
    gemv = CudaOptions().q4_gemv
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
    included). On the H200 (synthetic 7B, 256 requests with new prompts) 8192 gives 2-5% more output tok/s than 2048
    (fewer, larger prefill GEMMs), at the cost of a longer TTFT at 64 requests (a stream waits behind larger prefill
    chunks); one stream is unchanged."""
    if device == "cuda" and memory_bytes >= 70 * 2**30 and "a100" not in gpu_name.lower():
        return SERVING_BATCHED_TOKENS_LARGE
    return SERVING_BATCHED_TOKENS_SMALL


def _runner_batched_tokens(runner: Runner) -> int:
    """serving_batched_tokens for the GPU the runner's step runs on (its current CUDA device)."""
    device = runner.device
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
    def __init__(self, loaded: LoadedModel, config: EngineConfig | None = None, runner: Runner | None = None):
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

    def drop_started(self) -> list[str]:
        """After a step raised (engine/recovery.py): forget the step launched ahead (its results will never be
        applied) and finish every request that had started (scheduled and still running, or with outputs) with
        reason "abort", its blocks freed; returns their ids. Requests still waiting, never computed, stay queued
        for the next step."""
        self._inflight = None
        started = self.started_requests()
        for rid in started:
            self.abort(rid)
        return started

    def started_requests(self) -> list[str]:
        """The requests that have started: scheduled (running, or with a step in flight) or with outputs. The
        others wait, never computed (or preempted before any output): nothing of them has reached a client."""
        return [rid for rid, seqs in self.requests.items()
                if any(s.status is not WAITING or s.output_ids or s.num_computed_tokens or s.num_pending
                       for s in seqs)]

    def has_unfinished(self) -> bool:
        return self._inflight is not None or self.scheduler.has_unfinished()

    def warmup(self, prompt_len: int = 256, decode_steps: int = 4) -> float:
        """Run one throwaway request (a prefill of `prompt_len` tokens, then `decode_steps` decodes) before serving,
        so that the first real request does not pay the one-time costs of a step on the GPU (cuBLAS set-up and
        algorithm choice, workspace growth, the first decode graphs; on the H200 the first request's TTFT is
        several times the next ones' without it). Then forget it: blocks free, prefix cache empty, counters zero.
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
        WARMUP_GRAPH_CAP tokens (within max_model_len), captured now (DecodeGraphs.precapture); longer contexts
        capture theirs when they first come. Returns how many."""
        if not self.runner.graph_sets():
            return 0
        from llmrs.backends.cuda.graphs import len_cap_for

        cap = min(WARMUP_GRAPH_CAP, len_cap_for(self.max_model_len))
        if cap <= 0:
            return 0
        idle = not self.has_unfinished()  # then the prefill captures may use the pool's blocks (distinct slots)
        n = self.runner.precapture_graphs(self.engine_config.max_num_seqs, cap,
                                          min(self.engine_config.max_num_batched_tokens, self.max_model_len), idle)
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
        """Apply a step's samples. A sequence that failed (Sequence.append: an unsamplable row, an exception while
        processing its token) fails its request's other choices too (`_fail_request`): fault isolation, the others
        go on."""
        outputs = self.scheduler.update(plan, results)
        self.computed_tokens_total += plan.batch.num_tokens
        self.generation_tokens_total += len(outputs)
        failed: list[StepOutput] = []
        for o in outputs:
            if o.finish_reason is not None:
                if o.error is not None:  # (its output carries no token)
                    self.generation_tokens_total -= 1
                    failed += self._fail_request(o.request_id, o.error)
                if all(s.is_finished for s in self.requests.get(o.request_id, [])):
                    self.requests.pop(o.request_id, None)
                    self._host_sampled.discard(o.request_id)
        if failed:
            outputs += failed
        return outputs

    def _fail_request(self, request_id: str, message: str) -> list[StepOutput]:
        """Finish a request's choices still running with reason "error" and `message`, freeing their blocks now."""
        seqs = self.requests.get(request_id, [])
        if seqs:
            log.warning("request %s failed: %s", request_id, message)
        outs = []
        for seq in seqs:
            if not seq.is_finished:
                outs.append(seq.fail(message))
                self.scheduler.finish(seq)
        return outs

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
        sets = self.runner.graph_sets()
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
