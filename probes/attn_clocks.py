#!/usr/bin/env python3
"""Probe: the SM cycles of each phase of the one-token decode attention inside the graphed step.
Last result (H200, 7B): 4.6 us a layer after the PDL wait, most of it the keys' arithmetic (issue-bound).

Where the single-stream decode attention (attn_cluster, or attn_o_cluster: attention + o) spends its time inside
the graphed step (GPU probe).

Builds the preset's single stream, swaps the package's attn_cluster* / attn_o_cluster* entry points for the
clocked copies in probes/attn_clocks.cu (same names, same math; compiled with any macros given), runs the engine's
run-ahead single-stream decode (`run_ahead_intervals`, the `--decode-bench` loop), then reads the probe's
`attn_clocks`: thread 0 of every block added the SM cycles of each phase (entry to the early loads issued, to past
the PDL wait, to warp 0's keys done, to all warps' keys done, the block merge, the cluster barrier, the cluster
merge). Prints the mean per block and launch in cycles and in us at the SM clock, and the step's ms/token (the
probe's atomics cost a little).

    python -m probes.attn_clocks --like qwen2.5-7b [--define LLMRS_ATTN_O_RED] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
PROBE = ROOT / "probes" / "attn_clocks.cu"

# (the block merge includes the pushes into the merging block; phase 7 is empty: no second barrier)
PHASES = ("table + early loads issued", "to past the PDL wait", "q + keys (warp 0)", "all warps' keys",
          "block merge (+ push)", "cluster barrier", "cluster merge + out", "(none)")
# attn_o_cluster (attention + o in one kernel: the 3B's and 1.5B's one token), counted in attn_clocks[14]; phase 9
# runs in the last block of each split only (counted in attn_clocks[13]); -DLLMRS_ATTN_O_RED (every block adds its
# rows into x with atomics) has no phases 8-9
O_PHASES = ("o weights, table, early loads issued", "to past the PDL wait", "q + keys (warp 0)",
            "all warps' keys + merge factors", "cluster running, block's split pushed", "every split's pushes in",
            "splits merged: head's output", "o rows (partials stored)", "counted in (block_counts_last)",
            "last block's cross-head sum")


def install_probe(cp, k, defines: list[str]):
    """Compile probes/attn_clocks.cu (its `#include "../llmrs/kernels_cu/..."` found from probes/) and put its entry
    points in place of the package's attn_cluster* / attn_o_cluster* kernels in `k` (a Kernels)."""
    from llmrs.backends.cuda import kernels as kk

    opts = (*kk.options(), *(f"-D{d}" for d in defines), f"-I{PROBE.parent}")
    mod = cp.RawModule(code=PROBE.read_text(), options=opts)
    swapped = 0
    for names in kk.ENTRY_POINTS.values():
        for n in names:
            if not n.startswith(("attn_cluster", "attn_o_cluster")):
                continue
            raw = mod.get_function(n)
            if n.startswith("attn_cluster16") and k.cc >= 90:
                kk.allow_nonportable_cluster(raw)
            k.fns[n] = kk.PdlKernel(raw, k, n) if n in kk.PDL_KERNELS else raw
            swapped += 1
    if not swapped:
        raise SystemExit("no attn_cluster* / attn_o_cluster* entry points in kernels.ENTRY_POINTS")
    return mod


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--like", default="qwen2.5-7b")
    ap.add_argument("--define", action="append", default=[], help="another macro NAME[=VALUE] (repeatable)")
    ap.add_argument("--prompt-len", type=int, default=256)
    ap.add_argument("--steps", type=int, default=256)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()

    import cupy as cp

    from llmrs.profiling.decode_bench import run_ahead_intervals, single_stream

    warmup = 8
    ss = single_stream(a.like, a.prompt_len, warmup + a.steps + 1)
    mod = install_probe(cp, ss.backend.k, a.define)  # before the first decode step captures its graphs
    clocks = mod.get_global("attn_clocks")
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
