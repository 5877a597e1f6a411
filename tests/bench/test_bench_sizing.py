"""`llmrs bench` without -n: a probe sizes each run to about --duration seconds on the server it measures.

The arithmetic is checked on hand-made probe results; the whole path against the fake server (tests/bench_fixtures),
whose exact timing makes the server's rate known: a request of P prompt tokens and O output tokens lasts
TTFT + (O - 1) x GAP, so C of them in flight finish C / that requests a second. Then once against the real
`llmrs serve` on the embedded model on CPU, where -c 256 cannot be served in a few seconds: the run completes with
its table and the note that the server saturated.
"""

from __future__ import annotations

import io
import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from rich.console import Console

from llmrs.bench import sizing
from llmrs.bench.bench import BenchOptions, run_bench
from llmrs.bench.dataset import WorkloadConfig
from llmrs.bench.records import RequestResult, RequestSpec
from llmrs.bench.report import REPORT_MD, write_report
from llmrs.errors import UserError
from tests.bench_fixtures.serving import fake_server_cmd, running

ROOT = Path(__file__).resolve().parents[2]


def _specs(n: int, input_len: int, output_len: int) -> list[RequestSpec]:
    return [RequestSpec(i, [5] * input_len, input_len, output_len) for i in range(n)]


def _measure(seconds: float, tokens: int, completed: int = 0, failed: int = 0,
             share: float | None = None) -> sizing.ProbeMeasure:
    return sizing.ProbeMeasure(seconds, tokens, completed, failed, share)


# --- the arithmetic ---------------------------------------------------------------------------------------------

def test_the_count_is_the_requests_the_probed_rate_finishes_in_the_target_time():
    specs = _specs(8, 256, 128)  # 384 tokens a request
    s = sizing.size_run(_measure(10.0, 38_400), specs, 60.0, cap=16, request_rate=math.inf)
    assert (s.tokens_per_s, s.request_tokens, s.num_prompts, s.saturated) == (3840.0, 384.0, 600, False)
    assert s.cap_s == pytest.approx(16 * 384 / 3840)
    assert s.note() is None
    assert s.line() == ("sized for about 60 s: a 10.0 s probe at -c 16 ran 3,840 tokens/s (prompt + output); "
                        "sending 600 requests (-n N sends exactly N)")
    # a server stopping at EOS: the probe's completed requests used half their max_tokens, so a request costs less
    half = sizing.size_run(_measure(10.0, 38_400, completed=4, share=0.5), specs, 60.0, cap=16, request_rate=math.inf)
    assert (half.request_tokens, half.num_prompts) == (256 + 64, 720)


def test_the_count_is_bounded_by_the_cap_and_by_the_request_rate():
    specs = _specs(8, 256, 128)
    fast = _measure(10.0, 10_000_000)
    assert sizing.size_run(fast, specs, 60.0, cap=16, request_rate=math.inf).num_prompts == sizing.MAX_PROMPTS
    assert sizing.size_run(fast, specs, 60.0, cap=512, request_rate=math.inf).num_prompts == 4 * 512
    assert sizing.size_run(fast, specs, 60.0, cap=None, request_rate=math.inf).num_prompts == sizing.MAX_PROMPTS
    # at 2 requests a second the arrivals alone take 60 s for 120 requests
    at_rate = sizing.size_run(fast, specs, 60.0, cap=16, request_rate=2.0)
    assert (at_rate.num_prompts, at_rate.saturated) == (120, False)
    assert at_rate.line().startswith("sized for about 60 s: a 10.0 s probe at -c 16, --request-rate 2 ran")
    assert at_rate.to_dict()["request_rate"] == 2.0
    assert sizing.size_run(fast, specs, 0.1, cap=16, request_rate=2.0).num_prompts == 1  # never 0


