"""scripts/attn_clocks.py's phase table against attention.cu's probe points (no GPU): one name per
ATTN_CLOCK(i) in attn_cluster, in order, and slot 15 left for the block count the probe divides by."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_every_probe_point_has_its_phase_name():
    spec = importlib.util.spec_from_file_location("attn_clocks", ROOT / "scripts" / "attn_clocks.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    src = (ROOT / "llmrs" / "kernels_cu" / "attention.cu").read_text()
    points = [int(i) for i in re.findall(r"^\s*ATTN_CLOCK\((\d+)\)", src, flags=re.M)]
    # in source order: 0 .. last once, then the tail of each alternative form of the kernel's end (the pull merge
    # under -DLLMRS_ATTN_CLUSTER_PULL) again from where it branches
    runs: list[list[int]] = []
    for p in points:
        if runs and p > runs[-1][-1]:
            runs[-1].append(p)
        else:
            runs.append([p])
    n = len(mod.PHASES)
    assert runs[0] == list(range(n)), points
    assert all(r == list(range(r[0], n)) and r[0] > 0 for r in runs[1:]), points
    assert len(mod.PHASES) < 15  # attn_clocks[15] counts the blocks
    assert "attn_clocks[16]" in src and "atomicAdd(&attn_clocks[15], 1ull)" in src
