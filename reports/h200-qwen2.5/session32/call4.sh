#!/usr/bin/env bash
# Session 32, call 4 (carry .whl): session 29's deque patch (session29/stream_deltas_without_queue.patch: each
# stream's asyncio.Queue in ProcessEngine replaced by a deque + one waiter future) A/B on fresh synthetic
# Qwen2.5-0.5B servers (host-bound at 256 concurrent): main's tree (A) and a patched copy (B) alternated, four servers
# each, 256 concurrent twice a server (prompt 256, 256 new tokens, each run its own prompts).
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/llmrs-s32}; mkdir -p "$OUT"; R=/tmp/res-s32c4; rm -rf $R; mkdir -p $R
. scripts/gpu_lib.sh
use_wheels || exit 1
A=$PWD; B=/tmp/tree-b; rm -rf $B; mkdir -p $B
cp -a llmrs scripts pyproject.toml $B/; P=$A/reports/h200-qwen2.5/session29/stream_deltas_without_queue.patch
# the patch's llmrs part only (its test file is not copied)
python3 -c "import sys; t = open(sys.argv[1]).read(); print(t[:t.index('diff --git a/tests')], end='')" $P > $B/llmrs.patch
(cd $B && patch -p1 -s -i llmrs.patch) || { echo "patch failed"; exit 1; }
grep -c "_Deltas" $B/llmrs/engine/core_process.py
{
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nproc
i=0
for v in A B A B A B A B; do
  i=$((i + 1))
  if [ $v = A ]; then cd $A; export PYTHONPATH=$A:/tmp/site; else cd $B; export PYTHONPATH=$B:/tmp/site; fi
  SERVE_MODEL=qwen2.5-0.5b serve_up 0.5b-$v-$i && {
    for run in 1 2; do
      load_bench bench-0.5b-$v-s$i-run$run-c256 256 $((5000 + 10 * i + run))
      run_line $R/bench-0.5b-$v-s$i-run$run-c256.json
    done
    serve_down
  }
done
cd $A
} 2>&1 | tee $OUT/call4.log
tar -C $R -cJf $OUT/bench.tar.xz $(cd $R && ls bench-*.json serve-*.log 2>/dev/null)
