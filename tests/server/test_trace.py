"""LLMRS_TRACE_FILE (llmrs/trace.py): a real `llmrs serve` (engine core in its own process) and a real `llmrs bench`
at concurrency 1 write one file whose tags, cut into requests by tools/ttft_trace.py, follow the request's way
in order: client -> app -> route -> core -> step -> tokens -> server -> SSE -> client. Without the variable nothing
is written."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.server.test_server import MODEL, ROOT, Server

from tools.ttft_trace import requests_of, summarize

# (the first server_out, the core's empty message after the prefill's launch, races the core's second step)
ORDER = ["client_send", "asgi_enter", "route", "cmd_sent", "core_recv", "core_step", "core_tokens 0",
         "core_step#2", "core_tokens 1", "server_out#2", "sse_event", "client_first"]


def test_a_traced_request_shows_every_hop_in_order(tmp_path):
    trace = tmp_path / "trace.txt"

    class Traced(Server):
        extra_env = {"LLMRS_TRACE_FILE": str(trace)}

    srv = Traced(["--kv-cache-tokens", "1024", "--async-scheduling"], tmp_path / "serve.log")
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


def test_one_descriptor_a_process_and_whole_lines_from_several(tmp_path, monkeypatch):
    """tr opens the file once per process (and again where PATH changes or after a fork), so a tag costs one
    write(2); processes writing at once leave whole lines (O_APPEND)."""
    import multiprocessing as mp

    import llmrs.trace as trace

    opened: list[str] = []
    real_open = os.open
    monkeypatch.setattr(os, "open", lambda path, *a: opened.append(path) or real_open(path, *a))
    first, second = str(tmp_path / "a.txt"), str(tmp_path / "b.txt")
    monkeypatch.setattr(trace, "PATH", first)
    for _ in range(50):
        trace.tr("core_step")
    monkeypatch.setattr(trace, "PATH", second)
    trace.tr("route")
    assert opened == [first, second]
    assert len(Path(first).read_text().splitlines()) == 50 and Path(second).read_text().split()[2] == "route"

    ctx = mp.get_context("fork")
    procs = [ctx.Process(target=_write_tags, args=(second, i)) for i in range(4)]
    for pr in procs:
        pr.start()
    for pr in procs:
        pr.join(30)
        assert pr.exitcode == 0
    lines = Path(second).read_text().splitlines()[1:]
    assert len(lines) == 4 * 200
    pids = {int(line.split()[1]) for line in lines}
    assert len(pids) == 4 and os.getpid() not in pids  # each child reopened the file as itself
    assert all(len(line.split()) == 3 and line.split()[2].startswith("tag") for line in lines)


def _write_tags(path: str, i: int) -> None:
    import llmrs.trace as trace

    trace.PATH = path
    for j in range(200):
        trace.tr(f"tag{i}-{j}")
