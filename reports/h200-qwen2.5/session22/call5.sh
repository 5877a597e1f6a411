#!/usr/bin/env bash
# Session 22, call 5 (carry .whl, ~2.5 min): the draw's walk computed the filters' keys in valid lanes only, so a
# ballot inside them missed lanes where a warp's range ended mid-step (call4's tie test, debug_ties.py: top_k then
# top_p over a 100-entry list stopped). Fixed; the sampling tests again, the tie cases, then bench_sample.py.
set -uo pipefail
export PYTHONUNBUFFERED=1
. scripts/gpu_lib.sh
use_wheels || exit 1
R=/tmp/res-s22c5; mkdir -p $R
{
step "tie cases"
timeout 60 python3 reports/h200-qwen2.5/session22/debug_ties.py 2>&1 | tail -8
step "tests"
timeout 150 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_cuda_kernels.py -k "sampl" > $R/tests.log 2>&1
grep -E "^(FAILED|ERROR)|passed|failed" $R/tests.log | tail -12
step "sampler: before / now"
timeout 90 python3 reports/h200-qwen2.5/session22/bench_sample.py --json $R/sample.json 2>&1 | tee $R/sample.log
} 2>&1 | tee $OUT/summary.txt
tar czf $OUT/results.tgz -C $R .
