#!/usr/bin/env bash
# Session 24, call 4 (carry .whl, ~4 min): more runs of issue 6's under-load comparison on the final tree, the other
# order than call3 (bf16 server first): 7B bf16 and 7B AWQ, 256 concurrent four times each (prompt 256, 256 new
# tokens, every run its own prompts; the first run after start-up is a cold one).
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/llmrs-s24}; mkdir -p "$OUT"; R=/tmp/res-s24c4; rm -rf $R; mkdir -p $R
. scripts/gpu_lib.sh
use_wheels || exit 1
{
for m in qwen2.5-7b qwen2.5-7b-awq; do
  step "server $m (defaults): 256 concurrent four times"
  SERVE_MODEL=$m serve_up $m && {
    for run in 1 2 3 4; do load_bench bench-${m#qwen2.5-}-run$run-c256 256 $((3400 + 100 * run)); done
    serve_down
  }
done
bench_table $R
} 2>&1 | tee $OUT/summary.txt
for f in $R/serve-*.log; do tail -5 $f > $R/$(basename $f .log)-tail.log; rm $f; done
rm -f $R/*.csv; tar czf $OUT/results.tgz -C $R .
