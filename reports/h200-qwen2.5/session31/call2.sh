#!/usr/bin/env bash
# Session 31, call 2 (no carry): the timeline's GPU test, the clusters each attn_cluster form runs at once, then
# `llmrs profile --timeline` at context 384 (the decode bench's mean context: prompt 256 + 256 steps) for 0.5B, 3B,
# 7B, 7B AWQ, and the 7B at context 768 with the cluster of 16 (auto) and of 8 (LLMRS_ATTN_CLUSTER=8).
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
OUT=${OUT:-/tmp/llmrs-s31}; mkdir -p "$OUT"
timeout 250 python3 -m pytest -q -m gpu tests/test_timeline.py tests/test_profile.py -p no:cacheprovider \
  > $OUT/gpu_tests.log 2>&1; tail -3 $OUT/gpu_tests.log
python3 reports/h200-qwen2.5/session31/clusters.py 2>&1 | tee $OUT/clusters.log
run() {  # name, context, env...
  local name=$1 ctx=$2; shift 2
  env "$@" timeout 200 python3 -m llmrs profile --synthetic ${PRESET} --batch 1 --context $ctx --steps 20 --timeline \
    --measure --top 25 --out $OUT/tl-$name.json > $OUT/tl-$name.log 2>&1
  echo "== $name rc=$?"; grep -v "^┏\|^┡\|^└\|^┃ operation\|Warning\|_warn_once" $OUT/tl-$name.log | cut -c1-120 | head -16
}
PRESET=qwen2.5-3b run 3b-384 384 LLMRS_X=1
PRESET=qwen2.5-7b-awq run 7bawq-384 384 LLMRS_X=1
PRESET=qwen2.5-7b run 7b-384 384 LLMRS_X=1
PRESET=qwen2.5-0.5b run 0.5b-384 384 LLMRS_X=1
PRESET=qwen2.5-7b run 7b-768-cl16 768 LLMRS_X=1
PRESET=qwen2.5-7b run 7b-768-cl8 768 LLMRS_ATTN_CLUSTER=8
