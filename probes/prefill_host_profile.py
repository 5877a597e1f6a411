"""Probe: where the host's time goes while it enqueues an eager prefill step (cProfile of the forward).
Last result (H200, 7B, 256 tokens): 7.05-7.40 ms of enqueue, as long as the GPU's work (cuBLAS ~26 us a call,
CuPy launches ~15 us): why the prefill replays from a CUDA graph.

Where the host's time goes while it enqueues an eager prefill step (no CUDA graph), on a GPU machine.

Traced servers spent 3.9-7.6 ms of host time
enqueueing the 28 layers of a 256-token prefill of Qwen2.5-7B, against ~7.4 ms of GPU time: where the enqueue is
the longer, the first token waits on the host. This runs the real engine (synthetic weights) over fresh 256-token
prompts, one at a time, and times each prefill's `_forward_device`: the enqueue (until it returns) and the GPU
(until the stream is idle after it); then a cProfile of those calls, by own time and by cumulative time.

    python -m probes.prefill_host_profile [--model synthetic:qwen2.5-7b] [--prompts 12] [--len 256]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import statistics
import time

import numpy as np


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="synthetic:qwen2.5-7b")
    ap.add_argument("--prompts", type=int, default=12)
    ap.add_argument("--len", type=int, default=256)
    ap.add_argument("--top", type=int, default=30)
    args = ap.parse_args()

    from llmrs.engine.config import EngineConfig
    from llmrs.engine.llm_engine import LLMEngine
    from llmrs.model.loader import load
    from llmrs.engine.sampling import SamplingParams

    engine = LLMEngine(load(args.model), EngineConfig(device="cuda"))
    engine.warmup()
    be = engine.runner.backend
    cp = be.cp
    inner = be._forward_device
    times: list[tuple[float, float]] = []
    prof = cProfile.Profile()
    profiling = [False]

    def timed(w, db):
        if db.T != args.len:  # a decode step (graphs) or another shape: not timed
            return inner(w, db)
        cp.cuda.get_current_stream().synchronize()
        t0 = time.perf_counter()
        if profiling[0]:
            prof.enable()
        out = inner(w, db)
        if profiling[0]:
            prof.disable()
        t1 = time.perf_counter()
        cp.cuda.get_current_stream().synchronize()
        times.append(((t1 - t0) * 1e3, (time.perf_counter() - t0) * 1e3))
        return out

    be._forward_device = timed
    rng = np.random.default_rng(0)
    vocab = engine.loaded.config.vocab_size
    for i in range(args.prompts):
        profiling[0] = i >= 2  # the first two: without the profiler's own cost
        ids = rng.integers(1, vocab - 1, args.len).tolist()
        engine.add_request(f"p{i}", ids, SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True))
        while engine.has_unfinished():
            engine.step()
    plain = times[:2]
    print(f"{args.model}, {args.len}-token prefills, eager: enqueue / enqueue + GPU (ms)")
    print("  without the profiler: " + ", ".join(f"{a:.2f} / {b:.2f}" for a, b in plain))
    prof_t = times[2:]
    print(f"  with it (median of {len(prof_t)}): {statistics.median(a for a, _ in prof_t):.2f} / "
          f"{statistics.median(b for _, b in prof_t):.2f}")
    for key in ("tottime", "cumulative"):
        s = io.StringIO()
        pstats.Stats(prof, stream=s).sort_stats(key).print_stats(args.top)
        print(f"--- cProfile of the profiled prefills' _forward_device, by {key} ---")
        print("\n".join(s.getvalue().splitlines()[:args.top + 12]))


if __name__ == "__main__":
    main()
