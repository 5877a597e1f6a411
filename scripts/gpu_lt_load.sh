#!/usr/bin/env bash
# One call on a lent H200 (carry .whl; ~4 min): cuBLASLt (LLMRS_CUBLASLT) under load, the 7B bf16 server at 256
# concurrent (prompt 256, 256 new tokens, every run its own prompts), off / on / off / on on fresh servers, three
# runs each; the table last.
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/llmrs-ltload}; mkdir -p "$OUT"; R=/tmp/res-ltload; rm -rf $R; mkdir -p $R
. "$(dirname "$0")/gpu_lib.sh"
use_wheels || exit 1
{
for i in 1 2; do
  for lt in 0 1; do
    step "server LLMRS_CUBLASLT=$lt ($i)"
    serve_up lt$lt-$i LLMRS_CUBLASLT=$lt || continue
    load_runs bench-7b-lt$lt-s$i 3 $((7000 + 100 * i + lt))
    serve_down
  done
done
bench_table $R
} 2>&1 | tee $OUT/summary.txt
tar czf $OUT/results.tgz -C $R .
