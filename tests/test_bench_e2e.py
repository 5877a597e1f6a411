"""`llmrs bench` end to end against a real `llmrs serve` it starts itself (no --url), then `llmrs report`."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

from llmrs.bench.plots import PLOTS
from llmrs.bench.report import REPORT_MD

ROOT = Path(__file__).resolve().parents[1]


def test_bench_starts_llmrs_serve_and_saves_complete_results(tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    res = subprocess.run(
        [sys.executable, "-m", "llmrs", "bench", "-n", "6", "-c", "3", "--input-len", "24", "--output-len", "8",
         "--ignore-eos", "--workers", "1", "--label", "llmrs-cpu", "-o", str(tmp_path / "res"), "--name", "e2e",
         "--report", str(tmp_path / "rep")],
        capture_output=True, text=True, env=env, timeout=600,
    )
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    doc = json.loads((tmp_path / "res" / "e2e.json").read_text())
    assert doc["server"]["managed"] and "serve" in doc["server"]["command"]
    (run,) = doc["runs"]
    s = run["summary"]
    assert s["completed"] == 6 and s["failed"] == 0
    assert s["total_input_tokens"] == 6 * 24  # prompts tokenize to exactly the requested length
    assert s["total_output_tokens"] == 6 * 8  # usage from the server: ignore_eos gives exactly output-len
    # the server's prefix-cache counters around the run (/metrics): every prompt looked up, none seen before
    assert run["prefix_cache"] == {"source": "llmrs", "query_tokens": 6 * 24, "hit_tokens": 0, "hit_rate": 0.0}
    rows = list(csv.DictReader(open(next((tmp_path / "res").glob("e2e*.csv")))))
    assert len(rows) == 6
    assert all(int(r["output_tokens"]) == 8 and int(r["prompt_tokens"]) == 24 for r in rows)
    assert (tmp_path / "rep" / REPORT_MD).read_text().count("llmrs-cpu") >= 1
    assert all((tmp_path / "rep" / p).is_file() for p in PLOTS)
