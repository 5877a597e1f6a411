"""Single-stream decode on the numpy reference backend, against the memory floor.

Floor = float32 bytes a decode step reads (every weight matrix, the tied/untied output layer included; the
embedding table is gathered one row per token, so it counts only when it doubles as the output layer)
divided by this machine's measured memory bandwidth (the faster of a multi-threaded sgemv read and a
numpy copy, both over buffers far larger than the caches).

Usage: python -m tools.bench_cpu_decode [--model smollm2-135m] [--new-tokens 128] [--out reports/cpu/decode]
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import platform
import time
from pathlib import Path

import numpy as np

from llmrs import __version__
from llmrs.model.loader import load
from llmrs.engine.runner import GenerationStats, ModelRunner, stream_generate
from llmrs.engine.sampling import SamplingParams


def measure_bandwidth(gib: float = 1.0, reps: int = 5) -> dict[str, float]:
    n = int(gib * 2**30 / 4)
    a = np.ones(n, dtype=np.float32)
    b = np.empty_like(a)
    np.copyto(b, a)
    t = min(_timeit(lambda: np.copyto(b, a)) for _ in range(reps))
    copy_gbs = 2 * a.nbytes / t / 1e9  # read + write
    m = a.reshape(-1, 4096)
    x = np.ones(4096, dtype=np.float32)
    m @ x
    t = min(_timeit(lambda: m @ x) for _ in range(reps))
    gemv_gbs = a.nbytes / t / 1e9
    return {"copy_gb_s": copy_gbs, "sgemv_read_gb_s": gemv_gbs, "ceiling_gb_s": max(copy_gbs, gemv_gbs)}


def _timeit(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


class TimedBackend:
    """Wraps a backend and accumulates wall time per op (the profile of where a decode step goes)."""

    def __init__(self, inner):
        self._inner = inner
        self.times: dict[str, float] = collections.defaultdict(float)

    def __getattr__(self, name):
        fn = getattr(self._inner, name)
        if not callable(fn):
            return fn

        def timed(*args, **kwargs):
            t0 = time.perf_counter()
            out = fn(*args, **kwargs)
            self.times[name] += time.perf_counter() - t0
            return out

        return timed


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--out", default="reports/cpu/decode")
    args = ap.parse_args()

    bw = measure_bandwidth()
    loaded = load(args.model)
    c = loaded.config
    runner = ModelRunner(loaded, num_blocks=64)
    weight_bytes = 4 * (c.num_parameters() - (0 if c.tie_word_embeddings else c.vocab_size * c.hidden_size))
    floor_ms = weight_bytes / (bw["ceiling_gb_s"] * 1e9) * 1e3
    prompt = loaded.tokenizer.encode("Write a short story about a robot who learns to paint.")
    params = SamplingParams(max_tokens=args.new_tokens, temperature=0.0, ignore_eos=True)
    list(stream_generate(runner, prompt, SamplingParams(max_tokens=8, temperature=0.0)))  # warm-up
    stats = GenerationStats()
    list(stream_generate(runner, prompt, params, stats))
    ms_per_token = 1e3 / stats.decode_tok_s

    # profile: same decode with every backend op timed
    timed = TimedBackend(runner.backend)
    runner.model.backend = timed
    prof = GenerationStats()
    list(stream_generate(runner, prompt, params, prof))
    runner.model.backend = runner.backend
    decode_total = prof.decode_s + prof.prefill_s
    shares = {k: v / decode_total for k, v in sorted(timed.times.items(), key=lambda kv: -kv[1])}
    shares["python + sampling + other"] = 1 - sum(shares.values())

    result = {
        "schema": "llmrs.cpu-decode/1", "llmrs_version": __version__, "model": args.model,
        "machine": {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
                    "numpy": np.__version__, "python": platform.python_version()},
        "bandwidth": bw, "weight_bytes_f32": weight_bytes, "floor_ms_per_token": floor_ms,
        "prompt_tokens": len(prompt), "new_tokens": args.new_tokens,
        "decode_tok_s": stats.decode_tok_s, "ms_per_token": ms_per_token,
        "fraction_of_floor": floor_ms / ms_per_token, "time_share_by_op": shares,
        "command": f"python -m tools.bench_cpu_decode --model {args.model} --new-tokens {args.new_tokens}",
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(result, indent=2))
    lines = [
        f"# CPU single-stream decode: {args.model}", "",
        f"Command: `{result['command']}` (llmrs {__version__}, numpy {np.__version__}, {os.cpu_count()} cores)", "",
        "| metric | value |", "| --- | --- |",
        f"| memory bandwidth (copy / sgemv read) | {bw['copy_gb_s']:.1f} / {bw['sgemv_read_gb_s']:.1f} GB/s |",
        f"| float32 bytes read per token | {weight_bytes / 1e6:.0f} MB |",
        f"| memory floor | {floor_ms:.1f} ms/token |",
        f"| measured decode | {ms_per_token:.1f} ms/token ({stats.decode_tok_s:.1f} tok/s) |",
        f"| fraction of floor | {100 * floor_ms / ms_per_token:.0f}% |", "",
        "Where a decode step's time goes:", "", "| op | share |", "| --- | --- |",
    ] + [f"| {k} | {100 * v:.1f}% |" for k, v in shares.items()]
    (out / "README.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
