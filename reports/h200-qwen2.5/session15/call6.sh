#!/usr/bin/env bash
# Session 15, call 6 (carry .whl, now with httpx2 and friends, which openai 3.57 imports): `pytest -m gpu tests`
# on the tree with the 4-bit wgmma GEMM and the GEMM's bf16 input on by default (call 5's run stopped at collection).
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/llmrs-s15}; mkdir -p "$OUT"; R=/tmp/res-s15c6; rm -rf $R; mkdir -p $R
. scripts/gpu_lib.sh
use_wheels || exit 1
{ TEST_TIMEOUT=480 gpu_tests; } 2>&1 | tee $OUT/summary.txt
cp $R/gpu_tests.log $R/gpu_figures.jsonl $OUT/ 2>/dev/null
