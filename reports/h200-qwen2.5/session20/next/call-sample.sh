#!/usr/bin/env bash
# For the next lease (written at the end of session 20, not run), on branch exp/sample-coalesced (carry .whl, ~2
# min): sample_tokens' first pass strided over the threads (coalesced), against main's, then the GPU sampling tests.
set -uo pipefail
export PYTHONUNBUFFERED=1
. scripts/gpu_lib.sh
use_wheels || exit 1
{
timeout 120 python3 reports/h200-qwen2.5/session20/next/bench_sample.py
timeout 120 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_cuda_kernels.py -k sampl 2>&1 | tail -2
} 2>&1 | tee $OUT/summary.txt
