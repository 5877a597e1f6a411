#!/usr/bin/env bash
# Session 22, call 4 (carry .whl, ~3 min): the sampler's masses as two 32-bit words (call3: a 64-bit shared atomicAdd
# is a compare-and-swap loop) and its candidate list (top_k / top_p candidates in one shared-memory list after the
# first pass: 3 reads of the row instead of ~10): the sampling, parity and graph tests, then bench_sample.py.
set -uo pipefail
export PYTHONUNBUFFERED=1
. scripts/gpu_lib.sh
use_wheels || exit 1
R=/tmp/res-s22c4; mkdir -p $R
{
step "tests"
timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_cuda_kernels.py -k "sampl" \
  tests/test_cuda_parity.py tests/test_cuda_graphs.py > $R/tests.log 2>&1
grep -E "^(FAILED|ERROR)|passed|failed" $R/tests.log | tail -12
step "sampler: before / now"
timeout 120 python3 reports/h200-qwen2.5/session22/bench_sample.py --json $R/sample.json 2>&1 | tee $R/sample.log
} 2>&1 | tee $OUT/summary.txt
tar czf $OUT/results.tgz -C $R .
