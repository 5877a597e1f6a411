"""tools/ncu_sass_top.py on a real Nsight Compute source-page export (an H100: gemv_q4z_c4 for the
7B's gate_up built -DGV_ABLATE_X -DGV_ABLATE_LOADS), through its command line."""

import gzip
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CSV_GZ = ROOT / "tests" / "fixtures" / "ncu" / "gemv_q4_nomem_sass_h100.csv.gz"
SCRIPT = ROOT / "tools" / "ncu_sass_top.py"


def run(*args):
    return subprocess.run([sys.executable, str(SCRIPT), *map(str, args)], capture_output=True, text=True, timeout=60)


def test_the_most_sampled_instructions_first_with_their_share(tmp_path):
    csv_path = tmp_path / "source.csv"
    csv_path.write_bytes(gzip.decompress(CSV_GZ.read_bytes()))
    p = run(csv_path, "--top", 3)
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert len(lines) == 3
    assert lines[0].split() == ["5.4%", "LOP3.LUT", "R9,", "R16,", "R20,", "R32,", "0xfe,", "!PT"]
    assert lines[1].split()[:2] == ["4.8%", "HADD2.F32"] and lines[2].split()[:2] == ["4.4%", "LDS"]
    # every instruction listed: the shares sum to 100% (each rounded to 0.1) and never rise down the list
    shares = [float(line.split()[0].rstrip("%")) for line in run(csv_path, "--top", 10_000).stdout.splitlines()]
    assert len(shares) > 1000 and abs(sum(shares) - 100.0) < 0.05 * len(shares)
    assert shares == sorted(shares, reverse=True)


def test_a_file_without_samples_is_a_clear_error(tmp_path):
    bad = tmp_path / "details.csv"
    bad.write_text('"Kernel Name","gemv_q4z_c4",\n"Metric Name","Metric Value"\n"Duration","21.47"\n')
    p = run(bad)
    assert p.returncode != 0 and "no source table with warp-state samples" in p.stderr
