"""Probe: why a fresh server's first burst of prompts is the slowest (each burst's steps under cProfile).
Last result (H200): the first 256-prompt burst enqueued its first step ~170 ms slower; the serving warm-up removes it.

Why the first burst of prompts after a start is the slowest: the engine as `llmrs serve` builds it (serving_engine: warmed up), then --runs bursts of --n
requests (random --prompt-len prompts, --max-tokens new tokens each, all added at once), each burst's steps under
cProfile. Prints per burst the slowest steps' host times and the functions that took the most time (tottime) in the
burst's slowest step, then the same functions in the next burst, so a one-time cost stands out.

    python -m probes.first_burst_probe [--model synthetic:qwen2.5-7b] [--runs 3] [--n 256]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def top_functions(prof: cProfile.Profile, n: int) -> list[tuple[str, int, float, float]]:
    """(function, calls, tottime s, cumtime s) of the n largest tottimes."""
    st = pstats.Stats(prof, stream=io.StringIO())
    rows = []
    for (file, line, fn), (_cc, nc, tt, ct, _callers) in st.stats.items():  # type: ignore[attr-defined]
        rows.append((f"{Path(file).name}:{line}({fn})", nc, tt, ct))
    rows.sort(key=lambda r: -r[2])
    return rows[:n]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="synthetic:qwen2.5-7b")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--n", type=int, default=256)
    ap.add_argument("--prompt-len", type=int, default=256)
    ap.add_argument("--max-tokens", type=int, default=8)
    ap.add_argument("--top", type=int, default=18)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()

    import numpy as np

    from llmrs.engine.llm_engine import serving_config, serving_engine
    from llmrs.engine.sampling import SamplingParams

    t0 = time.perf_counter()
    eng = serving_engine(a.model or None, serving_config(device=a.device, max_num_seqs=256))
    print(f"engine built and warmed up in {time.perf_counter() - t0:.1f} s; async scheduling {eng.async_scheduling}")
    vocab = eng.loaded.config.vocab_size
    rng = np.random.default_rng(0)
    out = []
    for run in range(1, a.runs + 1):
        for i in range(a.n):
            ids = [int(t) for t in rng.integers(1, vocab - 1, size=a.prompt_len)]
            eng.add_request(f"b{run}-{i}", ids, SamplingParams(max_tokens=a.max_tokens, temperature=0.0,
                                                               ignore_eos=True))
        steps: list[tuple[float, cProfile.Profile]] = []
        t_run = time.perf_counter()
        while eng.has_unfinished():
            prof = cProfile.Profile()
            t = time.perf_counter()
            prof.enable()
            eng.step()
            prof.disable()
            steps.append((time.perf_counter() - t, prof))
        wall = time.perf_counter() - t_run
        times = [s[0] * 1e3 for s in steps]
        worst = max(range(len(steps)), key=lambda k: steps[k][0])
        top = top_functions(steps[worst][1], a.top)
        print(f"\nburst {run}: {len(steps)} step() calls, {wall * 1e3:.0f} ms; first 12 step() host ms: "
              + " ".join(f"{t:.1f}" for t in times[:12]))
        print(f"  slowest step() #{worst}: {times[worst]:.1f} ms; its largest tottimes:")
        for fn, nc, tt, ct in top:
            print(f"    {tt * 1e3:9.2f} ms tot {ct * 1e3:9.2f} ms cum {nc:6d} calls  {fn}")
        out.append({"run": run, "step_ms": times, "slowest": worst,
                    "top": [{"fn": fn, "calls": nc, "tottime_ms": tt * 1e3, "cumtime_ms": ct * 1e3}
                            for fn, nc, tt, ct in top]})
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
