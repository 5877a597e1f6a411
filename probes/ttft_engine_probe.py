"""Probe: where a lone request's time to first token goes inside the engine (no HTTP, no tokenizer).
Last result (H200, 7B, 256 tokens): ~7.3-7.5 ms of GPU prefill of a ~9.8 ms TTFT; the rest is host work before
and after the forward.

Where a lone request's time to first token goes inside the engine (no HTTP, no tokenizer, no engine process):
the real LLMEngine on the GPU (async scheduling as `llmrs serve` runs it), one request at a time with a fresh
random prompt of each --lens length (prefix cache cold), max_tokens 2. Per request: the host time of each part of
the first step() calls (schedule, runner.launch = building the batch and queueing the prefill's kernels, the
next step's planning and launch, the wait for the prefill's tokens, applying them), and add -> first token.
Compare with `llmrs profile --prefill-len N`'s step wall (the GPU's time) and the server's TTFT (ttft_probe.sh).

    python -m probes.ttft_engine_probe [--model synthetic:qwen2.5-7b] [--lens 1,16,64,256] [--n 10]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="synthetic:qwen2.5-7b")
    ap.add_argument("--lens", default="1,16,64,256")
    ap.add_argument("--n", type=int, default=10)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--json", default=None)
    ap.add_argument("--serving", action="store_true",
                    help="build the engine as `llmrs serve`'s core does (serving_engine: its config, KV sizing, "
                         "warm-up) instead of LLMEngine.from_model")
    a = ap.parse_args()

    import numpy as np

    from llmrs.engine.llm_engine import LLMEngine
    from llmrs.engine.sampling import SamplingParams

    from llmrs.trace import tr

    if a.serving:
        from llmrs.engine.llm_engine import serving_config, serving_engine

        eng = serving_engine(a.model, serving_config(device=a.device, max_num_seqs=256))
        print(f"async scheduling {eng.async_scheduling}; built as the server's core (warmed up)")
    else:
        eng = LLMEngine.from_model(a.model, device=a.device, max_num_seqs=256, max_num_batched_tokens=None)
        print(f"async scheduling {eng.async_scheduling}; warm-up {eng.warmup():.2f} s")
    parts: dict[str, list[float]] = {}
    rng = np.random.default_rng(0)
    vocab = eng.loaded.config.vocab_size
    runner = eng.runner
    orig_launch, orig_sched = runner.launch, eng.scheduler.schedule
    marks: list[tuple[str, float]] = []

    class TimedHandle:
        def __init__(self, h):
            self.h = h

        def wait(self):
            t0 = time.perf_counter()
            r = self.h.wait()
            marks.append(("wait", time.perf_counter() - t0))
            return r

    def launch(batch, states):
        t0 = time.perf_counter()
        h = orig_launch(batch, states)
        marks.append((f"launch T={batch.num_tokens}", time.perf_counter() - t0))
        return TimedHandle(h)

    def schedule():
        t0 = time.perf_counter()
        p = orig_sched()
        marks.append(("schedule", time.perf_counter() - t0))
        return p

    runner.launch, eng.scheduler.schedule = launch, schedule
    rows = []
    for n in (int(x) for x in a.lens.split(",")):
        ttfts = []
        for i in range(a.n + 1):
            ids = [int(t) for t in rng.integers(1, vocab - 1, size=n)]
            marks.clear()
            t0 = time.perf_counter()
            tr("client_send")  # LLMRS_TRACE_FILE: the same tags as a server request (tools/ttft_trace.py)
            eng.add_request(f"r{n}-{i}", ids, SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True))
            t_add = time.perf_counter() - t0
            calls = 0
            first = None
            while first is None:
                outs = eng.step()
                calls += 1
                if any(o.token_ids for o in outs):
                    first = time.perf_counter() - t0
                    tr("client_first")
            seen = list(marks)
            while eng.has_unfinished():
                eng.step()
            if i == 0:
                continue  # the first of a length: buffers of a new shape
            ttfts.append(first * 1e3)
            parts.setdefault(f"{n}:add", []).append(t_add * 1e3)
            for k, (name, dt) in enumerate(seen):
                parts.setdefault(f"{n}:{k}:{name}", []).append(dt * 1e3)
        row = {"prompt": n, "ttft_min": min(ttfts), "ttft_median": statistics.median(ttfts),
               "parts_median_ms": {k.split(":", 1)[1]: round(statistics.median(v), 3)
                                   for k, v in parts.items() if k.startswith(f"{n}:")}}
        rows.append(row)
        print(f"prompt {n:4d}: engine TTFT min {row['ttft_min']:.2f} median {row['ttft_median']:.2f} ms  "
              f"(step() calls to the first token: {calls})")
        for k, v in row["parts_median_ms"].items():
            print(f"    {k:28s} {v:8.3f} ms")
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
