"""Ctrl-C during `llmrs ptx-check` stops the parallel compiles at once: exit 130, no worker or ptxas left
running, no temporary files left behind."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _ours(tmp: Path) -> list[str]:
    """Processes (workers, ptxas) whose command line or temporary files point into `tmp`, or our checkers."""
    out = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True).stdout
    return [ln for ln in out.splitlines()[1:] if str(tmp) in ln]


def test_ctrl_c_stops_workers_and_ptxas_and_removes_temporary_files(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TMPDIR": str(tmp_path)}
    p = subprocess.Popen([sys.executable, "-m", "llmrs", "ptx-check", "--arch", "sm_80,sm_86", "-j", "2"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT,
                         start_new_session=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not any(tmp_path.glob("llmrs-ptx-check-*")):
        time.sleep(0.2)  # the parallel run has started once its scratch directory exists
    assert any(tmp_path.glob("llmrs-ptx-check-*")), "no parallel run started"
    time.sleep(2)
    os.killpg(p.pid, signal.SIGINT)  # as a terminal's Ctrl-C: the whole foreground group
    out, err = p.communicate(timeout=60)
    assert p.returncode == 130, (p.returncode, out, err)
    assert "Traceback" not in err
    time.sleep(0.5)
    assert _ours(tmp_path) == []
    assert list(tmp_path.iterdir()) == []
