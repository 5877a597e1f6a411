"""Shared by the GPU tests: skip cleanly without CuPy or a GPU; numpy references; a report file of figures."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest


def require_gpu():
    """The cupy module, or skip the whole test module (no CuPy, no driver, no GPU)."""
    cp = pytest.importorskip("cupy")
    try:
        n = cp.cuda.runtime.getDeviceCount()
    except Exception:  # no driver / CUDA libraries
        n = 0
    if n < 1:
        pytest.skip("no CUDA GPU", allow_module_level=True)
    return cp


def rel_err(out: np.ndarray, ref: np.ndarray) -> float:
    out, ref = np.asarray(out, dtype=np.float64), np.asarray(ref, dtype=np.float64)
    assert np.isfinite(out).all(), "non-finite (unwritten or poisoned) output"
    return float(np.linalg.norm(out - ref) / max(np.linalg.norm(ref), 1e-30))


def report(key: str, value) -> None:
    """Append a figure to $LLMRS_GPU_REPORT (a JSON-lines file) when set: parity figures for the notes."""
    path = os.environ.get("LLMRS_GPU_REPORT")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps({"key": key, "value": value}) + "\n")


def tiny_backend():
    """A CUDABackend of a one-layer tiny model: its kernels, cuBLAS handle and buffers, for testing and timing
    stand-alone linears (the GEMM / GEMV tests, probes/bench_gemm_q4*.py, ncu_linears.py, ...)."""
    from llmrs.backends.cuda import CUDABackend
    from llmrs.engine.config import ModelConfig

    c = ModelConfig(model_type="llama", vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                    num_attention_heads=2, num_key_value_heads=1, head_dim=32)
    return CUDABackend(c, num_blocks=2, cuda_graphs=False)


def bf16_words(backend, a):
    """`a` (numpy or CuPy) as bf16 words (uint16) on the GPU, rounded by the backend's own cast_f32_bf16."""
    import cupy as cp

    out = cp.empty(a.shape, dtype=cp.uint16)
    backend._cast_bf16(cp.asarray(a, dtype=cp.float32), out)
    return out


def event_us(fn, reps: int = 20) -> float:
    """GPU time of one fn() call between CUDA events around `reps` back-to-back calls (after 3 untimed ones); the
    host's launch cost shows where a call launches little work (graph_us leaves it out)."""
    import cupy as cp

    for _ in range(3):
        fn()
    cp.cuda.Device().synchronize()
    start, stop = cp.cuda.Event(), cp.cuda.Event()
    start.record()
    for _ in range(reps):
        fn()
    stop.record()
    stop.synchronize()
    return cp.cuda.get_elapsed_time(start, stop) * 1e3 / reps


def graph_us(fn, reps: int = 50) -> float:
    """GPU time of one fn() call: `reps` calls captured in a CUDA graph, replayed once untimed and once timed (no
    host launch cost inside; back-to-back launches from Python would time the host)."""
    import cupy as cp

    fn()
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        stream.begin_capture()
        for _ in range(reps):
            fn()
        graph = stream.end_capture()
        graph.launch(stream)
        start, stop = cp.cuda.Event(), cp.cuda.Event()
        start.record(stream)
        graph.launch(stream)
        stop.record(stream)
    stop.synchronize()
    return cp.cuda.get_elapsed_time(start, stop) * 1e3 / reps


def tiny_awq_runners(tmp_path, G: int, switch: str) -> tuple:
    """A tiny Qwen2 model (64-dim heads, q/k/v bias) written to tmp_path, its AWQ checkpoint (group size G) loaded
    quantized, and two CUDA ModelRunners over it whose backends have the attribute `switch` True and False (set
    before any step: the graphs are captured later): (the loaded model, {True: runner, False: runner})."""
    from llmrs.bench.checkpoint import write_awq_checkpoint
    from llmrs.model.loader import load
    from llmrs.engine.runner import ModelRunner
    from tests.conftest import write_tiny_model

    src = write_tiny_model(tmp_path / "qwen2", "qwen2", hidden_size=256, num_attention_heads=4,
                           num_key_value_heads=2, intermediate_size=512)
    kept = load(str(write_awq_checkpoint(src, tmp_path / "awq", group_size=G)), keep_quantized=True)
    runners = {}
    for on in (True, False):
        runners[on] = ModelRunner(kept, num_blocks=64, device="cuda")
        setattr(runners[on].backend, switch, on)
    return kept, runners
