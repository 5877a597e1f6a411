"""probes/attn_clocks.py's phase tables against probes/attn_clocks.cu's probe points (no GPU): one name per ATTN_CLOCK(i)
in attn_cluster and per ATTN_O_CLOCK(i) in attn_o_cluster, in order, and slots 13-15 left for the block counts the
probe divides by."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _probe():
    spec = importlib.util.spec_from_file_location("attn_clocks", ROOT / "probes" / "attn_clocks.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod, (ROOT / "probes" / "attn_clocks.cu").read_text()


def test_every_probe_point_has_its_phase_name():
    mod, src = _probe()
    points = [int(i) for i in re.findall(r"^\s*ATTN_CLOCK\((\d+)\)", src, flags=re.M)]
    # in source order: 0 .. last once (then the tail of any alternative form of the kernel's end again from where it
    # branches)
    runs: list[list[int]] = []
    for p in points:
        if runs and p > runs[-1][-1]:
            runs[-1].append(p)
        else:
            runs.append([p])
    n = len(mod.PHASES)
    assert runs[0] == list(range(n)), points
    assert all(r == list(range(r[0], n)) and r[0] > 0 for r in runs[1:]), points
    assert len(mod.PHASES) < 13  # attn_clocks[13-15] count blocks
    assert "attn_clocks[16]" in src and "#define ATTN_CLOCK(i) ATTN_CLOCK_IN(i, 15)" in src


def test_every_attn_o_probe_point_has_its_phase_name():
    """attn_o_cluster's points: 0 .. 9 in source order, where LLMRS_ATTN_O_RED's end (atomics into x) stops at 7 and
    the default end (partials, block_counts_last, the last block's sum) goes on 7, 8, 9."""
    mod, src = _probe()
    points = [int(i) for i in re.findall(r"^\s*ATTN_O_CLOCK\((\d+)\)", src, flags=re.M)]
    assert points == [0, 1, 2, 3, 4, 5, 6, 7, 7, 8, 9], points
    assert len(mod.O_PHASES) == 10
    assert "atomicAdd(&attn_clocks[13], 1ull)" in src and "#define ATTN_O_CLOCK(i) ATTN_CLOCK_IN(i, 14)" in src
