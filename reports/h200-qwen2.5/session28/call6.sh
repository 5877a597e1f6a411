#!/usr/bin/env bash
# Session 28, call 6 (carry .whl, ~2.5 min): merged deltas for a consumer behind the engine (engine.take_merged),
# A/B with LLMRS_MERGE_DELTAS=0 / 1 on fresh synthetic Qwen2.5-0.5B servers (the host-bound regime of call 4: GPU
# step 1.9 ms at 256 decodes, server TPOT 3.7-5.6 ms), 256 concurrent twice a server (prompt 256, 256 new tokens,
# own prompts each run), off / on / off / on; each run's line printed as it ends.
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/llmrs-s28}; mkdir -p "$OUT"; R=/tmp/res-s28c6; rm -rf $R; mkdir -p $R
. scripts/gpu_lib.sh
use_wheels || exit 1
{
i=0
for v in 0 1 0 1; do
  i=$((i + 1))
  SERVE_MODEL=qwen2.5-0.5b serve_up m$v-$i LLMRS_MERGE_DELTAS=$v && {
    for run in 1 2; do
      load_bench bench-0.5b-merge$v-s$i-run$run-c256 256 $((3000 + 10 * i + run))
      run_line $R/bench-0.5b-merge$v-s$i-run$run-c256.json
    done
    serve_down
  }
done
} 2>&1 | tee $OUT/call6.log
tar -C $R -cJf $OUT/bench.tar.xz $(cd $R && ls bench-*.json serve-*.log 2>/dev/null)
