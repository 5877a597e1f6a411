#!/usr/bin/env bash
# For the next lease (written at the end of session 19, not run): branch exp/own-head (or `git am
# reports/h200-qwen2.5/session19/next/own-head.patch` on main). The decode attention's softmax state of each lane's
# own head only (attention.cu ATTN_ML: head (lane >> 2) & 7, where warp_sum8 leaves its total; corr and p then
# broadcast by two shuffles a head), where every lane kept all 8 heads' (32 copies of the same scalar work, 16
# MUFU a key a warp). The same bits by construction. One call, ~4 min, carry .whl:
#   1. the bit-identity tests (own head vs all lanes, attn_partial and attn_cluster8) and the attention tests;
#   2. attn_cluster's phase clocks, own head / all lanes (7B);
#   3. best of 3 a process, in turn: own / all lanes / own / all lanes (7B), own / all lanes (3B).
set -uo pipefail
export PYTHONUNBUFFERED=1
. scripts/gpu_lib.sh
use_wheels || exit 1
R=/tmp/res-next1; mkdir -p $R
{
step "attention tests (own head default)"
timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_attention_sum8_gpu.py \
  tests/test_attention_cluster_gpu.py tests/test_cuda_graphs.py > $R/tests.log 2>&1
grep -E "^(FAILED|ERROR)|passed|failed" $R/tests.log | tail -8
step "phase clocks"
for own in 1 0; do
  LLMRS_ATTN_OWN_HEAD=$own timeout 90 python3 scripts/attn_clocks.py --like qwen2.5-7b --json $R/clk-own$own.json \
    > $R/clk-own$own.log 2>&1; tail -11 $R/clk-own$own.log
done
step "decode best of 3 a process"
for p in qwen2.5-7b qwen2.5-3b; do
  for run in 1a 0a 1b 0b; do
    [ $p = qwen2.5-3b ] && [ ${run#?} = b ] && continue
    LLMRS_ATTN_OWN_HEAD=${run%?} timeout 90 python3 scripts/ablate_decode.py --like $p --rounds 3 --variants full \
      --json $R/ab-$p-own$run.json > $R/ab-$p-own$run.log 2>&1
    echo "$p own=$run: $(grep -E '^ +full:' $R/ab-$p-own$run.log | tr -s ' ')"
  done
done
} 2>&1 | tee $OUT/summary.txt
tar czf $OUT/results.tgz -C $R .
