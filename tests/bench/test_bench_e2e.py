"""`llmrs bench` end to end against a real `llmrs serve` it starts itself (no --url), then `llmrs report`."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

from llmrs.bench.plots import SINGLE_PLOTS
from llmrs.bench.report import REPORT_MD

ROOT = Path(__file__).resolve().parents[2]


def test_bench_starts_llmrs_serve_and_saves_complete_results(tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    res = subprocess.run(
        [sys.executable, "-m", "llmrs", "bench", "-n", "6", "-c", "3", "--input-len", "24", "--output-len", "8",
         "--ignore-eos", "--workers", "1", "--label", "llmrs-cpu", "-o", str(tmp_path / "res"), "--name", "e2e",
         "--report", str(tmp_path / "rep"), "--temperature", "0.8", "--top-p", "0.9", "--top-k", "20"],
        capture_output=True, text=True, env=env, timeout=600,
    )
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    doc = json.loads((tmp_path / "res" / "e2e.json").read_text())
    assert doc["server"]["managed"] and "serve" in doc["server"]["command"]
    params = doc["params"]
    assert (params["temperature"], params["top_p"], params["top_k"], params["min_p"]) == (0.8, 0.9, 20, None)
    (run,) = doc["runs"]
    s = run["summary"]
    assert s["completed"] == 6 and s["failed"] == 0
    assert s["total_input_tokens"] == 6 * 24  # prompts tokenize to exactly the requested length
    assert s["total_output_tokens"] == 6 * 8  # usage from the server: ignore_eos gives exactly output-len
    # the server's prefix-cache counters around the run (/metrics): every prompt looked up, none seen before
    assert run["prefix_cache"] == {"source": "llmrs", "query_tokens": 6 * 24, "hit_tokens": 0, "hit_rate": 0.0,
                                   "preemptions": 0, "requery_tokens": 0, "hit_tokens_seen_before": 0}
    assert "prefix cache" not in res.stdout and "usage" not in res.stdout  # nothing to note on a normal run
    assert run["server_graph_capture_failures"] == 0  # (the CPU server has no graphs: none failed)
    rows = list(csv.DictReader(open(next((tmp_path / "res").glob("e2e-*.csv")))))
    assert len(rows) == 6
    assert all(int(r["output_tokens"]) == 8 and int(r["prompt_tokens"]) == 24 for r in rows)
    assert (tmp_path / "rep" / REPORT_MD).read_text().count("llmrs-cpu") >= 1
    assert all((tmp_path / "rep" / p).is_file() for p in SINGLE_PLOTS)


def test_bench_fits_prompts_to_a_small_vocabulary_server(tmp_path, tiny_qwen2):
    """Against `llmrs serve` on a 400-token test model the random prompts are built from ids the server has: the
    bench finds its vocabulary through /detokenize instead of sending ids it refuses (it crashed with an HTTP 400
    traceback before), and fits each prompt to the asked length where the tiny BPE's merges let it (the fit keeps
    the closest text after its rounds and records the length the server counts)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    res = subprocess.run(
        [sys.executable, "-m", "llmrs", "bench", "-n", "4", "-c", "2", "--input-len", "40", "--output-len", "4",
         "--ignore-eos", "--workers", "1", "--serve-args", f"{tiny_qwen2} --device cpu", "-o", str(tmp_path),
         "--name", "small"],
        capture_output=True, text=True, env=env, timeout=600,
    )
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    doc = json.loads((tmp_path / "small.json").read_text())
    assert doc["tokenizer"].startswith("server:")
    s = doc["runs"][0]["summary"]
    assert s["completed"] == 4 and s["failed"] == 0
    rows = list(csv.DictReader(open(next(tmp_path.glob("small*.csv")))))
    assert all(r["input_len"] == r["prompt_tokens"] for r in rows)  # what the bench recorded, the server counted
    lens = sorted(int(r["input_len"]) for r in rows)
    assert lens.count(40) >= 2 and all(abs(n - 40) <= 3 for n in lens), lens


def test_prefix_cache_hits_from_preemption_are_called_recomputation(tmp_path, tiny_qwen2):
    """A server whose KV cache (256 tokens) cannot hold 4 streams of 40 + 64 tokens preempts: its prefix cache then
    finds preempted requests' own blocks again. Fresh random prompts were never seen before, so every hit lies within
    the lookups beyond one per prompt, and the note says so: recomputation after preemption, not prompts seen before
    (it read "it had seen these prompts before")."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    res = subprocess.run(
        [sys.executable, "-m", "llmrs", "bench", "-n", "8", "-c", "4", "--input-len", "40", "--output-len", "64",
         "--ignore-eos", "--workers", "1", "--serve-args", f"{tiny_qwen2} --device cpu --kv-cache-tokens 256",
         "-o", str(tmp_path), "--name", "pre"],
        capture_output=True, text=True, env=env, timeout=600,
    )
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    (run,) = json.loads((tmp_path / "pre.json").read_text())["runs"]
    cache, s = run["prefix_cache"], run["summary"]
    assert s["completed"] == 8 and s["total_output_tokens"] == 8 * 64
    assert cache["preemptions"] > 0 and cache["hit_tokens"] > 0, cache
    prompts = s["total_input_tokens"]
    assert cache["requery_tokens"] == cache["query_tokens"] - prompts > 0
    assert cache["hit_tokens_seen_before"] == 0
    out = " ".join(res.stdout.split())
    assert f"the server preempted {cache['preemptions']} request(s) in this run" in out
    assert f"all within the {cache['requery_tokens']:,} tokens looked up again" in out
    assert "recomputation after preemption, not prompts it had seen before" in out
