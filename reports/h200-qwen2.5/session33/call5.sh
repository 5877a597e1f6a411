#!/usr/bin/env bash
# Session 33, call 5 (carry .whl): the whole GPU suite on the tree with the GEMV's st.async cluster merge.
set -uo pipefail
export PYTHONUNBUFFERED=1
. scripts/gpu_lib.sh
use_wheels || exit 1
R=/tmp/res5; rm -rf $R; mkdir -p $R
{
timeout 540 python3 -m pytest -q -m gpu tests -p no:cacheprovider > $R/gpu_tests.log 2>&1
echo "pytest rc=$?"
grep -E "passed|failed|^FAILED|^ERROR" $R/gpu_tests.log | tail -15
} 2>&1 | tee $OUT/call5.log
gzip -c $R/gpu_tests.log > $OUT/gpu_tests.log.gz
