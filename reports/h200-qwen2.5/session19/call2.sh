#!/usr/bin/env bash
# session 19 call2 (the third of three back-to-back calls: p00 + .whl, p01 of the SmolLM2 GGUF moved to /tmp/models
# first): the decode attention's first keys and the RMSNorm's weight loaded before the PDL wait (new, default on).
#   1. single-stream decode, best of 3 in one process (scripts/ablate_decode.py), a process per setting, in turn:
#      all on / LLMRS_EARLY_KV=0 / LLMRS_EARLY_NORM=0 / all on again; "-attn": the step without its attention;
#   2. the whole GPU suite (with the real SmolLM2 Q4_1).
set -uo pipefail
export PYTHONUNBUFFERED=1
. scripts/gpu_lib.sh
use_gguf_thirds || exit 1
R=/tmp/res2; mkdir -p $R
{
step "decode A/B (best of 3 a process)"
for p in qwen2.5-7b qwen2.5-3b qwen2.5-7b:awq; do
  q=${p#*:}; [ "$q" = "$p" ] && q=""; p=${p%%:*}
  for cfg in on LLMRS_EARLY_KV=0 LLMRS_EARLY_NORM=0 on2; do
    [ "$p$q" = qwen2.5-3b ] && [ $cfg = LLMRS_EARLY_NORM=0 ] && continue  # the 3B folds its norms
    var=""; case $cfg in LLMRS_*) var=$cfg;; esac
    variants=full; [ $cfg = on ] && variants="full/-attn"
    env $var timeout 90 python3 scripts/ablate_decode.py --like $p ${q:+--quant $q} --rounds 3 --variants $variants \
      --json $R/ab-$p$q-$cfg.json > $R/ab-$p$q-$cfg.log 2>&1
    echo "$p $q $cfg: $(grep -E '^ +(full|-attn):' $R/ab-$p$q-$cfg.log | tr -s ' ' | tr '\n' ';')"
  done
done
TEST_TIMEOUT=330 gpu_tests
cp $R/gpu_tests.log $OUT/
} 2>&1 | tee $OUT/summary.txt
tar czf $OUT/results.tgz -C $R .
