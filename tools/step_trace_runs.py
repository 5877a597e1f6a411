#!/usr/bin/env python3
"""Per-run step timing from an `LLMRS_TRACE_FILE` trace of a server under repeated load (llmrs/trace.py: lines
`<seconds> <pid> <tag>`): the engine core's `core_step` tags split into runs at gaps of more than --gap seconds,
and for each run the number of steps, the time from its first step to its 8th / 16th / 32nd (the prefill burst of
a 256-request run: eight 8192-token steps and the mixed ones after), the median step interval after the 64th
(decode), and where the forward's host tags are there (`fwd_begin` / `fwd_queued`, eager steps only: prefill and
mixed), their median host enqueue. Made for the first-run slowdown of a fresh server.

    python -m tools.step_trace_runs TRACE [--gap 1.0]
"""

from __future__ import annotations

import argparse
import sys

import numpy as np


def read(path: str) -> dict[str, list[float]]:
    tags: dict[str, list[float]] = {}
    with open(path) as f:
        for line in f:
            parts = line.split(None, 2)
            if len(parts) == 3:
                try:
                    tags.setdefault(parts[2].strip(), []).append(float(parts[0]))
                except ValueError:
                    continue
    return {k: sorted(v) for k, v in tags.items()}


def runs(steps: list[float], gap: float) -> list[list[float]]:
    out: list[list[float]] = []
    for t in steps:
        if not out or t - out[-1][-1] > gap:
            out.append([])
        out[-1].append(t)
    return out


def summary(path: str, gap: float = 1.0) -> list[dict]:
    tags = read(path)
    begins, queued = tags.get("fwd_begin", []), tags.get("fwd_queued", [])
    rows = []
    for r in runs(tags.get("core_step", []), gap):
        row = {"steps": len(r)}
        for k in (8, 16, 32):
            row[f"to_step{k}_ms"] = round(1000 * (r[k - 1] - r[0]), 1) if len(r) >= k else None
        tail = np.diff(r[64:]) if len(r) > 65 else np.array([])
        row["decode_step_ms"] = round(1000 * float(np.median(tail)), 3) if tail.size else None
        b = [t for t in begins if r[0] <= t <= r[-1]]
        q = [t for t in queued if r[0] <= t <= r[-1]]
        n = min(len(b), len(q))
        row["eager_steps"] = n
        row["eager_enqueue_ms"] = round(1000 * float(np.median(np.array(q[:n]) - np.array(b[:n]))), 3) if n else None
        rows.append(row)
    return rows


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("trace")
    ap.add_argument("--gap", type=float, default=1.0)
    a = ap.parse_args()
    for i, row in enumerate(summary(a.trace, a.gap), 1):
        print(f"run {i}: " + ", ".join(f"{k} {v}" for k, v in row.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
