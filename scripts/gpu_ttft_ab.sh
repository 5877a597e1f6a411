#!/usr/bin/env bash
# One call on a lent H200 (carry .whl; ~3 min): the 7B's TTFT at a 256-token prompt with the early write of an
# add to the engine core (LLMRS_EARLY_FLUSH=1, the default) against the write at the end of the event-loop pass
# (=0), alternated twice, each through llmrs bench's http1 client and httpx (each run its own prompts); then one
# traced run of each (LLMRS_TRACE_FILE: add_request -> cmd_sent -> core_recv -> step_planned / step_launched ->
# client_first).
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/llmrs-ttft}; mkdir -p "$OUT"; R=/tmp/res-ttft; rm -rf $R; mkdir -p $R
. "$(dirname "$0")/gpu_lib.sh"
use_wheels || exit 1
TTFT_N=${N:-24}
{
for round in 1 2; do
  for ef in 0 1; do
    step "round $round, LLMRS_EARLY_FLUSH=$ef"
    serve_up ef$ef-r$round LLMRS_EARLY_FLUSH=$ef || continue
    LLMRS_BENCH_HTTPX=0 ttft_bench ttft-ef$ef-r$round-http1 256 $((round * 10 + 1)) "early_flush=$ef http1"
    LLMRS_BENCH_HTTPX=1 ttft_bench ttft-ef$ef-r$round-httpx 256 $((round * 10 + 2)) "early_flush=$ef httpx"
    serve_down
  done
done
for ef in 0 1; do
  step "traced, LLMRS_EARLY_FLUSH=$ef"
  rm -f $R/trace-ef$ef.txt
  serve_up traced-ef$ef LLMRS_EARLY_FLUSH=$ef LLMRS_TRACE_FILE=$R/trace-ef$ef.txt || continue
  LLMRS_TRACE_FILE=$R/trace-ef$ef.txt ttft_bench traced-ef$ef 256 $((50 + ef))
  python3 scripts/ttft_trace.py $R/trace-ef$ef.txt --skip 2 --json $R/trace-ef$ef.json
  serve_down
done
} 2>&1 | tee $OUT/summary.txt
tar czf $OUT/results.tgz -C $R .
