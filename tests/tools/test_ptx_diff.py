"""tools/ptx_diff.py (no GPU: NVRTC from the CUDA compiler wheels): a copy of the kernel tree is identical to
itself, and an edit to one kernel's body names exactly that kernel, in the file and arch where it is."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tools import ptx_diff as ptx_diff_module

ROOT = Path(__file__).resolve().parents[2]
KERNELS = ROOT / "llmrs" / "kernels_cu"


@pytest.fixture(scope="module")
def ptx_diff():
    mod = ptx_diff_module
    try:
        mod.find_toolchain()
    except Exception as e:  # the CUDA compiler wheels missing
        pytest.skip(f"no NVRTC here: {e}")
    return mod


def _copy(tmp_path: Path, name: str) -> Path:
    d = tmp_path / name
    d.mkdir()
    for f in ("common.cuh", "embedding.cu", "rope_kv.cu"):
        shutil.copy(KERNELS / f, d / f)
    return d


def test_identical_trees_and_one_edited_kernel(ptx_diff, tmp_path):
    a, b = _copy(tmp_path, "a"), _copy(tmp_path, "b")
    same = ptx_diff.diff_trees(a, b, ["sm_90"])
    assert [d.name for d in same] == ["embedding.cu", "rope_kv.cu"]
    assert all(d.identical and d.functions >= 2 for d in same)
    # a comment or a blank line changes no entry (the hash strips // comments: line numbers do not count)
    src = (b / "embedding.cu").read_text()
    (b / "embedding.cu").write_text("// a comment\n\n" + src)
    assert all(d.identical for d in ptx_diff.diff_trees(a, b, ["sm_90"]))
    # feed_tokens's body edited: only it changes, only in embedding.cu; a new kernel is listed as added
    edited = src.replace("if (t < T && feed[t] >= 0) ids[t] = prev[feed[t]];",
                         "if (t < T && feed[t] > 0) ids[t] = prev[feed[t]];")
    assert edited != src
    (b / "embedding.cu").write_text(edited + '\nextern "C" __global__ void extra_kernel(int* p) { p[0] = 1; }\n')
    diffs = {(d.name, d.arch): d for d in ptx_diff.diff_trees(a, b, ["sm_90", "sm_80"])}
    for arch in ("sm_90", "sm_80"):
        emb = diffs[("embedding.cu", arch)]
        assert emb.changed == ["feed_tokens"] and emb.added == ["extra_kernel"] and emb.removed == []
        assert "changed 1: feed_tokens" in emb.line() and not emb.identical
        assert diffs[("rope_kv.cu", arch)].identical


def test_cli_exit_status_and_bad_folder(ptx_diff, tmp_path):
    a = _copy(tmp_path, "a")
    run = [sys.executable, str(ROOT / "tools" / "ptx_diff.py")]
    ok = subprocess.run(run + [str(a), str(a), "--file", "rope_kv.cu"], capture_output=True, text=True)
    assert ok.returncode == 0 and "rope_kv.cu" in ok.stdout and "identical" in ok.stdout
    bad = subprocess.run(run + [str(a), str(tmp_path / "missing")], capture_output=True, text=True)
    assert bad.returncode == 2 and "not a folder" in bad.stderr and "Traceback" not in bad.stderr
