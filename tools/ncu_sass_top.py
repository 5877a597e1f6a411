"""The SASS lines where a kernel's warps were sampled most, from Nsight Compute's source page as CSV:

    ncu -i report.ncu-rep --page source --print-source sass --csv > source.csv
    python -m tools.ncu_sass_top source.csv [--top 25]

One line per instruction: its share of all warp-state samples ("Warp Stall Sampling (All Samples)"), then the SASS.
"""

from __future__ import annotations

import argparse
import csv
import sys


def num(s: str) -> float:
    try:
        return float(s.replace(",", ""))
    except ValueError:
        return 0.0


def top_lines(rows: list[list[str]], top: int) -> list[str] | None:
    """the `top` most-sampled instructions as printable lines; None when the rows hold no sampled source table."""
    hdr = next((i for i, r in enumerate(rows) if any(c == "Source" or "Address" in c for c in r)), None)
    if hdr is None:
        return None
    head, body = rows[hdr], rows[hdr + 1:]
    col = next((i for i, c in enumerate(head) if "Warp Stall Sampling (All" in c), None)
    if col is None:
        return None
    src = next((i for i, c in enumerate(head) if c == "Source"), 1)
    body = [r for r in body if len(r) > max(col, src)]
    total = max(sum(num(r[col]) for r in body), 1.0)
    return [f"  {100 * num(r[col]) / total:5.1f}%  {r[src][:90]}"
            for r in sorted(body, key=lambda r: -num(r[col]))[:top]]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("csv")
    ap.add_argument("--top", type=int, default=25)
    a = ap.parse_args()
    with open(a.csv, newline="") as f:
        lines = top_lines(list(csv.reader(f)), a.top)
    if lines is None:
        sys.exit(f"{a.csv}: no source table with warp-state samples")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
