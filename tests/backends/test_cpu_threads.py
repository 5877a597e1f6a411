"""The CPU backend's BLAS threads: `limit_threads` caps numpy's pool in the process that runs the model, and
`llmrs serve`'s engine (serving_engine, on the embedded model) applies EngineConfig.cpu_threads. Each check runs in a fresh interpreter:
the limit is process-wide."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _run(code: str) -> str:
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_limit_threads_caps_the_blas_pool():
    got = _run("import numpy as np\n"
               "from threadpoolctl import threadpool_info\n"
               "from llmrs.backends.cpu import limit_threads, available_cores\n"
               "limit_threads(1)\n"
               "pools = [p for p in threadpool_info() if p['user_api'] == 'blas']\n"
               "print(len(pools), max(p['num_threads'] for p in pools), available_cores() >= 1)")
    assert got == "1 1 True"


def test_free_cores_counts_what_other_work_leaves():
    from llmrs.backends.cpu import available_cores, free_cores

    assert 1 <= free_cores(0.05) <= available_cores()


def test_the_serving_engine_runs_with_the_configured_threads():
    got = _run("from threadpoolctl import threadpool_info\n"
               "from llmrs.engine.llm_engine import serving_config, serving_engine\n"
               "engine = serving_engine(None, serving_config(device='cpu', kv_cache_tokens=256, cpu_threads=1))\n"
               "print(max(p['num_threads'] for p in threadpool_info() if p['user_api'] == 'blas'))")
    assert got == "1"