def test_a_server_that_cannot_finish_the_cap_in_time_saturated():
    specs = _specs(8, 256, 128)
    s = sizing.size_run(_measure(10.0, 3_840), specs, 60.0, cap=256, request_rate=math.inf)  # 384 tok/s: 60 in 60 s
    assert (s.num_prompts, s.saturated, s.cap_s) == (60, True, 256.0)
    assert s.note() == ("note: the server saturated at -c 256: at its measured 384 tokens/s, 256 requests would take "
                        "~4 min, so 60 were sent and at most 60 were in flight; -n 256 (or more) sends them all anyway")
    d = s.to_dict()
    assert (d["saturated"], d["num_prompts"], d["target_s"], d["probe_s"], d["tokens_per_s"], d["concurrency"]) == (
        True, 60, 60.0, 10.0, 384.0, 256)
    json.dumps(d, allow_nan=False)  # the results file is strict JSON
    # nothing came back at all: one request, saturated, the note says so
    none = sizing.size_run(_measure(60.0, 0), specs, 60.0, cap=256, request_rate=math.inf)
    assert (none.num_prompts, none.saturated, none.to_dict()["cap_s"]) == (1, True, "inf")
    assert "in a 60.0 s probe at -c 256 no token came back; sending 1 request (" in none.line()
    assert "it returned no token in 60 s, so 1 were sent" in none.note()
    # every probe request failed: no rate was measured, so no saturation is claimed (the run shows the failures)
    failed = sizing.size_run(_measure(1.0, 0, failed=64), specs, 60.0, cap=256, request_rate=math.inf)
    assert (failed.num_prompts, failed.saturated, failed.note()) == (1, False, None)
    assert "every request of a 1.0 s probe at -c 256 failed" in failed.line()
    # a cap the server fills in time is no saturation, however close
    assert not sizing.size_run(_measure(10.0, 16 * 384 * 10 // 60), specs, 60.0, cap=16,
                               request_rate=math.inf).saturated


def test_a_probe_counts_prompts_answered_and_tokens_streamed_until_its_last_event():
    t0 = 100.0
    done = RequestResult(0, success=True, start=t0, end=t0 + 2.0, chunks=10, prompt_tokens=30, output_tokens=12,
                         input_len=32, max_tokens=24)
    cut_streaming = RequestResult(1, start=t0, end=t0 + 3.0, chunks=5, input_len=32, interrupted="in flight")
    cut_in_prefill = RequestResult(2, start=t0 + 1, end=t0 + 3.0, chunks=0, input_len=32, interrupted="in flight")
    failed = RequestResult(3, error="HTTP 500: boom", start=t0, end=t0 + 0.5, input_len=32)
    unsent = RequestResult(4, interrupted="not sent", input_len=32)
    m = sizing.measure([done, cut_streaming, cut_in_prefill, failed, unsent], t0)
    # usage where the server gave it (30 + 12), the spec's prompt and the chunks where it did not (32 + 5)
    assert (m.seconds, m.tokens, m.completed, m.failed, m.output_share) == (3.0, 30 + 12 + 32 + 5, 1, 1, 0.5)
    assert sizing.measure([unsent], t0) == sizing.ProbeMeasure(0.0, 0, 0, 0, None)


def test_a_probe_stops_after_its_time_once_a_token_came_back_or_when_its_requests_run_out():
    sig: list[int | None] = [None]
    stop = sizing.ProbeStop(total=32, cap=16, probe_s=10.0, wait_s=60.0, pending=lambda: sig[0])
    stop.progress(0, 0, 16, 0, 9.9)
    assert stop() is None
    stop.progress(0, 0, 16, 0, 30.0)  # past its time, no token yet: it waits for the first one
    assert stop() is None
    stop.progress(0, 0, 16, 1, 30.1)
    assert stop() == sizing.PROBE_STOPPED
    stop.progress(0, 0, 16, 0, 60.0)  # up to the target time
    assert stop() == sizing.PROBE_STOPPED
    stop.progress(16, 0, 16, 99, 2.0)  # every request sent and the cap's worth ended: the rest would be a tail
    assert stop() == sizing.PROBE_STOPPED
    stop.progress(15, 0, 16, 99, 2.0)
    assert stop() is None
    sig[0] = signal.SIGTERM
    assert stop() == signal.SIGTERM  # an interrupt stops it as a signal, not as a probe that is over
    assert sizing.probe_count(16, math.inf, 10.0) == sizing.PROBE_MIN_PROMPTS
    assert sizing.probe_count(256, math.inf, 10.0) == 512
    assert sizing.probe_count(4, 20.0, 10.0) == 300
    assert sizing.probe_count(None, 1e6, 10.0) == sizing.MAX_PROMPTS


@pytest.mark.parametrize("duration", [0.0, -1.0, math.inf, math.nan])
def test_a_duration_that_is_not_a_positive_number_is_a_user_error(duration, tmp_path):
    o = BenchOptions(url="http://127.0.0.1:9", auto_num_prompts=True, duration=duration, out_dir=tmp_path)
    with pytest.raises(UserError, match="--duration must be a positive number of seconds"):
        run_bench(o, Console(quiet=True))


# --- against the fake server ------------------------------------------------------------------------------------

def _bench(url: str, tmp_path: Path, name: str, cap: int, duration: float, input_len: int, output_len: int
           ) -> tuple[dict, str]:
    buf = io.StringIO()
    o = BenchOptions(
        workload=WorkloadConfig(num_prompts=1, input_len=input_len, output_len=output_len, prompt_format="ids"),
        url=url, concurrency=cap, auto_num_prompts=True, duration=duration, out_dir=tmp_path, name=name, workers=1,
    )
    path = run_bench(o, Console(file=buf, width=240))
    return json.loads(path.read_text()), " ".join(buf.getvalue().split())


def test_a_run_without_n_sends_what_the_server_finishes_in_the_duration(tmp_path):
    """TTFT 50 ms, then 19 more tokens 10 ms apart: a request lasts 240 ms, so 8 in flight finish 33 a second, 100
    in 3 s; the count is checked in a band wide enough for a loaded 2-core machine."""
    with running(ttft_ms=50, gap_ms=10) as (url, _):
        doc, text = _bench(url, tmp_path, "sized", cap=8, duration=3.0, input_len=16, output_len=20)
    (run,) = doc["runs"]
    sz = run["sizing"]
    assert 50 <= sz["num_prompts"] <= 150 and run["num_prompts"] == sz["num_prompts"]
    assert run["summary"]["completed"] == sz["num_prompts"] and run["summary"]["peak_concurrency"] == 8
    assert sz["target_s"] == 3.0 and sz["saturated"] is False and sz["concurrency"] == 8
    assert sz["request_tokens"] == 36.0 and 0 < sz["probe_s"] <= 3.5
    assert doc["params"]["num_prompts"] is None and doc["params"]["duration_s"] == 3.0
    assert (f"sized for about 3 s: a {sz['probe_s']:.1f} s probe at -c 8 ran {sz['tokens_per_s']:,.0f} tokens/s "
            f"(prompt + output); sending {sz['num_prompts']} requests (-n N sends exactly N)") in text
    assert "Successful requests" in text and "saturated" not in text


def test_a_cap_the_server_keeps_up_with_gets_every_slot_filled(tmp_path):
    """-c 256 against a server that answers each request in 1.5 s: 256 finish in well under the duration, so the
    run sends at least 256 and all 256 slots are in flight at once."""
    with running(ttft_ms=1500) as (url, _):
        doc, text = _bench(url, tmp_path, "full", cap=256, duration=5.0, input_len=8, output_len=2)
    (run,) = doc["runs"]
    assert run["num_prompts"] >= 256 and run["summary"]["completed"] == run["num_prompts"]
    assert run["summary"]["peak_concurrency"] == 256 and run["sizing"]["saturated"] is False
    assert "warning" not in text and "saturated" not in text


def test_a_cap_the_server_cannot_serve_in_the_duration_completes_with_the_saturation_note(tmp_path):
    """-c 200 with a request lasting 0.5 + 29 x 0.1 = 3.4 s and a 2 s target: the server cannot finish 200 requests
    in 2 s, so fewer are sent, the run completes with its table and says the server saturated; the report's
    caveats say it too."""
    with running(ttft_ms=500, gap_ms=100) as (url, _):
        doc, text = _bench(url, tmp_path, "sat", cap=200, duration=2.0, input_len=16, output_len=30)
    (run,) = doc["runs"]
    sz, s = run["sizing"], run["summary"]
    n = sz["num_prompts"]
    assert sz["saturated"] is True and 1 <= n < 200 and run["num_prompts"] == n
    assert s["completed"] == n and s["failed"] == 0 and s["peak_concurrency"] <= n
    assert "Successful requests" in text
    assert (f"note: the server saturated at -c 200: at its measured {sz['tokens_per_s']:,.0f} tokens/s, 200 requests "
            f"would take ~") in text
    assert f"so {n} were sent and at most {n} were in flight; -n 200 (or more) sends them all anyway" in text
    write_report([str(tmp_path / "sat.json")], tmp_path / "rep")
    md = (tmp_path / "rep" / REPORT_MD).read_text()
    assert f"the server saturated: at its probed {sz['tokens_per_s']:,.0f} tokens/s it could not finish 200 requests " \
           f"in about 2 s, so {n} were sent (at most {n} in flight)." in md


def _env() -> dict:
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}


