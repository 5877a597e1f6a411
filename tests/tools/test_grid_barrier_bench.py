"""probes/grid_barrier_bench.py (a GPU probe: what a dependent kernel boundary costs) without a GPU: its kernels
compile spill-free for sm_90 (`llmrs ptx-check`, as CI checks the engine's), and a shape it cannot run is refused
with a message before any GPU work."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from probes import grid_barrier_bench as gbb

ROOT = Path(__file__).resolve().parents[2]

KERNELS = ("chain_mv", "chain4_mv", "chain_empty", "chain4_empty", "chain_flag_mv", "chain_flag2_mv",
           "chain_flag3_mv", "persistent_mv")


def test_the_probe_kernels_compile_without_local_memory(tmp_path):
    src = tmp_path / "grid_barrier_bench.cu"
    src.write_text(gbb.SRC)
    r = subprocess.run([sys.executable, "-m", "llmrs", "ptx-check", str(src), "--arch", "sm_90", "--all"],
                       capture_output=True, text=True, cwd=ROOT, timeout=300)  # (--all: every kernel's row)
    assert r.returncode == 0, r.stdout + r.stderr
    for name in KERNELS:
        assert name in r.stdout, name
    assert f"clean: {len(KERNELS)} kernel/arch pair(s)" in r.stdout


@pytest.mark.parametrize("args", [["--k", "1024"], ["--n", "4096"]])


def test_shapes_it_cannot_run_are_refused(args, capsys, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["grid_barrier_bench.py", *args])
    assert gbb.main() == 2
    assert "--k must be 2048" in capsys.readouterr().err
