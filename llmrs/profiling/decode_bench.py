"""`llmrs synth --decode-bench`: single-stream decode of a synthetic preset on the CUDA backend, as a fraction of
the bandwidth floor. The weights are drawn on the GPU (llmrs.model.synthetic.gpu_weights): no files, no download.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import numpy as np

from llmrs.engine.batch import build_step_batch
from llmrs.engine.config import ModelConfig
from llmrs.engine.sampling import SamplingParams, SamplingState, make_generator
from llmrs.model.presets import preset_config
from llmrs.model.synthetic import gpu_weights
from llmrs.roofline.cost import ModelCost
from llmrs.roofline.formats import get_format
from llmrs.roofline.gpus import GpuSpec, match_gpu_name


@dataclasses.dataclass
class SingleStream:
    """A synthetic preset on the GPU with one sequence's prompt prefilled (`single_stream`)."""

    config: ModelConfig
    backend: Any
    model: Any
    table: list[int]  # the sequence's block table (every block of the cache)
    state: Any  # its greedy SamplingState
    bs: int  # block size
    tok: int  # the token sampled after the prompt
    build_s: float  # seconds to draw the weights on the GPU
    prefill_s: float  # seconds of the prompt's (eager) prefill and its sample


def single_stream(preset: str, prompt_len: int, decode_tokens: int, quant: str | None = None,
                  group_size: int = 128) -> SingleStream:
    """The CUDA backend and synthetic weights of `preset`, a KV cache for one sequence of prompt_len +
    decode_tokens tokens, and a random prompt (seed 0) prefilled and sampled greedily: the set-up of the
    single-stream decode bench and of probes/ablate_decode.py."""
    from llmrs.backends.cuda import CUDABackend, CUDAModel

    c = preset_config(preset)
    bs = 16
    blocks = -(-(prompt_len + decode_tokens) // bs)
    backend = CUDABackend(c, num_blocks=blocks, block_size=bs)
    t0 = time.perf_counter()
    model = CUDAModel(c, gpu_weights(c, backend, quant=quant, group_size=group_size), backend)
    backend.synchronize()
    build_s = time.perf_counter() - t0
    table = list(range(blocks))
    prompt = np.random.default_rng(0).integers(0, c.vocab_size, prompt_len).tolist()
    state = SamplingState(SamplingParams(temperature=0.0), make_generator(0), prompt, [], [])
    t0 = time.perf_counter()
    logits = model.forward_device(build_step_batch([(prompt, 0, table, True)], bs))
    tok = backend.sample(logits, [state])[0].token_id
    return SingleStream(c, backend, model, table, state, bs, tok, build_s, time.perf_counter() - t0)


def run_ahead_intervals(model: Any, backend: Any, state: Any, prompt_len: int, table: list[int], bs: int,
                        warmup: int, steps: int) -> list[float]:
    """Seconds between consecutive tokens of `steps` single-stream decode steps after `warmup`, the engine's way
    (async scheduling, stream_generate's run-ahead): each step is launched before the previous step's token is
    back, its input fed on the device; positions prompt_len on (the same KV reads each call)."""
    feed = np.zeros(1, dtype=np.int32)
    cached, prev, times = prompt_len, None, []
    pending = None
    for k in range(warmup + steps + 1):
        batch = build_step_batch([([0], cached, table, True)], bs)
        batch.feed = feed
        nxt = backend.sample_launch(model.forward_device(batch), [state])
        cached += 1
        if pending is not None:
            pending.wait()
            now = time.perf_counter()
            if prev is not None and k > warmup:
                times.append(now - prev)
            prev = now
        pending = nxt
    pending.wait()
    return times


def this_gpu() -> tuple[str, int]:
    """(name, memory in bytes) of the GPU the benchmark runs on (device 0)."""
    import cupy as cp

    from llmrs.backends.cuda.backend import gpu_name_memory

    return gpu_name_memory(cp)


def datasheet_gpu(name: str, memory_bytes: int) -> GpuSpec | None:
    """The GPU database's entry for the GPU CUDA calls `name` (its memory breaks ties between variants), or None
    for a GPU the database does not hold."""
    return match_gpu_name(name, memory_gb=memory_bytes / 1e9)


def decode_benchmark(preset: str, prompt_len: int = 128, steps: int = 128, warmup: int = 8,
                     bandwidth_gbs: float | None = None, quant: str | None = None,
                     group_size: int = 128) -> dict[str, Any]:
    """Single-stream greedy decode of a synthetic `preset` on the GPU: ms/token against the bandwidth floor
    (bytes a batch-1 step must read: every streamed weight + the KV read at the mean context, from the
    roofline cost model). `ms_per_token`: the median interval between tokens with each step launched before the
    previous token is back (how the engine decodes, async scheduling); `ms_per_token_sync`: the median step
    when the host waits for each token before launching the next.

    Two floors: at `bandwidth_gbs` (measured) and at the datasheet bandwidth of the GPU it ran on (the GPU
    database's entry for its name; absent, with `datasheet_gpu` None, for a GPU the database does not hold)."""
    ss = single_stream(preset, prompt_len, warmup + steps + 1, quant, group_size)
    gpu_name, gpu_memory = this_gpu()
    spec = datasheet_gpu(gpu_name, gpu_memory)
    c, backend, model, table, state, bs, tok = ss.config, ss.backend, ss.model, ss.table, ss.state, ss.bs, ss.tok
    build_s, prefill_s = ss.build_s, ss.prefill_s
    cached = prompt_len
    times = []
    for k in range(warmup + steps):
        t = time.perf_counter()
        logits = model.forward_device(build_step_batch([([tok], cached, table, True)], bs))
        tok = backend.sample(logits, [state])[0].token_id  # a device->host copy: the step is finished
        if k >= warmup:
            times.append(time.perf_counter() - t)
        cached += 1
    ms_sync = 1000 * float(np.median(times))
    ahead_times = run_ahead_intervals(model, backend, state, prompt_len, table, bs, warmup, steps)
    ms = 1000 * float(np.median(ahead_times))
    mean_ctx = prompt_len + warmup + steps // 2
    fmt = get_format("bf16" if quant is None else "awq")
    if quant is not None and group_size != 128:
        fmt = dataclasses.replace(fmt, bits_per_weight=4 + 32 / group_size)
    cost = ModelCost.build(c, fmt).decode_step(1, mean_ctx)
    out = {"preset": preset, "weights": quant or "bf16", "prompt_len": prompt_len, "steps": steps, "ms_per_token": round(ms, 4),
           "tok_s": round(1000 / ms, 1), "ms_mean": round(1000 * float(np.mean(ahead_times)), 4),
           "ms_per_token_sync": round(ms_sync, 4),
           "bytes_per_step": cost.bytes, "achieved_gbs": round(cost.bytes / (ms * 1e-3) / 1e9, 1),
           "prefill_ms": round(1000 * prefill_s, 2), "weights_built_s": round(build_s, 2),
           "gpu": gpu_name, "datasheet_gpu": spec.key if spec else None,
           "bandwidth_gbs_datasheet": spec.bandwidth_gbs if spec else None}
    for label, bw in (("datasheet", spec.bandwidth_gbs if spec else None), ("measured", bandwidth_gbs)):
        if bw:
            floor_ms = cost.bytes / (bw * 1e9) * 1000
            out[f"floor_ms_{label}"] = round(floor_ms, 4)
            out[f"fraction_of_floor_{label}"] = round(floor_ms / ms, 3)
    del model, backend
    return out
