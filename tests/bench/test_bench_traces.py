"""Timed trace replay and queue-inclusive latency, against the exact-timing fake server (tests/bench_fixtures).

A trace row is sent at its timestamp / --trace-speed after the run's start; the fake server stamps each request's
arrival with perf_counter (one clock with the client's), so arrivals compare with the trace directly.
"""

from __future__ import annotations

import json

import httpx
import pandas as pd
import pytest
from rich.console import Console

from llmrs.bench.bench import BenchOptions, run_bench
from llmrs.bench.dataset import WorkloadConfig, read_trace
from llmrs.errors import UserError
from tests.bench_fixtures.serving import running

MS = 1e-3
TOL = 15 * MS  # loopback + event-loop timers + OS scheduling on a shared 2-core box

TIMES = [0.0, 0.05, 0.12, 0.3, 0.31, 0.5]


@pytest.fixture(scope="module")
def server():
    with running() as (url, stats):
        yield url, stats


def _trace(path, rows) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def _run(url, tmp_path, name, trace, **kw):
    o = BenchOptions(workload=WorkloadConfig(dataset=trace), url=url, out_dir=tmp_path, name=name,
                     **{"concurrency": None, "workers": 2, **kw})
    console = Console(record=True, width=200)
    doc = json.loads(run_bench(o, console).read_text())
    return doc, console.export_text()


@pytest.mark.parametrize("speed", [1.0, 2.0])
def test_trace_requests_arrive_at_their_timestamps(server, tmp_path, speed):
    url, stats = server
    httpx.post(f"{url}/stats/reset", trust_env=False)
    # out of order in the file (sorted by timestamp when read); rows with input_len get random prompts of that size
    rows = [{"timestamp": t, "prompt": f"trace{speed:g} row{i} n=2", "output_len": 2} for i, t in enumerate(TIMES)]
    rows[3], rows[1] = rows[1], rows[3]
    rows += [{"timestamp": 0.2, "input_len": 12, "output_len": 3}, {"timestamp": 0.4, "input_len": 7}]
    doc, text = _run(url, tmp_path, f"trace{speed:g}", _trace(tmp_path / "t.jsonl", rows), auto_num_prompts=True,
                     trace_speed=speed)
    (run,) = doc["runs"]
    assert run["mode"] == "trace replay" and doc["params"]["mode"] == "trace replay"
    assert run["tag"] == f"cinf-trace-x{speed:g}" and run["sizing"] is None  # the trace decides the count: no probe
    assert run["trace"]["requests"] == run["num_prompts"] == 8 and run["trace"]["span_s"] == 0.5
    assert run["trace"]["concurrency"] == "no cap" and doc["params"]["trace_speed"] == speed
    assert run["summary"]["completed"] == 8
    assert "trace replay of" in text and "probing" not in text
    t0 = run["window"]["t0"]
    arrivals = stats.get()["timings"]
    for i, t in enumerate(TIMES):
        arrive = arrivals[f"trace{speed:g} row{i} n=2"][0]
        assert arrive - t0 == pytest.approx(t / speed, abs=TOL)
    csv = pd.read_csv(tmp_path / run["csv"]).sort_values("scheduled_s")
    assert list(csv["scheduled_s"]) == pytest.approx([t / speed for t in sorted(TIMES + [0.2, 0.4])], abs=1e-6)
    random_rows = csv[csv["scheduled_s"].isin([0.2 / speed, 0.4 / speed])]
    assert sorted(random_rows["prompt_tokens"]) == [7, 12]  # random prompts of exactly input_len tokens
    assert sorted(random_rows["max_tokens"]) == [3, 128]  # output_len, else the default


def test_trace_rows_are_checked_with_their_line(tmp_path):
    bad = [({"timestamp": -1, "prompt": "x"}, "'timestamp' must be a number of seconds >= 0"),
           ({"timestamp": 1}, "the row needs 'prompt' or 'input_len'"),
           ({"timestamp": 1, "input_len": 0}, "'input_len' must be a whole number >= 1"),
           ({"timestamp": 1, "prompt": "x", "output_len": 1.5}, "'output_len' must be a whole number >= 1")]
    for row, msg in bad:
        path = _trace(tmp_path / "bad.jsonl", [{"timestamp": 0, "prompt": "ok"}, row])
        with pytest.raises(UserError, match=f"line 2: {msg}"):
            read_trace(path)


