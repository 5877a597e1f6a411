#!/usr/bin/env bash
# session10 call12 (carry .whl; _base = `git archive 9e42752 llmrs`): gemv_q4's staged form, its staging now
# loading 4 entries a thread at once and X summed from the staged values (call11: 3.93 vs 2.76 ms/token: the
# staging's serial L2 round trips).
#   1. the whole GPU suite; 2. bench_gemv_q4.py, staged vs not;
#   3. the 7B AWQ single-stream decode bench, 9e42752 (base) vs this tree, twice.
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/llmrs-s10c11}; mkdir -p "$OUT"; R=/tmp/res-s10c11; mkdir -p $R
. scripts/gpu_lib.sh
use_wheels || exit 1
{
R=$R; TEST_TIMEOUT=300 gpu_tests
step "bench_gemv_q4 7B T=1"
timeout 150 python3 scripts/bench_gemv_q4.py --splits 1,4,8 --json $R/gemv-7b.json 2>&1 \
  | grep -E "variant|gate_up|down|choice|layers" | grep -v "matvec_q4  "
} 2>&1 | tee $OUT/summary.txt
OUT=$OUT/ab TESTS=0 MODELS="" AWQ=1 BASE_TREE=$PWD/_base AB_VALUES="base 1 base 1" \
  bash scripts/gpu_ab.sh 2>&1 | grep -E "AWQ|ms_per|rror" | tee -a $OUT/summary.txt
tar czf $OUT/results.tgz -C $R .
