#!/usr/bin/env bash
# Session 29, call 1 (carry .whl and .gguf with the SmolLM2 GGUF's first part p00, moved to /tmp/models for call 3):
# merged deltas (engine.take_merged, session 28) A/B, LLMRS_MERGE_DELTAS=0 / 1 alternated on fresh synthetic
# Qwen2.5-0.5B servers (host-bound at 256 concurrent) then 3B servers, 256 concurrent twice a server (prompt 256,
# 256 new tokens, each run its own prompts); each run's line printed as it ends.
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/llmrs-s29}; mkdir -p "$OUT"; R=/tmp/res-s29c1; rm -rf $R; mkdir -p $R
mkdir -p /tmp/models && mv .gguf/p00 /tmp/models/p00
. scripts/gpu_lib.sh
use_wheels || exit 1
{
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader; nproc
i=0
for m in qwen2.5-0.5b qwen2.5-3b; do
  for v in 0 1 0 1; do
    i=$((i + 1))
    SERVE_MODEL=$m serve_up $m-m$v-$i LLMRS_MERGE_DELTAS=$v && {
      for run in 1 2; do
        load_bench bench-$m-merge$v-s$i-run$run-c256 256 $((4000 + 10 * i + run))
        run_line $R/bench-$m-merge$v-s$i-run$run-c256.json
      done
      serve_down
    }
  done
done
} 2>&1 | tee $OUT/call1.log
tar -C $R -cJf $OUT/bench.tar.xz $(cd $R && ls bench-*.json serve-*.log 2>/dev/null)
