#!/usr/bin/env bash
# For the next lease (written at the end of session 19, not run), preferred over call1.sh / call2-g4.sh: branch
# exp/attn-combo (or `git am reports/h200-qwen2.5/session19/next/attn-combo.patch` on main) holds both attention
# experiments, each behind its switch: LLMRS_ATTN_HEADS_PER_BLOCK=4 (attn_cluster's _g4 forms: a block per 4 query
# heads, twice the blocks) and LLMRS_ATTN_OWN_HEAD (default on there: each lane keeps only its own head's softmax
# state; 0 = every head in every lane, main's code). All four pairings give the same bits (the branch's GPU tests).
# sm_90 SASS, attn_cluster8_d4's main loop: 2732 (8 heads, all lanes) / 2433 (own) / 1675 (g4) / 1609 (g4 + own).
# One call, ~6 min, carry .whl:
#   1. the bit-identity and attention tests, the graph and parity tests, with g4 on;
#   2. attn_cluster's phase clocks for the four pairings (7B);
#   3. best of 3 a process for the four pairings in turn, the first again at the end (7B), and the four (3B);
#      then 4 heads a block over clusters of 16 (7B, 3B).
set -uo pipefail
export PYTHONUNBUFFERED=1
. scripts/gpu_lib.sh
use_wheels || exit 1
R=/tmp/res-combo; mkdir -p $R
{
step "tests"
LLMRS_ATTN_HEADS_PER_BLOCK=4 timeout 240 python3 -m pytest -q -m gpu -p no:cacheprovider \
  tests/test_attention_sum8_gpu.py tests/test_attention_cluster_gpu.py tests/test_cuda_graphs.py \
  tests/test_cuda_parity.py > $R/tests.log 2>&1
grep -E "^(FAILED|ERROR)|passed|failed" $R/tests.log | tail -8
step "phase clocks (7B)"
for pair in 8:0 8:1 4:0 4:1; do
  LLMRS_ATTN_HEADS_PER_BLOCK=${pair%:*} LLMRS_ATTN_OWN_HEAD=${pair#*:} timeout 90 python3 scripts/attn_clocks.py \
    --like qwen2.5-7b --json $R/clk-h${pair/:/-own}.json > $R/clk-h${pair/:/-own}.log 2>&1
  echo "heads a block ${pair%:*}, own head ${pair#*:}:"; tail -10 $R/clk-h${pair/:/-own}.log
done
step "decode best of 3 a process"
for p in qwen2.5-7b qwen2.5-3b; do
  for pair in 8:0 8:1 4:0 4:1 8:0b; do
    [ $p = qwen2.5-3b ] && [ $pair = 8:0b ] && continue
    own=${pair#*:}; own=${own%b}
    LLMRS_ATTN_HEADS_PER_BLOCK=${pair%:*} LLMRS_ATTN_OWN_HEAD=$own timeout 90 python3 scripts/ablate_decode.py \
      --like $p --rounds 3 --variants full --json $R/ab-$p-h${pair/:/-own}.json > $R/ab-$p-h${pair/:/-own}.log 2>&1
    echo "$p heads a block ${pair%:*}, own head $pair: $(grep -E '^ +full:' $R/ab-$p-h${pair/:/-own}.log | tr -s ' ')"
  done
  # 4 heads a block over clusters of 16 (4x today's blocks: the 3B's 2 kv heads fill 64 SMs)
  LLMRS_ATTN_HEADS_PER_BLOCK=4 LLMRS_ATTN_CLUSTER=16 timeout 90 python3 scripts/ablate_decode.py --like $p \
    --rounds 3 --variants full --json $R/ab-$p-h4-cl16.json > $R/ab-$p-h4-cl16.log 2>&1
  echo "$p heads a block 4, own head 1, cluster 16: $(grep -E '^ +full:' $R/ab-$p-h4-cl16.log | tr -s ' ')"
done
} 2>&1 | tee $OUT/summary.txt
tar czf $OUT/results.tgz -C $R .
