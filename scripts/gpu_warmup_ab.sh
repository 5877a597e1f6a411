#!/usr/bin/env bash
# One call on a lent H200 (carry .whl; ~5 min): the serving warm-up's budget-filling step (LLMEngine.warmup
# full_step) against the single request alone (LLMRS_WARMUP=request): fresh 7B bf16 servers in turn, each timed to
# /health, then three 256-concurrent runs (prompt 256, 256 new tokens, every run its own prompts): is the first
# run after start still the slow one?
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/llmrs-warm}; mkdir -p "$OUT"; R=/tmp/res-warm; rm -rf $R; mkdir -p $R
. "$(dirname "$0")/gpu_lib.sh"
use_wheels || exit 1
{
for i in 1 2; do
  for w in request 1; do
    step "server LLMRS_WARMUP=$w ($i)"
    t0=$(date +%s.%N)
    serve_up w$w-$i LLMRS_WARMUP=$w || continue
    echo "ready after $(python3 -c "print(round($(date +%s.%N) - $t0, 1))") s"
    for run in 1 2 3; do load_bench bench-7b-w$w-s$i-r$run 256 $((8000 + 100 * i + 10 * run)); done
    serve_down
  done
done
bench_table $R
} 2>&1 | tee $OUT/summary.txt
tar czf $OUT/results.tgz -C $R .