def test_trace_refuses_a_request_rate_and_speed_needs_a_trace(tmp_path):
    trace = _trace(tmp_path / "t.jsonl", [{"timestamp": 0, "prompt": "x"}])
    url = "http://127.0.0.1:9"  # refused before any request: nothing listens there
    for kw in ({"request_rate": 2.0}, {"sweep": ("request_rate", [1.0, 2.0])}):
        with pytest.raises(UserError, match="--request-rate does not apply to a trace replay"):
            run_bench(BenchOptions(workload=WorkloadConfig(dataset=trace), url=url, **kw), Console(quiet=True))
    with pytest.raises(UserError, match="--trace-speed applies to a trace replay"):
        run_bench(BenchOptions(url=url, trace_speed=2.0), Console(quiet=True))
    with pytest.raises(UserError, match="--trace-speed must be a positive number"):
        run_bench(BenchOptions(workload=WorkloadConfig(dataset=trace), url=url, trace_speed=0.0), Console(quiet=True))


def test_queue_inclusive_ttft_adds_the_wait_for_a_slot(server, tmp_path):
    """Five rows at timestamp 0, each taking 100 ms to its only token, one slot (-c 1): request k waits for the k
    before it, so its queue-inclusive TTFT is its TTFT plus that wait (about k x 100 ms), while TTFT stays 100 ms."""
    url, _ = server
    rows = [{"timestamp": 0, "prompt": f"queued {k} ttft_ms=100 n=1", "output_len": 1} for k in range(5)]
    doc, text = _run(url, tmp_path, "queued", _trace(tmp_path / "q.jsonl", rows), concurrency=1, workers=1)
    (run,) = doc["runs"]
    s = run["summary"]
    assert run["trace"]["concurrency"] == 1
    csv = pd.read_csv(tmp_path / run["csv"]).sort_values("start_s").reset_index(drop=True)
    for k, r in csv.iterrows():
        assert r["scheduled_s"] == 0.0
        assert r["ttft_ms"] == pytest.approx(100, abs=TOL / MS)
        wait = 0.0 if k == 0 else csv.loc[k - 1, "end_s"]  # the slot frees when the request before it ends
        assert (r["queued_ttft_ms"] - r["ttft_ms"]) * MS == pytest.approx(wait, abs=TOL)
        assert r["queued_ttft_ms"] == pytest.approx(100 * (k + 1), abs=(k + 1) * TOL / MS)
    assert s["queued_ttft_ms"]["mean"] == pytest.approx(csv["queued_ttft_ms"].mean(), abs=1e-2)
    assert s["queued_ttft_ms"]["mean"] - s["ttft_ms"]["mean"] == pytest.approx(200, abs=3 * TOL / MS)
    assert "Queue-incl. TTFT (ms, from scheduled send)" in text
    assert run["request_rate"] == "inf"  # every row at one instant


def test_cli_replays_a_trace_against_llmrs_serve(tmp_path):
    """`llmrs bench --dataset trace.jsonl --trace-speed 2` against the `llmrs serve` it starts: every row sent at
    half its timestamp, random prompts of exactly their input_len (the server's count), no probe, graded sections
    present; --request-rate with a trace is one line, no traceback."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")]))}
    trace = _trace(tmp_path / "trace.jsonl", [{"timestamp": t, "input_len": 16 + 4 * i, "output_len": 4}
                                              for i, t in enumerate([0.0, 0.4, 0.8, 1.6])])
    base = [sys.executable, "-m", "llmrs", "bench", "--dataset", trace, "-o", str(tmp_path / "res")]
    res = subprocess.run(base + ["--request-rate", "2"], capture_output=True, text=True, env=env, timeout=120)
    assert res.returncode != 0 and "--request-rate does not apply to a trace replay" in res.stderr
    assert "Traceback" not in res.stderr and len(res.stderr.strip().splitlines()) == 1
    res = subprocess.run(base + ["--trace-speed", "2", "--ignore-eos", "--workers", "1", "--name", "tr"],
                         capture_output=True, text=True, env=env, timeout=600)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "trace replay of" in res.stdout and "at 2x speed: 0.8 s" in res.stdout and "probing" not in res.stdout
    (run,) = json.loads((tmp_path / "res" / "tr.json").read_text())["runs"]
    assert run["mode"] == "trace replay" and run["tag"] == "cinf-trace-x2" and run["concurrency"] is None
    assert run["summary"]["completed"] == 4 and run["summary"]["total_output_tokens"] == 16
    assert {"roofline", "telemetry", "server_series", "prefix_cache"} <= set(run)
    csv = pd.read_csv(tmp_path / "res" / run["csv"]).sort_values("scheduled_s")
    assert list(csv["scheduled_s"]) == pytest.approx([0.0, 0.2, 0.4, 0.8])
    assert list(csv["prompt_tokens"]) == [16, 20, 24, 28]
    assert (csv["queued_ttft_ms"] >= csv["ttft_ms"]).all()
