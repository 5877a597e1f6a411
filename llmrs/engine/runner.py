"""ModelRunner: a loaded model on a backend with its KV memory; executes StepBatches.

`stream_generate` is the single-sequence path of `llmrs generate` / `llmrs chat`: one sequence, blocks
handed out in order, every step a StepBatch like the scheduler's (a prefill step, then one-token steps).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from llmrs.backends.base import Launched, StepHandle
from llmrs.engine.batch import StepBatch, build_step_batch
from llmrs.engine.config import async_scheduling_default
from llmrs.model.loader import LoadedModel
from llmrs.model.decoder import Model, build_weights
from llmrs.engine.sampling import SamplingParams, needs_host_sampler, sample
from llmrs.engine.sequence import Sequence, StepOutput
from llmrs.errors import UserError


def resolve_device(device: str) -> str:
    """'cpu' or 'cuda': `auto` picks CUDA when CuPy and a GPU are there; `cuda` without them is a UserError."""
    if device not in ("auto", "cpu", "cuda"):
        raise UserError(f"unknown device {device!r} (choose auto, cpu or cuda)")
    if device == "cpu":
        return "cpu"
    from llmrs.backends.cuda import cuda_available

    ok, why = cuda_available()
    if device == "cuda" and not ok:
        raise UserError(f"--device cuda: {why}")
    return "cuda" if ok else "cpu"


class ModelRunner:
    def __init__(self, loaded: LoadedModel, num_blocks: int, block_size: int = 16, device: str = "cpu"):
        self.loaded = loaded
        self.config = loaded.config
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.device = resolve_device(device)
        if loaded.tensors is None and loaded.source.kind != "synthetic":  # (serving_engine releases them)
            raise UserError(f"{loaded.source.name}: this LoadedModel's host weights were released once uploaded to "
                            "the GPU; load the model again")
        if loaded.tensors is None and self.device != "cuda":
            raise UserError(f"{loaded.source.name}: synthetic weights are drawn on the GPU; use --device cuda")
        if self.device == "cuda":
            from llmrs.backends.cuda import CUDABackend, CUDAModel

            self.backend = CUDABackend(self.config, num_blocks=num_blocks, block_size=block_size)
            if loaded.tensors is None:
                from llmrs.model.synthetic import synthetic_weights

                weights = synthetic_weights(loaded, self.backend)  # drawn on the GPU (AWQ: packed 4-bit linears)
            else:
                weights = build_weights(self.config, loaded.tensors, self.backend)
            self.model = CUDAModel(self.config, weights, self.backend)
        else:
            from llmrs.backends.cpu import CPUBackend

            self.backend = CPUBackend(self.config, num_blocks=num_blocks, block_size=block_size)
            self.model = Model(self.config, build_weights(self.config, loaded.tensors, self.backend), self.backend)
        self.max_model_len = self.config.max_position_embeddings
        self._last_tokens = np.zeros(0, dtype=np.int32)  # the CPU's last samples (what `feed` rows read)

    def execute(self, batch: StepBatch) -> np.ndarray:
        """Run one step; returns the logits of batch.sample_rows as float32 [S, vocab]."""
        return self.model.forward(batch)

    def execute_and_sample(self, batch: StepBatch, states: list) -> list:
        """Run one step and sample each of `states` (in sample_rows order): on the GPU in one launch when the
        backend can (logits never leave the device), else with the CPU sampler."""
        return self.launch(batch, states).wait()

    def launch(self, batch: StepBatch, states: list) -> StepHandle:
        """Start one step and its sampling; `.wait()` on the result gives the SampleResults. On the GPU this
        returns once the work is queued, so the caller can plan the next step meanwhile; that step's
        `batch.feed` rows take their tokens from this step's samples (on the device). The CPU runs it here."""
        if self.device == "cuda":
            return self.backend.sample_launch(self.model.forward_device(batch), states)
        if batch.feed is not None:
            fed = batch.feed >= 0
            batch.token_ids = batch.token_ids.copy()
            batch.token_ids[fed] = self._last_tokens[batch.feed[fed]]
        results = sample(self.execute(batch), states)
        self._last_tokens = np.fromiter((r.token_id for r in results), dtype=np.int32, count=len(results))
        return Launched(results)

    def graph_sets(self) -> tuple:
        """The backend's CUDA graph sets (decode, then lone prefills) that exist: none on the CPU, or with
        LLMRS_CUDA_GRAPHS=0."""
        return tuple(g for g in (self.backend.graphs, self.backend.prefill_graphs) if g is not None)

    def precapture_graphs(self, max_num_seqs: int, len_cap: int, prefill_tokens: int, pool_blocks: bool) -> int:
        """Capture now the decode graphs of every batch bucket up to max_num_seqs at the context caps up to
        len_cap, and the lone-prefill buckets up to prefill_tokens (their capture batches may use the pool's blocks
        when `pool_blocks`: nothing runs). Returns how many; 0 without graphs."""
        if self.backend.graphs is None:
            return 0
        n = self.backend.graphs.precapture(self.model.w, max_num_seqs, len_cap)
        if self.backend.prefill_graphs is not None:
            n += self.backend.prefill_graphs.precapture(self.model.w, prefill_tokens, pool_blocks=pool_blocks)
        return n

    def shutdown(self) -> None:
        """Nothing to stop: one process, its memory freed with it."""


