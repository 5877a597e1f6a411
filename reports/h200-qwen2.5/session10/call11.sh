#!/usr/bin/env bash
# session10 call11 (carry .whl; _base = `git archive 9e42752 llmrs`): gemv_q4's staged form (x's B registers and
# each group's X made once a block in shared memory: no ones mma, one 16-byte shared load a k32 block).
#   1. tests/test_gemv_q4_gpu.py (both forms); 2. bench_gemv_q4.py, staged vs not, and 5 blocks an SM;
#   3. the 7B AWQ single-stream decode bench, 9e42752 (base) vs this tree, twice.
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/llmrs-s10c11}; mkdir -p "$OUT"; R=/tmp/res-s10c11; mkdir -p $R
. scripts/gpu_lib.sh
use_wheels || exit 1
{
step "gemv GPU tests"
timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_gemv_q4_gpu.py > $R/tests.log 2>&1
grep -E "^(FAILED|ERROR)|passed|failed|Error" $R/tests.log | tail -8
step "bench_gemv_q4 7B T=1"
timeout 150 python3 scripts/bench_gemv_q4.py --splits 1,4,8 --variants "-DGV_MINB=5" --json $R/gemv-7b.json 2>&1 \
  | grep -E "variant|gate_up|down|choice|layers" | grep -v "matvec_q4  "
} 2>&1 | tee $OUT/summary.txt
OUT=$OUT/ab TESTS=0 MODELS="" AWQ=1 BASE_TREE=$PWD/_base AB_VALUES="base 1 base 1" \
  bash scripts/gpu_ab.sh 2>&1 | grep -E "AWQ|ms_per|rror" | tee -a $OUT/summary.txt
tar czf $OUT/results.tgz -C $R .
