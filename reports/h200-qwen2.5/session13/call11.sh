#!/usr/bin/env bash
# Session 13, call 11 (carry .whl; _base as call 10): the engine alone (scripts/ttft_engine_probe.py --serving, no
# HTTP): add -> first token of a 256-token prompt, _base vs this tree, alternated, 16 requests each.
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/llmrs-s13}; mkdir -p "$OUT"; R=/tmp/res-s13c11; rm -rf $R; mkdir -p $R
. scripts/gpu_lib.sh
use_wheels || exit 1
ROOT=$PWD
{
for round in 1 2; do
  for tree in _base .; do
    lab=$([ $tree = . ] && echo new || echo base)
    step "engine probe $lab round $round"
    (cd $ROOT/$tree && PYTHONPATH=$PWD:/tmp/site timeout 100 python3 scripts/ttft_engine_probe.py --serving \
      --lens 256 --n 16 --json $R/probe-$lab-$round.json) > $R/probe-$lab-$round.txt 2>&1
    tail -4 $R/probe-$lab-$round.txt
  done
done
} 2>&1 | tee $OUT/summary.txt
tar czf $OUT/results.tgz -C $R .
