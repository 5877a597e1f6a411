#!/usr/bin/env bash
# Session 32, call 5 (carry .whl), after the graph-capture fix (the driver's cluster counts out of the workspace
# dict): the graphs' GPU tests (the new 128-dim-heads warm-up case: every bucket at caps 256 and 512 captured, none
# failed), then call4's deque-patch A/B again (call4's servers all ran eagerly: 27 failed captures each), three
# 0.5B servers each way, then one 7B server at 256 concurrent twice (issue 8's 16,000 tok/s figure).
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/llmrs-s32}; mkdir -p "$OUT"; R=/tmp/res-s32c5; rm -rf $R; mkdir -p $R
. scripts/gpu_lib.sh
use_wheels || exit 1
A=$PWD; B=/tmp/tree-b; rm -rf $B; mkdir -p $B
cp -a llmrs scripts pyproject.toml $B/; P=$A/reports/h200-qwen2.5/session29/stream_deltas_without_queue.patch
python3 -c "import sys; t = open(sys.argv[1]).read(); print(t[:t.index('diff --git a/tests')], end='')" $P > $B/llmrs.patch
(cd $B && patch -p1 -s -i llmrs.patch) || { echo "patch failed"; exit 1; }
{
timeout 200 python3 -m pytest -q -m gpu tests/test_cuda_graphs.py -p no:cacheprovider > $R/graph_tests.log 2>&1
grep -E "passed|failed|^FAILED|^E " $R/graph_tests.log | head -8
i=0
for v in A B A B A B; do
  i=$((i + 1))
  if [ $v = A ]; then cd $A; export PYTHONPATH=$A:/tmp/site; else cd $B; export PYTHONPATH=$B:/tmp/site; fi
  SERVE_MODEL=qwen2.5-0.5b serve_up 0.5b-$v-$i && {
    for run in 1 2; do
      load_bench bench-0.5b-$v-s$i-run$run-c256 256 $((6000 + 10 * i + run))
      run_line $R/bench-0.5b-$v-s$i-run$run-c256.json
    done
    serve_down
  }
  echo "failed captures: $(grep -c 'capture failed' $R/serve-0.5b-$v-$i.log)"
done
cd $A; export PYTHONPATH=$A:/tmp/site
SERVE_MODEL=qwen2.5-7b serve_up 7b && {
  for run in 1 2; do
    load_bench bench-7b-s7-run$run-c256 256 $((7000 + run)); run_line $R/bench-7b-s7-run$run-c256.json
  done
  serve_down
}
echo "failed captures: $(grep -c 'capture failed' $R/serve-7b.log)"
} 2>&1 | tee $OUT/call5.log
tar -C $R -cJf $OUT/bench.tar.xz $(cd $R && ls bench-*.json serve-*.log graph_tests.log 2>/dev/null)
