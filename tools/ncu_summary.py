"""A short table from Nsight Compute's text report (`ncu --section ... > report.txt`), one row per profiled launch:
duration, DRAM throughput, issue-slot use, executed instructions, registers, occupancy and the top warp-stall
reasons (with `--metrics "regex:smsp__average_warps_issue_stalled_.*_per_issue_active\\.ratio"`).

    python -m tools.ncu_summary report.txt [--labels manifest.json] [--json out.json]

--labels: a JSON list of names in launch order (tools/ncu_linears.py writes one), shown beside each kernel.
Note: ncu locks the SM clock at its base (1.34 GHz on the H200) unless run with `--clock-control none`, so its
durations are longer than a benchmark's; the ratios (DRAM %, issue use, instructions a byte) are what to compare.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

HEADER = re.compile(r"^  (\S+) \((\d+), (\d+), (\d+)\)x\((\d+), (\d+), (\d+)\), Context")
STALL = re.compile(r"smsp__average_warps_issue_stalled_(\w+?)_per_issue_active\.ratio\s+\S+\s+([\d.,]+)")
FIELDS = {  # the report line's label -> the row's key (durations converted to us through UNITS)
    "Duration": "duration",
    "DRAM Throughput": "dram_pct",
    "Issued Warp Per Scheduler": "issued_per_scheduler",
    "Executed Instructions": "instructions",
    "Registers Per Thread": "registers",
    "Achieved Occupancy": "occupancy_pct",
    "SM Frequency": "sm_ghz",
}
UNITS = {"ns": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3, "nsecond": 1e-3}


def _number(text: str) -> float:
    return float(text.replace(",", ""))


def parse(text: str) -> list[dict]:
    """Profiled launches in report order: name, grid, block, the FIELDS found, stalls (reason -> cycles)."""
    rows: list[dict] = []
    cur: dict | None = None
    for line in text.splitlines():
        m = HEADER.match(line)
        if m:
            cur = {"kernel": m.group(1), "grid": [int(m.group(i)) for i in (2, 3, 4)],
                   "block": [int(m.group(i)) for i in (5, 6, 7)], "stalls": {}}
            rows.append(cur)
            continue
        if cur is None:
            continue
        s = STALL.search(line)
        if s:
            cur["stalls"][s.group(1)] = _number(s.group(2))
            continue
        parts = line.split()
        for label, key in FIELDS.items():
            if line.strip().startswith(label + " ") and key not in cur:
                # "<label> <unit?> <value>": the value is the last field, the unit (if any) the one before
                value = _number(parts[-1])
                unit = parts[-2] if len(parts) >= len(label.split()) + 2 else ""
                if key == "duration":
                    value *= UNITS.get(unit, 1.0)  # -> microseconds
                cur[key] = value
    return rows


def summarize(rows: list[dict], labels: list[str] | None = None) -> list[dict]:
    out = []
    for i, r in enumerate(rows):
        top = sorted(r["stalls"].items(), key=lambda kv: -kv[1])[:4]
        out.append({
            "label": labels[i] if labels and i < len(labels) else "",
            "kernel": r["kernel"], "grid": r["grid"], "us": r.get("duration"), "dram %": r.get("dram_pct"),
            "issue %": None if r.get("issued_per_scheduler") is None else 100 * r["issued_per_scheduler"],
            "instructions": r.get("instructions"), "registers": r.get("registers"),
            "occupancy %": r.get("occupancy_pct"), "top stalls": top,
        })
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("report", type=Path)
    ap.add_argument("--labels", type=Path, default=None)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    if not args.report.is_file():
        sys.exit(f"{args.report}: no such file")
    rows = parse(args.report.read_text(errors="replace"))
    if not rows:
        sys.exit(f"{args.report}: no profiled kernels found (is it ncu's text output?)")
    labels = json.loads(args.labels.read_text()) if args.labels else None
    table = summarize(rows, labels)
    print(f"{'launch':28s} {'kernel':22s} {'grid':>14s} {'us':>8s} {'DRAM%':>6s} {'issue%':>6s} {'instr':>10s} "
          f"{'regs':>4s} {'occ%':>5s}  top stalls (cycles between issues)")
    for t in table:
        grid = "x".join(str(v) for v in t["grid"])
        fmt = lambda v, f: "-" if v is None else format(v, f)  # noqa: E731
        stalls = ", ".join(f"{k} {v:.2f}" for k, v in t["top stalls"])
        print(f"{t['label'][:28]:28s} {t['kernel'][:22]:22s} {grid:>14s} {fmt(t['us'], '8.2f')} "
              f"{fmt(t['dram %'], '6.1f')} {fmt(t['issue %'], '6.1f')} {fmt(t['instructions'], '10.0f')} "
              f"{fmt(t['registers'], '4.0f')} {fmt(t['occupancy %'], '5.1f')}  {stalls}")
    if args.json:
        args.json.write_text(json.dumps(table, indent=1))


if __name__ == "__main__":
    main()
