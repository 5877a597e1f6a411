"""`llmrs bench` against a real uvicorn server on 127.0.0.1 with exact, known token timing (tests/bench_fixtures).

The fake server sends the first content chunk TTFT after a request arrives and then one chunk every GAP, on an
absolute schedule; so every metric has a known value, up to the loopback's and the timers' resolution.
"""

from __future__ import annotations

import json
import math

import httpx
import numpy as np
import pandas as pd
import pytest
from rich.console import Console

from llmrs.bench.bench import BenchOptions, run_bench
from llmrs.bench.client import ClientConfig
from llmrs.bench.dataset import WorkloadConfig
from llmrs.bench.metrics import summarize
from llmrs.bench.records import RequestSpec
from llmrs.bench.runner import run_load
from tests.bench_fixtures.serving import running

MS = 1e-3
TOL = 15 * MS  # loopback + event-loop timers + OS scheduling: the shared 2-core box runs at load 5-7 at times


def _quiet() -> Console:
    return Console(quiet=True)


@pytest.fixture(scope="module")
def server():
    """One fake server process for the module; each test shapes its requests with prompt directives."""
    with running() as (url, stats):
        yield url, stats


@pytest.mark.parametrize("backend", ["completions", "chat"])
def test_metrics_equal_known_server_timing(server, backend):
    ttft, gap, n, reqs = 0.100, 0.020, 10, 8
    url, stats = server
    cfg = ClientConfig(url, "fake-model", backend=backend)
    run_load([RequestSpec(0, "warm n=2", 3, 2)], [0.0], cfg, cap=1, workers=1)  # server's first-use paths
    specs = [RequestSpec(i, f"{backend} {i} ttft_ms={ttft * 1e3:g} gap_ms={gap * 1e3:g}", 3, n) for i in range(reqs)]
    out = run_load(specs, [0.0] * reqs, cfg, cap=reqs, workers=2)
    timings = stats.get()["timings"]
    s = summarize(out.results, out.t0, slo={"ttft": 150, "tpot": 25})
    assert s.completed == reqs and s.failed == 0
    assert s.total_output_tokens == reqs * n  # from usage
    ends, ttft_known, e2e_known, itl_err = [], [], [], []
    for r in out.results:
        arrive, *sent = timings[specs[r.idx].prompt]
        transit = arrive - r.start  # request on the wire + server parsing: not part of the server's schedule
        assert r.chunks == n and len(r.itl) == n - 1  # chat: the role-only first delta is not a token
        # the client timestamps what the server wrote when it wrote it (perf_counter: one clock for both)
        # (the server stamps a write when send() returns, so the client may even see it a little earlier)
        assert abs(r.ttft - (sent[0] - r.start)) < TOL
        assert abs(r.latency - (sent[-1] - r.start)) < TOL
        assert ttft <= r.ttft < ttft + 0.05
        # each client gap against the gap the server really wrote (its schedule is absolute: a late write is
        # followed by an early one, which a comparison with the nominal gap would count twice)
        itl_err += [abs(g - (b - a)) for g, a, b in zip(r.itl, sent, sent[1:])]
        ttft_known.append(r.ttft - transit)
        e2e_known.append(r.latency - transit)
        ends.append((arrive + ttft + (n - 1) * gap, sent[-1]))
    # the known schedule (medians: a loaded box may delay the odd server write, which is not the client's error)
    assert float(np.median(ttft_known)) == pytest.approx(ttft, abs=TOL)
    assert float(np.median(e2e_known)) == pytest.approx(ttft + (n - 1) * gap, abs=TOL)
    # single gaps: the client's own thread may be scheduled late too, so most, not all, within TOL
    assert float(np.median(itl_err)) < TOL / 3
    assert sum(e < TOL for e in itl_err) >= 0.75 * len(itl_err)
    assert s.tpot_ms.mean == pytest.approx(gap / MS, abs=TOL / MS / (n - 1))
    assert s.itl_ms.median == pytest.approx(gap / MS, abs=TOL / MS)
    # all requests run at once: the run lasts until the last chunk (as written; as scheduled, give or take load)
    assert s.duration_s == pytest.approx(max(e[1] for e in ends) - out.t0, abs=TOL)
    duration = max(e[0] for e in ends) - out.t0
    assert s.output_throughput == pytest.approx(reqs * n / s.duration_s)
    assert s.output_throughput == pytest.approx(reqs * n / duration, rel=0.08)
    assert s.request_throughput == pytest.approx(reqs / duration, rel=0.08)
    assert s.peak_concurrency == reqs
    assert s.goodput == pytest.approx(reqs / s.duration_s)  # every request meets ttft<=150, tpot<=25


