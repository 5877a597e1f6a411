"""probes/first_burst_probe.py on the CPU with the embedded model: bursts of requests, each step profiled, the
slowest step's functions written out."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_first_burst_probe_profiles_each_burst(tmp_path):
    out = tmp_path / "probe.json"
    r = subprocess.run([sys.executable, str(ROOT / "probes" / "first_burst_probe.py"), "--model", "", "--device",
                        "cpu", "--runs", "2", "--n", "3", "--prompt-len", "8", "--max-tokens", "2", "--top", "4",
                        "--json", str(out)], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    runs = json.loads(out.read_text())
    assert [x["run"] for x in runs] == [1, 2]
    for x in runs:
        # 3 prompts of 8 tokens fit one step, then 1 decode step (max_tokens 2): two step() calls a burst
        assert len(x["step_ms"]) >= 2 and all(t > 0 for t in x["step_ms"])
        assert x["step_ms"][x["slowest"]] == max(x["step_ms"])
        assert len(x["top"]) == 4 and all(t["calls"] >= 1 and t["cumtime_ms"] >= t["tottime_ms"] for t in x["top"])
    assert "burst 2:" in r.stdout and "largest tottimes" in r.stdout
