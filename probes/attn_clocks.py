#!/usr/bin/env python3
"""Probe: the SM cycles of each phase of the one-token decode attention inside the graphed step.
Last result (H200, 7B): 4.6 us a layer after the PDL wait, most of it the keys' arithmetic (issue-bound).

Where the single-stream decode attention (attn_cluster, or attn_o_cluster: attention + o) spends its time inside
the graphed step (GPU probe).

Compiles the kernels with -DLLMRS_ATTN_CLOCKS (set here through LLMRS_CUDA_DEFINES, with any macros given), runs the
engine's run-ahead single-stream decode (`synth.run_ahead_intervals`, the `--decode-bench` loop), then reads
attention.cu's `attn_clocks`: thread 0 of every attn_cluster block added the SM cycles of each phase (entry to the
early loads issued, to past the PDL wait, to warp 0's keys done, to all warps' keys done, the block merge, the
cluster barrier, the cluster merge, the last barrier). Prints the mean per block and launch in cycles and in us at
the SM clock, and the step's ms/token (the probe's atomics cost a little).

    python -m probes.attn_clocks --like qwen2.5-7b [--define LLMRS_ATTN_EXACT_EXP] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

# (the push form, the default: the block merge includes the pushes, and there is no last barrier; the pull form,
# LLMRS_ATTN_CLUSTER_PUSH=0, reads the splits in its cluster merge and waits at a second barrier)
PHASES = ("table + early loads issued", "to past the PDL wait", "q + keys (warp 0)", "all warps' keys",
          "block merge (+ push)", "cluster barrier", "cluster merge + out", "last barrier (pull)")
# attn_o_cluster (attention + o in one kernel: the 3B's and 1.5B's one token), counted in attn_clocks[14]; phase 9
# runs in the last block of each split only (counted in attn_clocks[13]); LLMRS_ATTN_O_RED (a timing probe: every
# block adds its rows into x with atomics) has no phases 8-9
O_PHASES = ("o weights, table, early loads issued", "to past the PDL wait", "q + keys (warp 0)",
            "all warps' keys + merge factors", "cluster running, block's split pushed", "every split's pushes in",
            "splits merged: head's output", "o rows (partials stored)", "counted in (block_counts_last)",
            "last block's cross-head sum")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--like", default="qwen2.5-7b")
    ap.add_argument("--define", action="append", default=[], help="another macro NAME[=VALUE] (repeatable)")
    ap.add_argument("--prompt-len", type=int, default=256)
    ap.add_argument("--steps", type=int, default=256)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    os.environ["LLMRS_CUDA_DEFINES"] = ",".join(["LLMRS_ATTN_CLOCKS", *a.define])

    import cupy as cp

    from llmrs.synth import run_ahead_intervals, single_stream

    warmup = 8
    ss = single_stream(a.like, a.prompt_len, warmup + a.steps + 1)
    clocks = ss.backend.k.modules["attention.cu"].get_global("attn_clocks")
    counters = cp.ndarray((16,), cp.uint64, clocks)
    counters[:] = 0
    t = run_ahead_intervals(ss.model, ss.backend, ss.state, a.prompt_len, ss.table, ss.bs, warmup, a.steps)
    c = counters.get()
    kernel, n, phases = "attn_cluster", int(c[15]), PHASES
    if n == 0:
        kernel, n, phases = "attn_o_cluster", int(c[14]), O_PHASES
    if n == 0:
        print("no attn_cluster or attn_o_cluster block ran (another attention kernel took the step)")
        return 1
    khz = cp.cuda.runtime.deviceGetAttribute(cp.cuda.runtime.cudaDevAttrClockRate, 0)
    ms = 1000 * float(np.median(t))
    print(f"{a.like} {' '.join(a.define) or '(defaults)'}: {ms:.4f} ms/token; {n} {kernel} blocks, "
          f"SM clock {khz / 1e6:.2f} GHz; mean per block:")
    rows = []
    for i, name in enumerate(phases):
        # attn_o's phase 9: per last block (attn_clocks[13] of them), the others per block
        per = int(c[13]) if kernel == "attn_o_cluster" and i == 9 else n
        cyc = c[i] / max(per, 1)
        rows.append({"phase": name, "cycles": round(float(cyc), 1), "us": round(float(cyc) / khz * 1e3, 3),
                     "blocks": per})
        note = f"  ({per} blocks)" if per != n else ""
        print(f"  {name:>38}: {cyc:9.1f} cycles {cyc / khz * 1e3:7.3f} us{note}")
    after = sum(r["us"] for r in rows[2:])
    print(f"  {'after the wait, total':>38}: {after:7.3f} us")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"preset": a.like, "kernel": kernel, "defines": a.define, "ms_per_token": round(ms, 4),
                       "blocks": n, "sm_clock_ghz": khz / 1e6, "phases": rows, "after_wait_us": round(after, 3)}, f,
                      indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
