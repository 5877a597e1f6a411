#!/usr/bin/env bash
# session 19 call4: the decode attention's block merge with its per-(warp, head) factors formed once a block
# (attn_warp_scales; the same bits), then two A/Bs:
#   1. attn_cluster's phase clocks (7B), to set against call3's (block merge 1.32 us);
#   2. best-of-3 decode a process, in turn: default / LLMRS_ATTN_FAST_EXP (__expf per key) / LLMRS_ATTN_CLUSTER=16 /
#      default (7B), default / fast exp (3B);
#   3. the whole GPU suite (no GGUF this time: its 7 SmolLM2 tests skip).
set -uo pipefail
export PYTHONUNBUFFERED=1
. scripts/gpu_lib.sh
use_wheels || exit 1
R=/tmp/res4; mkdir -p $R
{
step "phase clocks"
timeout 90 python3 scripts/attn_clocks.py --like qwen2.5-7b --json $R/clk-7b.json > $R/clk-7b.log 2>&1
tail -11 $R/clk-7b.log
step "decode best of 3 a process"
for p in qwen2.5-7b qwen2.5-3b; do
  for cfg in base fastexp cl16 base2; do
    [ $p = qwen2.5-3b ] && [ $cfg = cl16 ] && continue
    [ $p = qwen2.5-3b ] && [ $cfg = base2 ] && continue
    defs=""; cl=""
    [ $cfg = fastexp ] && defs=LLMRS_ATTN_FAST_EXP
    [ $cfg = cl16 ] && cl=16
    LLMRS_CUDA_DEFINES=$defs LLMRS_ATTN_CLUSTER=${cl:-auto} timeout 90 python3 scripts/ablate_decode.py --like $p \
      --rounds 3 --variants full --json $R/ab-$p-$cfg.json > $R/ab-$p-$cfg.log 2>&1
    echo "$p $cfg: $(grep -E '^ +full:' $R/ab-$p-$cfg.log | tr -s ' ')"
  done
done
TEST_TIMEOUT=230 gpu_tests
cp $R/gpu_tests.log $OUT/
} 2>&1 | tee $OUT/summary.txt
tar czf $OUT/results.tgz -C $R .
