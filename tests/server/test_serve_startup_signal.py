"""SIGTERM / SIGHUP while `llmrs serve` loads the model (before uvicorn's handlers are installed): the server says
it stopped and exits 0, its engine core process exits too, and nothing prints a traceback (the core used to raise
BrokenPipeError sending CoreReady to a server killed mid-load)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.server.test_server import MODEL, ROOT


def _children(pid: int) -> list[int]:
    try:
        return [int(c) for t in os.listdir(f"/proc/{pid}/task")
                for c in Path(f"/proc/{pid}/task/{t}/children").read_text().split()]
    except (FileNotFoundError, ProcessLookupError):
        return []


def _is_core(pid: int) -> bool:
    try:
        return b"spawn_main" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"
    except OSError:
        return False


@pytest.mark.skipif(not Path("/proc").exists(), reason="reads the process tree from /proc")
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_a_signal_while_the_model_loads_stops_the_server_cleanly(tmp_path, sig):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.Popen([sys.executable, "-m", "llmrs", "serve", MODEL, "--port", "0", "--device", "cpu"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, cwd=tmp_path)
    try:
        deadline = time.monotonic() + 120
        core = None
        while core is None and time.monotonic() < deadline and proc.poll() is None:
            core = next((c for c in _children(proc.pid) if _is_core(c)), None)  # loading: the core is building
            time.sleep(0.02)
        assert core is not None, "the engine core process never started"
        proc.send_signal(sig)
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    text = out.decode(errors="replace")
    assert proc.returncode == 0, text
    assert f"stopped while loading {MODEL}" in text
    assert "Traceback" not in text and "BrokenPipeError" not in text, text
    for _ in range(200):  # the core exits once its pipe to the server is closed
        if not _alive(core):
            break
        time.sleep(0.05)
    assert not _alive(core), "the engine core outlived the server"