@dataclass(slots=True)
class GenerationStats:
    prompt_tokens: int = 0
    output_tokens: int = 0
    prefill_s: float = 0.0
    decode_s: float = 0.0

    @property
    def decode_tok_s(self) -> float:
        n = self.output_tokens - 1
        return n / self.decode_s if n > 0 and self.decode_s > 0 else 0.0


def check_prompt_fits(prompt_len: int, max_model_len: int) -> None:
    if prompt_len == 0:
        raise UserError("the prompt is empty")
    if prompt_len >= max_model_len:
        raise UserError(f"the prompt is {prompt_len} tokens; the model's context is {max_model_len} tokens")


def stream_generate(
    runner: ModelRunner, prompt_ids: list[int], params: SamplingParams, stats: GenerationStats | None = None,
    run_ahead: bool | None = None,
) -> Iterator[StepOutput]:
    """Generate for one prompt, yielding a StepOutput (text delta + token) per sampled token. `run_ahead`
    (default: on a GPU, unless the sampling needs the host sampler) launches each step before the previous
    step's token is back."""
    params.validate()
    check_prompt_fits(len(prompt_ids), runner.max_model_len)
    bs = runner.block_size
    max_len = min(runner.max_model_len, len(prompt_ids) + (params.max_tokens or runner.max_model_len))
    blocks_needed = -(-max_len // bs)
    if blocks_needed > runner.num_blocks:
        raise UserError(f"{max_len} tokens need {blocks_needed} KV blocks; the cache has {runner.num_blocks}")
    tok = runner.loaded.tokenizer
    seq = Sequence("gen-0", list(prompt_ids), params, tok, runner.loaded.stop_token_ids, runner.max_model_len)
    table = list(range(blocks_needed))
    stats = stats if stats is not None else GenerationStats()
    stats.prompt_tokens = len(prompt_ids)
    if run_ahead is None:
        run_ahead = not needs_host_sampler(params) and async_scheduling_default(runner.device)
    if run_ahead:
        yield from _run_ahead(runner, seq, table, max_len - len(prompt_ids), stats)
        return
    new_tokens, cached = list(prompt_ids), 0
    while True:
        t0 = time.perf_counter()
        batch = build_step_batch([(new_tokens, cached, table, True)], bs)
        result = runner.execute_and_sample(batch, [seq.sampling])[0]
        dt = time.perf_counter() - t0
        if cached == 0:
            stats.prefill_s += dt
        else:
            stats.decode_s += dt
        cached += len(new_tokens)
        out = seq.append(result)
        stats.output_tokens += 1
        yield out
        if seq.is_finished:
            return
        new_tokens = [result.token_id]


def _run_ahead(runner: ModelRunner, seq: Sequence, table: list[int], max_outputs: int,
               stats: GenerationStats) -> Iterator[StepOutput]:
    """stream_generate's loop with the next step launched before this one's token is back: its input is that
    token, put in place on the device (StepBatch.feed), so the host's work (detokenizing, the caller's printing)
    overlaps the GPU's. Stopping on a stop token wastes the one step already launched."""
    bs = runner.block_size
    t0 = time.perf_counter()
    cached = len(seq.prompt_ids)
    step = runner.launch(build_step_batch([(list(seq.prompt_ids), 0, table, True)], bs), [seq.sampling])
    launched = 1
    t_first = None
    while True:
        ahead = None
        if launched < max_outputs:
            batch = build_step_batch([([0], cached, table, True)], bs)
            batch.feed = np.zeros(1, dtype=np.int32)  # the token of the step in flight
            ahead = runner.launch(batch, [seq.sampling])
            cached += 1
            launched += 1
        result = step.wait()[0]
        now = time.perf_counter()
        if t_first is None:
            t_first = now
            stats.prefill_s = now - t0
        else:
            stats.decode_s = now - t_first
        out = seq.append(result)
        stats.output_tokens += 1
        yield out
        if seq.is_finished:
            if ahead is not None:
                ahead.wait()  # the extra step's read-back buffer is free again
            return
        step = ahead