def test_sampling_options_reach_the_server_only_when_set(server):
    """--temperature always travels; --top-p / --top-k / --min-p only when given (a server that does not know top_k
    is not sent one it was not asked for), in both the completions and the chat body."""
    url, stats = server
    cases = {"samp plain": ClientConfig(url, "m"),
             "samp all": ClientConfig(url, "m", temperature=0.7, top_p=0.9, top_k=20, min_p=0.05),
             "samp chat": ClientConfig(url, "m", backend="chat", temperature=1.0, top_p=0.5)}
    for prompt, cfg in cases.items():
        out = run_load([RequestSpec(0, prompt, 3, 2)], [0.0], cfg, cap=1, workers=1)
        assert out.results[0].success, out.results[0].error
    seen = stats.get()["sampling"]
    assert seen["samp plain"] == {"temperature": 0.0}
    assert seen["samp all"] == {"temperature": 0.7, "top_p": 0.9, "top_k": 20, "min_p": 0.05}
    assert seen["samp chat"] == {"temperature": 1.0, "top_p": 0.5}


def test_goodput_counts_only_requests_meeting_every_slo(server):
    url, _ = server
    specs = [RequestSpec(i, f"ttft_ms={50 if i % 2 else 300} gap_ms=10", 3, 5) for i in range(8)]
    out = run_load(specs, [0.0] * 8, ClientConfig(url, "m"), cap=8, workers=1)
    s = summarize(out.results, out.t0, slo={"ttft": 200})
    assert s.goodput == pytest.approx(4 / s.duration_s)
    assert summarize(out.results, out.t0, slo={"tpot": 5}).goodput == 0.0  # 10 ms per token misses 5 ms


def test_concurrency_never_exceeds_the_cap_across_workers(server):
    url, stats = server
    httpx.post(f"{url}/stats/reset", trust_env=False)
    specs = [RequestSpec(i, "ttft_ms=5 gap_ms=2", 3, 6) for i in range(60)]
    out = run_load(specs, [0.0] * 60, ClientConfig(url, "m"), cap=5, workers=2)
    server_peak = stats.get()["max_inflight"]
    s = summarize(out.results, out.t0)
    assert s.completed == 60
    assert 4 <= server_peak <= 5  # as seen by the server itself
    assert s.peak_concurrency <= 5 and out.peak_inflight_sum <= 5


