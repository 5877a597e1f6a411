"""LLMRS_TRACE_FILE (llmrs/trace.py): a real `llmrs serve` (engine core in its own process) and a real `llmrs bench`
at concurrency 1 write one file whose tags, cut into requests by scripts/ttft_trace.py, follow the request's way
in order: client -> app -> route -> core -> step -> tokens -> server -> SSE -> client. Without the variable nothing
is written."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.test_server import MODEL, ROOT, Server

sys.path.insert(0, str(ROOT / "scripts"))
from ttft_trace import requests_of, summarize  # noqa: E402

# (the first server_out, the core's empty message after the prefill's launch, races the core's second step)
ORDER = ["client_send", "asgi_enter", "route", "cmd_sent", "core_recv", "core_step", "core_tokens 0",
         "core_step#2", "core_tokens 1", "server_out#2", "sse_event", "client_first"]


def test_a_traced_request_shows_every_hop_in_order(tmp_path):
    trace = tmp_path / "trace.txt"

    class Traced(Server):
        extra_env = {"LLMRS_TRACE_FILE": str(trace), "LLMRS_ASYNC_SCHEDULING": "always"}

    srv = Traced(["--kv-cache-tokens", "1024"], tmp_path / "serve.log")
    try:
        srv.wait_ready()
        env = {**os.environ, "LLMRS_TRACE_FILE": str(trace),
               "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
        out = subprocess.run([sys.executable, "-m", "llmrs", "bench", "--url", srv.url, "--model", MODEL,
                              "--input-len", "32", "--output-len", "2", "--ignore-eos", "-c", "1", "-n", "4",
                              "--workers", "1", "-o", str(tmp_path), "--name", "traced"],
                             env=env, capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    finally:
        assert srv.stop() == 0
    reqs = requests_of(trace.read_text().splitlines())
    assert len(reqs) == 4
    rows = {r["tag"]: r for r in summarize(reqs)}
    for tag in ORDER:
        assert rows.get(tag, {}).get("n") == 4, (tag, sorted(rows))
    medians = [rows[t]["median_ms"] for t in ORDER]
    assert medians == sorted(medians), list(zip(ORDER, medians))


def test_nothing_is_written_without_the_variable(tmp_path, monkeypatch):
    import llmrs.trace as trace

    monkeypatch.setattr(trace, "PATH", None)
    trace.tr("route")
    trace.tr_tokens([])
    assert list(tmp_path.iterdir()) == []
    monkeypatch.setattr(trace, "PATH", str(tmp_path / "t.txt"))
    trace.tr("route")
    t, pid, tag = Path(tmp_path / "t.txt").read_text().split()
    assert float(t) > 0 and int(pid) == os.getpid() and tag == "route"
