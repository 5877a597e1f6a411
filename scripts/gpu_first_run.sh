#!/usr/bin/env bash
# One call on a lent H200 (carry .whl; ~5 min): why is the first 256-concurrent run after a server starts the
# slowest (session 17 calls 7-8: run 1's TTFT mean 1.38-1.47 s against 1.12-1.35 s later, TPOT alike; a warm-up
# step filling the 8192-token budget did not change it)? Hypothesis: CUDA's lazy module loading, paid at the first
# use of each cuBLAS kernel that the mixed prefill steps' shapes pick. Fresh 7B bf16 servers in turn with
# CUDA_MODULE_LOADING=EAGER and with the default (lazy), each timed to /health, three runs each, traced
# (LLMRS_TRACE_FILE): scripts/step_trace_runs.py then shows per run where the steps took longer (the prefill
# burst, decode steps, the eager steps' host enqueue). If EAGER's run 1 matches its runs 2-3, warm the mixed
# steps' GEMM shapes up at start (or load cuBLAS's modules eagerly).
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/llmrs-first}; mkdir -p "$OUT"; R=/tmp/res-first; rm -rf $R; mkdir -p $R
. "$(dirname "$0")/gpu_lib.sh"
use_wheels || exit 1
{
for i in 1 2; do
  for ml in EAGER LAZY; do
    step "server CUDA_MODULE_LOADING=$ml ($i)"
    t0=$(date +%s.%N)
    SERVE_WAIT=300 serve_up $ml-$i CUDA_MODULE_LOADING=$ml LLMRS_TRACE_FILE=$R/trace-$ml-$i.log || continue
    echo "ready after $(python3 -c "print(round($(date +%s.%N) - $t0, 1))") s"
    load_runs bench-7b-$ml-s$i 3 $((9000 + 100 * i))
    serve_down
    python3 scripts/step_trace_runs.py $R/trace-$ml-$i.log  # per run: the prefill burst, decode steps, enqueue
  done
done
bench_table $R
} 2>&1 | tee $OUT/summary.txt
tar czf $OUT/results.tgz -C $R .
