#!/usr/bin/env python3
"""Where a 256-concurrent run's prefill burst goes, from an `LLMRS_TRACE_FILE` trace of the server and its bench
clients (llmrs/trace.py): per run (core steps split at gaps of more than --gap seconds), the requests' arrival at
the engine core (core_recv, relative to the run's first client_send), and each of the first --steps steps: its
start, its length, the tokens it returned (core_tokens) and, for eager steps, the host's enqueue time (fwd_begin ->
fwd_queued); and the server's intake (its `route` tags: the span from the first request's to the last's, the
median interval, the largest gap and after which request), so a stall in the server's intake shows up.

    python -m tools.burst_trace TRACE [--gap 0.5] [--steps 14]
"""

from __future__ import annotations

import argparse
import sys

import numpy as np


def read(path: str) -> list[tuple[float, str, str]]:
    out = []
    with open(path) as f:
        for line in f:
            parts = line.split(None, 2)
            if len(parts) == 3:
                try:
                    t = float(parts[0])
                except ValueError:
                    continue
                tag = parts[2].strip()
                name, _, arg = tag.partition(" ")
                out.append((t, name, arg))
    out.sort()
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("trace")
    ap.add_argument("--gap", type=float, default=0.5)
    ap.add_argument("--steps", type=int, default=14)
    a = ap.parse_args()
    ev = read(a.trace)
    steps = [t for t, n, _ in ev if n == "core_step"]
    runs: list[list[float]] = []
    for t in steps:
        if not runs or t - runs[-1][-1] > a.gap:
            runs.append([])
        runs[-1].append(t)
    for i, r in enumerate(runs, 1):
        lo, hi = r[0] - 2.0, r[-1] + 0.5
        sends = [t for t, n, _ in ev if n == "client_send" and lo <= t <= hi]
        t0 = sends[0] if sends else r[0]
        recv = np.array([t for t, n, _ in ev if n == "core_recv" and lo <= t <= hi]) - t0
        toks = [(t, int(x or 0)) for t, n, x in ev if n == "core_tokens" and lo <= t <= hi]
        begins = [t for t, n, _ in ev if n == "fwd_begin" and lo <= t <= hi]
        queued = [t for t, n, _ in ev if n == "fwd_queued" and lo <= t <= hi]
        spread = 1e3 * (sends[-1] - sends[0]) if sends else 0.0
        print(f"run {i}: {len(r)} steps, {len(sends)} client sends over {spread:.1f} ms; core_recv first / median / "
              f"last {1e3 * recv.min():.1f} / {1e3 * np.median(recv):.1f} / {1e3 * recv.max():.1f} ms after the first "
              f"send; first step at {1e3 * (r[0] - t0):.1f} ms")
        routes = np.array([t for t, n, _ in ev if n == "route" and lo <= t <= hi])
        if routes.size > 1:
            d = np.diff(routes)
            k = int(d.argmax())
            print(f"  server intake: {routes.size} requests routed from {1e3 * (routes[0] - t0):.1f} to "
                  f"{1e3 * (routes[-1] - t0):.1f} ms, median interval {1e3 * float(np.median(d)):.2f} ms, largest gap "
                  f"{1e3 * float(d[k]):.1f} ms after request {k + 1}")
        for k in range(min(a.steps, len(r))):
            end = r[k + 1] if k + 1 < len(r) else r[k]
            got = sum(n for t, n in toks if r[k] <= t < end)
            arrived = int((recv <= r[k] - t0).sum())
            b = [x for x in begins if r[k] <= x < end]
            q = [x for x in queued if r[k] <= x < end]
            enq = f"  enqueue {1e3 * (q[0] - b[0]):.1f} ms" if b and q and q[0] >= b[0] else ""
            print(f"  step {k + 1:2d} at {1e3 * (r[k] - t0):7.1f} ms, {1e3 * (end - r[k]):6.1f} ms long, {got:3d} "
                  f"tokens out, {arrived:3d} requests at the core by its start{enq}")
        if len(r) > 40:
            d = np.diff(r[40:])
            print(f"  steps 41-: median interval {1e3 * float(np.median(d)):.2f} ms over {d.size}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
