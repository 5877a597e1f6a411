"""Summarize an LLMRS_TRACE_FILE (llmrs/trace.py) written while requests ran one at a time: for each tag, the
median and minimum time after the request's `client_send`, in order of the median; a tag's second and later
occurrences within a request get "#2", "#3" (the async engine's second step, a second SSE event).

    LLMRS_TRACE_FILE=/tmp/t.txt llmrs serve ... &      # the server and its engine core write their tags
    LLMRS_TRACE_FILE=/tmp/t.txt llmrs bench --url ... -c 1 -n 20 --output-len 2 ...   # and the client its own
    python -m tools.ttft_trace /tmp/t.txt [--skip 2] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path


def requests_of(lines: list[str]) -> list[list[tuple[float, str]]]:
    """The file's (time, tag) events cut into requests at each client_send, in time order (events before the first
    send dropped)."""
    events = []
    for line in lines:
        parts = line.split(None, 2)
        if len(parts) == 3:
            events.append((float(parts[0]), parts[2].strip()))
    events.sort()
    out: list[list[tuple[float, str]]] = []
    for t, tag in events:
        if tag == "client_send":
            out.append([(t, tag)])
        elif out:
            out[-1].append((t, tag))
    return out


def summarize(reqs: list[list[tuple[float, str]]], skip: int = 0) -> list[dict]:
    """Per tag: median / min ms after client_send and how many requests had it, up to each request's client_first
    (later tags belong to the rest of that request)."""
    per: dict[str, list[float]] = {}
    for r in reqs[skip:]:
        t0, seen = r[0][0], {}
        for t, tag in r:
            seen[tag] = seen.get(tag, 0) + 1
            key = tag if seen[tag] == 1 else f"{tag}#{seen[tag]}"
            per.setdefault(key, []).append((t - t0) * 1e3)
            if tag == "client_first":
                break
    rows = [{"tag": k, "median_ms": round(statistics.median(v), 3), "min_ms": round(min(v), 3), "n": len(v)}
            for k, v in per.items()]
    return sorted(rows, key=lambda r: r["median_ms"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace")
    ap.add_argument("--skip", type=int, default=2, help="first requests left out (warm-up)")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    reqs = requests_of(Path(a.trace).read_text().splitlines())
    if len(reqs) <= a.skip:
        sys.exit(f"{a.trace}: {len(reqs)} requests (client_send tags), need more than --skip {a.skip}")
    rows = summarize(reqs, a.skip)
    print(f"{len(reqs) - a.skip} requests; ms after client_send:")
    prev = 0.0
    for r in rows:
        print(f"  {r['tag']:22s} median {r['median_ms']:8.3f}  (+{r['median_ms'] - prev:6.3f})  min {r['min_ms']:8.3f}"
              f"  n={r['n']}")
        prev = r["median_ms"]
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
