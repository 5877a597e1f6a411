#!/usr/bin/env bash
# Session 15, call 12 (carry .whl): the final tree (the 4-bit wgmma form at 128-256 tokens, every shape):
# tests/test_gemm_q4_gpu.py, then the 7B AWQ server (defaults) at 64 and 256 concurrent, twice each.
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/llmrs-s15}; mkdir -p "$OUT"; R=/tmp/res-s15c12; rm -rf $R; mkdir -p $R
. scripts/gpu_lib.sh
use_wheels || exit 1
{
TEST_TIMEOUT=100 TEST_PATHS="tests/test_gemm_q4_gpu.py" gpu_tests
step "server qwen2.5-7b-awq (defaults): 64 and 256 concurrent, twice"
SERVE_MODEL=qwen2.5-7b-awq serve_up awq-s15c12 && {
  for run in 1 2; do for c in 64 256; do load_bench bench-7b-awq-s15c12-run$run-c$c $c $((5300 + 100 * run + c)); done; done
  serve_down
}
bench_table $R
} 2>&1 | tee $OUT/summary.txt
tar czf $OUT/results.tgz -C $R .