def test_request_rate_spreads_arrivals(server):
    specs = [RequestSpec(i, "n=2", 3, 2) for i in range(40)]
    from llmrs.bench.arrivals import arrival_offsets

    offs = arrival_offsets(40, 50.0, 1.0, seed=3).tolist()
    url, _ = server
    out = run_load(specs, offs, ClientConfig(url, "m"), cap=None, workers=2)
    starts = sorted(r.start - out.t0 for r in out.results)
    # sent when scheduled, not all at once: the 40 arrivals span ~0.8 s. The bounds on the lag leave room for a
    # busy 2-core CI machine (one request 20+ ms late failed a 20 ms bound there) without passing a burst.
    assert starts[-1] == pytest.approx(offs[-1], abs=0.1)
    lags = sorted(r.start - r.scheduled for r in out.results)
    assert lags[0] > -0.005, "no request goes out before its time"
    assert lags[len(lags) // 2] < 0.02 and lags[-1] < 0.15, lags


def test_faults_are_counted_with_reasons_and_the_run_still_saves(server, tmp_path):
    prompts = ["n=4", "n=4", "n=4", "fault=500", "fault=close n=10", "fault=nodone n=4", "fault=hang"]
    ds = tmp_path / "faults.jsonl"
    ds.write_text("\n".join(json.dumps({"prompt": p, "output_len": 4}) for p in prompts))
    url, _ = server
    o = BenchOptions(
        workload=WorkloadConfig(num_prompts=len(prompts), dataset=str(ds), seed=0), url=url,
        concurrency=None, timeout=1.5, workers=2, out_dir=tmp_path / "res", name="faults",
    )
    path = run_bench(o, _quiet())
    doc = json.loads(path.read_text())
    s = doc["runs"][0]["summary"]
    assert s["completed"] == 3 and s["failed"] == 4
    assert s["failures"] == {"HTTP 500": 1, "stream closed early": 2, "timeout after 1.5s": 1}
    rows = pd.read_csv(tmp_path / "res" / doc["runs"][0]["csv"])
    assert len(rows) == 7 and rows["success"].sum() == 3
    assert rows.loc[~rows["success"], "ttft_ms"].isna().all()  # failures never enter latency statistics
    assert "injected failure" in " ".join(rows["error"].dropna())


def test_results_file_is_complete_and_usage_is_cross_checked(server, tmp_path):
    url, _ = server
    o = BenchOptions(
        workload=WorkloadConfig(num_prompts=6, input_len=20, output_len=5, seed=1), url=url, label="fake-engine",
        concurrency=3, workers=2, slo={"ttft": 1000}, out_dir=tmp_path, name="r",
    )
    path = run_bench(o, _quiet())
    doc = json.loads(path.read_text())
    assert doc["schema"] == "llmrs.bench/1" and doc["label"] == "fake-engine"
    assert doc["server"]["models"][0]["id"] == "fake-model" and doc["server"]["model"] == "fake-model"
    assert doc["tokenizer"].startswith("server:") and doc["finished_at"] and doc["llmrs_version"]
    assert doc["params"]["input_len"] == 20 and doc["params"]["concurrency"] == 3
    run = doc["runs"][0]
    assert run["tag"] == "c3-rinf" and run["client_cpu"]["workers"] == 2
    s = run["summary"]
    assert s["total_input_tokens"] == 6 * 20  # prompts fitted to exactly 20 server tokens (usage.prompt_tokens)
    assert s["total_output_tokens"] == 30 and s["usage_mismatch"] == 0 and s["usage_missing"] == 0
    rows = pd.read_csv(tmp_path / run["csv"])
    assert (rows["prompt_tokens"] == 20).all() and (rows["text_tokens"] == rows["output_tokens"]).all()
    assert run["server_graph_capture_failures"] is None  # (no llmrs /metrics on this server)


def test_a_server_running_shapes_eagerly_is_flagged(tmp_path):
    """An llmrs server whose /metrics counts failed CUDA graph captures (those step shapes run eagerly): the run
    records the count and the console says the figures are not the graphed speed (otherwise a server running
    eagerly shows only as a throughput that halves)."""
    with running(graph_failures=3) as (url, _):
        console = Console(record=True, width=200)
        path = run_bench(BenchOptions(workload=WorkloadConfig(num_prompts=2, input_len=8, output_len=2, seed=1),
                                      url=url, concurrency=2, workers=1, out_dir=tmp_path, name="eager"), console)
    run = json.loads(path.read_text())["runs"][0]
    assert run["server_graph_capture_failures"] == 3 and run["summary"]["completed"] == 2
    assert "CUDA graph capture failed for 3 step shape(s)" in console.export_text()


def test_usage_that_cannot_be_right_is_a_warning_and_text_round_trips_only_verbose(server, tmp_path):
    """A server that reports 4 completion tokens for 3 streamed with max_tokens 3: a miscount (more than asked for),
    warned about. The re-tokenized text disagrees with usage too; that comparison alone is no error (decode ->
    encode does not round-trip), so its row shows only with --verbose."""
    ds = tmp_path / "lie.jsonl"
    ds.write_text('{"prompt": "usage_lie=1 n=3"}\n{"prompt": "n=3"}\n')
    url, _ = server
    for verbose in (False, True):
        o = BenchOptions(workload=WorkloadConfig(num_prompts=2, dataset=str(ds), output_len=3), url=url, workers=1,
                         out_dir=tmp_path, name="lie", verbose=verbose)
        console = Console(record=True, width=200)
        doc = json.loads(run_bench(o, console).read_text())
        s = doc["runs"][0]["summary"]
        assert s["usage_miscount"] == 1 and s["usage_mismatch"] == 1
        text = console.export_text()
        assert "Usage miscounts (tokens > max_tokens or < chunks)" in text
        assert "the server's usage count cannot be right for 1 request(s)" in text
        assert ("usage != re-tokenized text (round trip, not an error)" in text) is verbose


def test_sweep_saves_one_run_per_value(server, tmp_path):
    """... and each point (and the warm-up) sends random prompts of its own (seed + point): a server's prefix cache
    must not serve one point's prompts to the next."""
    url, stats = server
    httpx.post(f"{url}/stats/reset", trust_env=False, timeout=10)
    o = BenchOptions(
        workload=WorkloadConfig(num_prompts=8, input_len=8, output_len=4, prompt_format="ids"), url=url,
        sweep=("concurrency", [1.0, 4.0]), workers=2, warmup=2, out_dir=tmp_path, name="sw",
    )
    doc = json.loads(run_bench(o, _quiet()).read_text())
    assert [r["tag"] for r in doc["runs"]] == ["c1-rinf", "c4-rinf"]
    assert [r["seed"] for r in doc["runs"]] == [0, 1]
    assert len(stats.get()["timings"]) == 2 + 8 + 8, "a prompt was sent twice"
    assert doc["runs"][0]["summary"]["peak_concurrency"] == 1
    assert all((tmp_path / r["csv"]).is_file() for r in doc["runs"])
    assert doc["runs"][1]["summary"]["completed"] == 8 and doc["params"]["prompt_format"] == "ids"


def test_unreachable_server_fails_requests_not_the_process(tmp_path):
    from llmrs.bench.server import free_port

    url = f"http://127.0.0.1:{free_port()}"
    out = run_load([RequestSpec(0, "x", 1, 2)], [0.0], ClientConfig(url, "m", timeout=5), cap=1, workers=1)
    assert not out.results[0].success and out.results[0].error.startswith("ConnectError")
    assert math.isfinite(summarize(out.results, out.t0).duration_s)
    assert httpx  # imported for the error type names above


def test_progress_off_a_terminal_is_plain_lines_counting_streamed_tokens(tmp_path, monkeypatch):
    """stdout not a terminal (a log, CI): a plain line every PLAIN_EVERY_S (here 0.2 s) with requests done of the
    total, tokens, tok/s and time; tokens count as they stream (2 requests of 40 tokens 50 ms apart: lines while
    no request has finished already show tokens), and a last line says where the run ended."""
    import io
    import re

    from llmrs.bench import console as console_mod

    monkeypatch.setattr(console_mod, "PLAIN_EVERY_S", 0.2)
    buf = io.StringIO()
    console = Console(file=buf, force_terminal=False, width=80)
    with running(gap_ms=50) as (url, _):
        run_bench(BenchOptions(workload=WorkloadConfig(num_prompts=2, input_len=8, output_len=40, prompt_format="ids"),
                               url=url, concurrency=2, workers=1, out_dir=tmp_path, name="plain"), console)
    pat = re.compile(r"^c2-rinf: (\d+)/2 requests done \((\d+) failed\), (\d+) in flight, ([\d,]+) tokens, "
                     r"([\d,]+) tok/s, (\d+)s elapsed$")
    lines = [m for m in map(pat.match, buf.getvalue().splitlines()) if m]
    assert len(lines) >= 3, buf.getvalue()
    tokens = [int(m[4].replace(",", "")) for m in lines]
    assert tokens == sorted(tokens) and tokens[-1] == 80  # a line is never wrapped or cut at 80 columns either
    assert any(m[1] == "0" and 0 < int(m[4]) < 80 for m in lines), [m[0] for m in lines]
    assert lines[-1][1] == "2" and lines[-1][3] == "0"
