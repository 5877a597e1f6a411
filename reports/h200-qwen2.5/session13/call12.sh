#!/usr/bin/env bash
# Session 13, call 12 (call 10 again, this tree first, three rounds) (carry .whl; _base = `git archive 9b9b56d llmrs`: attn_cluster, before rms_norm's register-held
# path and silu_mul's two-chunk form): call 7's TTFT (median 10.55 ms) against call 4's (10.11): the 7B's TTFT at a
# 256-token prompt from _base and from this tree, fresh servers alternated twice, 24 new prompts each.
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/llmrs-s13}; mkdir -p "$OUT"; R=/tmp/res-s13c12; rm -rf $R; mkdir -p $R
. scripts/gpu_lib.sh
use_wheels || exit 1
ROOT=$PWD
{
for round in 3 4 5; do
  for tree in . _base; do
    lab=$([ $tree = . ] && echo new || echo base)
    step "round $round: $lab"
    cd $ROOT/$tree && export PYTHONPATH=$PWD:/tmp/site
    serve_up $lab-r$round || { cd $ROOT; continue; }
    ttft_bench ttft-$lab-r$round 256 $((2000 + round * 10 + ${#lab})) "$lab"
    serve_down
    cd $ROOT
  done
done
} 2>&1 | tee $OUT/summary.txt
tar czf $OUT/results.tgz -C $R .
