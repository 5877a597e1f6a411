#!/usr/bin/env bash
# For the next lease (written at the end of session 19, not run): branch exp/g4 (or `git am
# reports/h200-qwen2.5/session19/next/g4.patch` on main). attn_cluster's _g4 forms: a block per 4 query heads of a
# kv head instead of 8 (twice the blocks / SMs at the same cluster size, half the per-key arithmetic a warp: the
# keys phase was 4.9 us of the 7B's 8.3 after the wait, issue-bound; SASS sm_90: attn_cluster8_d4 5816 -> 4176
# instructions, 176 -> 112 registers). The same bits by construction. One call, ~4 min, carry .whl:
#   1. the bit-identity test (g4 vs 8 heads) and the attention / graph tests with LLMRS_ATTN_HEADS_PER_BLOCK=4;
#   2. attn_cluster's phase clocks, 8 / 4 heads a block (7B, 3B);
#   3. best of 3 a process, in turn: 8 / 4 / 8 / 4 (7B), 8 / 4 (3B).
set -uo pipefail
export PYTHONUNBUFFERED=1
. scripts/gpu_lib.sh
use_wheels || exit 1
R=/tmp/res-next2; mkdir -p $R
{
step "attention tests"
LLMRS_ATTN_HEADS_PER_BLOCK=4 timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider \
  tests/test_attention_cluster_gpu.py tests/test_cuda_graphs.py tests/test_cuda_parity.py > $R/tests.log 2>&1
grep -E "^(FAILED|ERROR)|passed|failed" $R/tests.log | tail -8
step "phase clocks"
for p in qwen2.5-7b qwen2.5-3b; do
  for hpb in 8 4; do
    LLMRS_ATTN_HEADS_PER_BLOCK=$hpb timeout 90 python3 scripts/attn_clocks.py --like $p --json $R/clk-$p-h$hpb.json \
      > $R/clk-$p-h$hpb.log 2>&1; tail -11 $R/clk-$p-h$hpb.log
  done
done
step "decode best of 3 a process"
for p in qwen2.5-7b qwen2.5-3b; do
  for run in 8a 4a 8b 4b; do
    [ $p = qwen2.5-3b ] && [ ${run#?} = b ] && continue
    LLMRS_ATTN_HEADS_PER_BLOCK=${run%?} timeout 90 python3 scripts/ablate_decode.py --like $p --rounds 3 \
      --variants full --json $R/ab-$p-h$run.json > $R/ab-$p-h$run.log 2>&1
    echo "$p heads a block=$run: $(grep -E '^ +full:' $R/ab-$p-h$run.log | tr -s ' ')"
  done
done
} 2>&1 | tee $OUT/summary.txt
tar czf $OUT/results.tgz -C $R .
