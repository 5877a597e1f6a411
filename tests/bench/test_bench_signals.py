"""How `llmrs bench` ends when it is told to, against the real `llmrs serve` it started itself.

SIGTERM / SIGHUP / SIGINT during a run: the bench stops sending, saves what finished (the run and the results file
marked interrupted; requests never sent are not failures), stops the server's whole process group and exits
128 + the signal's number. SIGKILL: the bench can save nothing, but the server it started (engine core, resource
tracker) and its own client workers still go (llmrs.bench.guard sees its lifeline pipe close; the workers see
their parent's sentinel). "Nothing left" is checked in /proc: every process below the bench when the signal was
sent, and every member of the server's process group.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from llmrs.bench.guard import group_members

ROOT = Path(__file__).resolve().parents[2]
START_TIMEOUT_S = 300  # liveness only: a busy 2-core machine loads the embedded model in 20-60 s
GONE_TIMEOUT_S = 60  # the guard gives a server 10 s to stop and its group 10 s to drain


def _env() -> dict:
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}


def _stat(pid: int) -> list[str] | None:
    """state, ppid, pgrp, ... of a live process (None: gone or a zombie)."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = raw[raw.rfind(")") + 2:].split()
    return None if fields[0] == "Z" else fields


def _descendants(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for p in Path("/proc").iterdir():
        if p.name.isdigit() and (st := _stat(int(p.name))):
            children.setdefault(int(st[1]), []).append(int(p.name))
    out, todo = [], [root]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def _group_leader(pids: list[int]) -> int | None:
    """The guard: the one process below the bench that leads its own process group (the server's)."""
    return next((p for p in pids if (st := _stat(p)) and int(st[2]) == p), None)


class Bench:
    """A `llmrs bench` subprocess whose output is read as it comes."""

    def __init__(self, args: list[str], cwd: Path):
        self.proc = subprocess.Popen([sys.executable, "-m", "llmrs", "bench", *args], cwd=cwd, env=_env(),
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.lines: list[str] = []
        threading.Thread(target=lambda: self.lines.extend(self.proc.stdout), daemon=True).start()

    @property
    def text(self) -> str:
        return "".join(self.lines)

    def wait_for_requests(self, log: Path) -> None:
        """Until the server has answered a completion request (the run is under way)."""
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, f"bench ended early ({self.proc.returncode}):\n{self.text}"
            if log.is_file() and "POST /v1/completions" in log.read_text(errors="replace"):
                return
            time.sleep(0.1)
        pytest.fail(f"no completion request within {START_TIMEOUT_S}s:\n{self.text}")


def _assert_all_gone(pids: list[int], server_group: int | None) -> None:
    deadline = time.monotonic() + GONE_TIMEOUT_S
    left: list[int] = []
    while time.monotonic() < deadline:
        left = [p for p in pids if _stat(p) is not None]
        if server_group is not None:
            left += group_members(server_group) or []
        if not left:
            return
        time.sleep(0.2)
    pytest.fail(f"still running {GONE_TIMEOUT_S}s after the bench ended: "
                + ", ".join(f"{p} {_cmdline(p)[:120]!r}" for p in set(left)))


def _interrupt(tmp_path: Path, sig: int, n: int, serve_args: str, output_len: int) -> tuple[Bench, list[int], int]:
    """Starts a bench of n requests, sends `sig` once requests are in flight; returns the bench (ended), the
    processes below it at that moment and the server's process group."""
    out = tmp_path / "res"
    b = Bench(["-n", str(n), "-c", "2", "--input-len", "16", "--output-len", str(output_len), "--ignore-eos",
               "--workers", "2", "-o", str(out), "--name", "sig", "--serve-args", serve_args], tmp_path)
    b.wait_for_requests(out / "sig.server.log")
    below = _descendants(b.proc.pid)
    server_group = _group_leader(below)
    members = group_members(server_group) if server_group else []
    assert members and len(members) >= 3, below  # the guard, the server, its engine core (+ resource tracker)
    os.kill(b.proc.pid, sig)
    b.proc.wait(timeout=GONE_TIMEOUT_S)
    return b, below, server_group


def _assert_saved_interrupted(tmp_path: Path, b: Bench, sig: int, n: int) -> None:
    assert b.proc.returncode == 128 + sig, b.text
    doc = json.loads((tmp_path / "res" / "sig.json").read_text())
    assert doc["interrupted"] == signal.Signals(sig).name and doc["finished_at"]
    (run,) = doc["runs"]
    s = run["summary"]
    assert run["interrupted"] is True
    assert s["failed"] == 0, s["failures"]  # cut off or never sent: not failures
    assert s["completed"] + s["cut_off"] + s["not_sent"] == n and s["not_sent"] >= 1, s
    rows = (tmp_path / "res" / run["csv"]).read_text().splitlines()
    assert len(rows) == 1 + n  # every request has its row, the never-sent ones too
    assert f"interrupted by {signal.Signals(sig).name}" in b.text and "server stopped" in b.text


def test_sigterm_saves_what_finished_stops_the_server_and_exits_143(tmp_path):
    """On the embedded model (the `make run` set-up), a small KV cache to start faster."""
    n = 8
    b, below, group = _interrupt(tmp_path, signal.SIGTERM, n, "--max-model-len 128 --kv-cache-tokens 1024", 48)
    _assert_saved_interrupted(tmp_path, b, signal.SIGTERM, n)
    _assert_all_gone(below, group)


@pytest.mark.parametrize("sig", [signal.SIGHUP, signal.SIGINT], ids=["SIGHUP", "SIGINT"])
def test_sighup_and_sigint_end_the_same_way(tmp_path, tiny_qwen2, sig):
    n = 60
    b, below, group = _interrupt(tmp_path, sig, n, f"{tiny_qwen2} --device cpu", 128)
    _assert_saved_interrupted(tmp_path, b, sig, n)
    _assert_all_gone(below, group)


def test_sigkill_of_the_bench_takes_its_server_and_workers_along(tmp_path, tiny_qwen2):
    b, below, group = _interrupt(tmp_path, signal.SIGKILL, 60, f"{tiny_qwen2} --device cpu", 128)
    assert b.proc.returncode == -signal.SIGKILL
    _assert_all_gone(below, group)
    log = (tmp_path / "res" / "sig.server.log").read_text()
    assert "Shutting down" in log  # the guard's SIGTERM: a graceful stop, not a kill


def test_an_interrupt_while_the_server_starts_stops_it(tmp_path):
    """SIGTERM while the bench waits for /health (a server command that never answers): exit 143, the server's
    group gone, nothing measured (no results file)."""
    out = tmp_path / "res"
    server = f"{sys.executable} -c 'import time; time.sleep(600)'"
    b = Bench(["--server-cmd", server, "-n", "2", "-o", str(out), "--name", "start"], tmp_path)
    deadline = time.monotonic() + START_TIMEOUT_S
    while not [p for p in _descendants(b.proc.pid) if b"time.sleep" in _cmdline(p)]:
        assert time.monotonic() < deadline and b.proc.poll() is None, b.text
        time.sleep(0.05)
    below = _descendants(b.proc.pid)
    os.kill(b.proc.pid, signal.SIGTERM)
    assert b.proc.wait(timeout=GONE_TIMEOUT_S) == 128 + signal.SIGTERM, b.text
    _assert_all_gone(below, _group_leader(below))
    assert not (out / "start.json").exists()
    assert "interrupted by SIGTERM: nothing was measured" in b.text
