#!/usr/bin/env bash
# session 19 call3: where attn_cluster's time goes (scripts/attn_clocks.py, clock64 per phase inside the graphed
# single-stream step), and its keys taken into the softmax NB at once (ATTN_KEY_BATCH, attention.cu attn_keys):
#   1. the phase clocks, 7B and 3B, NB = 1 (today's) / 2 / 4 / 8, and NB = 1 without the early K/V loads;
#   2. the attention GPU tests with NB = 4 and 8 (against float64 and attn_partial; greedy tokens);
#   3. best-of-3 decode (scripts/ablate_decode.py), a process per NB, in turn.
set -uo pipefail
export PYTHONUNBUFFERED=1
. scripts/gpu_lib.sh
use_wheels || exit 1
R=/tmp/res3; mkdir -p $R
{
step "phase clocks"
for p in qwen2.5-7b qwen2.5-3b; do
  for nb in 1 4 8 2; do
    [ $p = qwen2.5-3b ] && [ $nb = 2 ] && continue
    timeout 90 python3 scripts/attn_clocks.py --like $p --define ATTN_KEY_BATCH=$nb --json $R/clk-$p-nb$nb.json \
      > $R/clk-$p-nb$nb.log 2>&1; cat $R/clk-$p-nb$nb.log | tail -11
  done
done
LLMRS_EARLY_KV=0 timeout 90 python3 scripts/attn_clocks.py --like qwen2.5-7b --json $R/clk-7b-kv0.json \
  > $R/clk-7b-kv0.log 2>&1; tail -11 $R/clk-7b-kv0.log
for nb in 4 8; do
  step "attention tests, ATTN_KEY_BATCH=$nb"
  LLMRS_CUDA_DEFINES=ATTN_KEY_BATCH=$nb timeout 150 python3 -m pytest -q -m gpu -p no:cacheprovider \
    tests/test_attention_cluster_gpu.py tests/test_attention_sum8_gpu.py > $R/tests-nb$nb.log 2>&1
  grep -E "^(FAILED|ERROR)|passed|failed" $R/tests-nb$nb.log | tail -5
done
step "decode best of 3 a process"
for p in qwen2.5-7b qwen2.5-3b; do
  for nb in 1 4 8 1b 4b; do
    LLMRS_CUDA_DEFINES=ATTN_KEY_BATCH=${nb%b} timeout 90 python3 scripts/ablate_decode.py --like $p --rounds 3 \
      --variants full --json $R/ab-$p-nb$nb.json > $R/ab-$p-nb$nb.log 2>&1
    echo "$p NB=$nb: $(grep -E '^ +full:' $R/ab-$p-nb$nb.log | tr -s ' ')"
  done
done
} 2>&1 | tee $OUT/summary.txt
tar czf $OUT/results.tgz -C $R .