def test_an_interrupt_during_the_probe_saves_and_exits_as_in_a_run(tmp_path):
    """SIGTERM while the probe waits for the first token of a server that answers after 4 s (the probe runs 10 s
    and waits for a first token up to the 60 s target): the bench stops, the results file says it was interrupted
    (no run measured), and the exit status is 143."""
    cmd = " ".join(fake_server_cmd(ttft_ms=4000))
    p = subprocess.Popen(
        [sys.executable, "-m", "llmrs", "bench", "--server-cmd", cmd, "-c", "4", "--duration", "60", "--input-len", "8",
         "--output-len", "2", "--prompt-format", "ids", "--workers", "1", "-o", str(tmp_path), "--name", "probe"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=_env(), cwd=tmp_path,
    )
    seen = []
    try:
        for line in p.stdout:  # type: ignore[union-attr]
            seen.append(line)
            if line.startswith("probing the server at -c 4"):
                break
        time.sleep(1.0)
        p.send_signal(signal.SIGTERM)
        rest, _ = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
    out = "".join(seen) + rest
    assert p.returncode == 143, out
    doc = json.loads((tmp_path / "probe.json").read_text())
    assert doc["interrupted"] == "SIGTERM" and doc["runs"] == [] and doc["finished_at"]
    assert "interrupted by SIGTERM: what finished is in" in out and "server stopped" in out


# --- the real thing ---------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def embedded_model():
    from llmrs.model.loader import embedded_model_path

    try:
        return embedded_model_path("smollm2-135m")
    except Exception as e:  # noqa: BLE001 (any way it is missing: not installed, no GGUF in the package)
        pytest.skip(f"the embedded model is not installed: {e}")


def test_concurrency_256_on_cpu_completes_in_its_duration_with_the_saturation_note(tmp_path, embedded_model):
    """`llmrs bench --concurrency 256` as a user types it, with a short duration: `llmrs serve` on the embedded model
    on CPU cannot serve 256 requests in 5 s, so the run sends fewer, completes with its table and says so."""
    res = subprocess.run(
        [sys.executable, "-m", "llmrs", "bench", "--concurrency", "256", "--duration", "5", "--input-len", "64",
         "--output-len", "16", "-o", str(tmp_path), "--name", "cpu"],
        capture_output=True, text=True, env=_env(), timeout=600, cwd=tmp_path,
    )
    out = " ".join(res.stdout.split())
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    (run,) = json.loads((tmp_path / "cpu.json").read_text())["runs"]
    n = run["sizing"]["num_prompts"]
    assert run["sizing"]["saturated"] is True and n < 256 and run["summary"]["completed"] == n
    assert "sized for about 5 s: a " in out and "Successful requests" in out
    assert "note: the server saturated at -c 256: " in out and "-n 256 (or more) sends them all anyway" in out


class _MetricsStub:
    """A /metrics endpoint whose llmrs gauges show `busy` polls of a busy server (2 running, 3 waiting), then an
    idle one; GET /metrics only."""

    def __init__(self, busy: int, gauges: bool = True):
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        stub = self
        self.polls = 0

        class H(BaseHTTPRequestHandler):
            def do_GET(self):
                stub.polls += 1
                n = 1 if stub.polls <= busy else 0
                body = (f"llmrs:num_requests_running {2 * n}\nllmrs:num_requests_waiting {3 * n}\n" if gauges
                        else "process_cpu_seconds_total 1.0\n").encode()
                self.send_response(200)
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *a):
                pass

        self.srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.url = f"http://127.0.0.1:{self.srv.server_address[1]}"
        threading.Thread(target=self.srv.serve_forever, daemon=True).start()

    def close(self):
        self.srv.shutdown()


def test_the_run_waits_for_the_server_to_drop_the_probes_requests():
    """After a probe's cut-off the server may still hold its requests (a saturated CPU server aborts them at its next
    step, seconds away): the run starts once /metrics shows nothing running or waiting."""
    stub = _MetricsStub(busy=3)
    seen = []
    try:
        waited = sizing.wait_idle(stub.url, on_wait=lambda t, r, w: seen.append((r, w)))
    finally:
        stub.close()
    assert seen == [(2, 3)] * 3 and stub.polls == 4
    assert waited >= 3 * sizing.DRAIN_POLL_S
    stub = _MetricsStub(busy=1000)
    try:  # an interrupt ends the wait
        assert sizing.wait_idle(stub.url, stop=lambda: stub.polls >= 2) is not None and stub.polls == 2
    finally:
        stub.close()
    stub = _MetricsStub(busy=1000, gauges=False)
    try:  # nothing to watch: no wait
        assert sizing.wait_idle(stub.url) is None and stub.polls == 1
    finally:
        stub.close()
