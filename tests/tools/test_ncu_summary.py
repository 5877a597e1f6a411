"""tools/ncu_summary.py on a real Nsight Compute text report (an H200: gemv_q4z and matvec_q4z_t1
on the 7B's gate_up at one token, with the stall-reason metrics), through its command line."""

import json
import subprocess
import sys
from pathlib import Path

from tools import ncu_summary

ROOT = Path(__file__).resolve().parents[2]
REPORT = ROOT / "tests" / "fixtures" / "ncu" / "gemv_matvec_h200.txt"


def test_parses_every_launch_with_its_figures_and_stalls():
    rows = ncu_summary.parse(REPORT.read_text())
    assert [r["kernel"] for r in rows] == ["gemv_q4z", "matvec_q4z_t1"]
    gemv, mv = rows
    assert gemv["grid"] == [1184, 1, 1] and gemv["block"] == [128, 1, 1]
    assert gemv["duration"] == 41.92 and gemv["dram_pct"] == 36.84 and gemv["issued_per_scheduler"] == 0.53
    assert gemv["instructions"] == 13_724_928 and gemv["registers"] == 127 and gemv["occupancy_pct"] == 21.25
    assert gemv["sm_ghz"] == 1.36  # ncu's locked clock, not the boost clock
    assert gemv["stalls"]["long_scoreboard"] == 1.83 and gemv["stalls"]["wait"] == 1.29
    assert len(gemv["stalls"]) >= 15
    assert mv["registers"] == 72 and mv["stalls"]["long_scoreboard"] == 3.07


def test_command_line_table_json_and_labels(tmp_path):
    labels = tmp_path / "labels.json"
    labels.write_text(json.dumps(["gate_up 37888x3584 gemv_q4", "gate_up 37888x3584 matvec_q4"]))
    out = tmp_path / "t.json"
    p = subprocess.run([sys.executable, str(ROOT / "tools" / "ncu_summary.py"), str(REPORT), "--labels",
                        str(labels), "--json", str(out)], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert "gate_up 37888x3584 gemv_q4" in p.stdout and "1184x1x1" in p.stdout and "long_scoreboard" in p.stdout
    table = json.loads(out.read_text())
    assert table[0]["issue %"] == 53.0 and table[0]["top stalls"][0] == ["long_scoreboard", 1.83]
    assert table[1]["label"] == "gate_up 37888x3584 matvec_q4"


def test_user_mistakes_get_one_line(tmp_path):
    run = lambda *a: subprocess.run([sys.executable, str(ROOT / "tools" / "ncu_summary.py"), *a],  # noqa: E731
                                    capture_output=True, text=True, timeout=60)
    p = run(str(tmp_path / "missing.txt"))
    assert p.returncode == 1 and "no such file" in p.stderr and "Traceback" not in p.stderr
    empty = tmp_path / "empty.txt"
    empty.write_text("==PROF== nothing here\n")
    p = run(str(empty))
    assert p.returncode == 1 and "no profiled kernels" in p.stderr and "Traceback" not in p.stderr
