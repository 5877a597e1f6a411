#!/usr/bin/env bash
# session 20 call2 (the third of three back-to-back calls: p00 + .whl, p01 of the SmolLM2 GGUF moved to /tmp/models
# first): attn_cluster's 4 query heads a block (the _g4 forms, default where the blocks fit) and each lane's own
# head's softmax state (the only form now), measured in call1 (call-combo.sh):
#   1. the whole GPU suite (with the real SmolLM2 Q4_1);
#   2. single-stream decode, best of 3 in one process (scripts/ablate_decode.py), 7B / 3B / 0.5B / 7B AWQ;
#   3. session 19's px GEMV branch (next/px-early.patch applied to a copy of this tree): its GPU tests, the 7B AWQ
#      A/B (px on / off), the tiny AWQ end-to-end tests;
#   4. LLMRS_ATTN_HEADS_PER_BLOCK=8 for the 0.5B and the 7B AWQ (the A/B call1 did not run).
set -uo pipefail
export PYTHONUNBUFFERED=1
. scripts/gpu_lib.sh
use_gguf_thirds || exit 1
R=/tmp/res-s20c2; mkdir -p $R
ab() {  # PRESET[:QUANT] TAG [VAR=VALUE]
  local p=${1%%:*} q=${1#*:}; [ "$q" = "$1" ] && q=""
  env ${3:-LLMRS_X=1} timeout 90 python3 scripts/ablate_decode.py --like $p ${q:+--quant $q} --rounds 3 \
    --variants full --json $R/ab-$p$q-$2.json > $R/ab-$p$q-$2.log 2>&1
  echo "$p $q $2: $(grep -E '^ +full:' $R/ab-$p$q-$2.log | tr -s ' ')"
}
{
TEST_TIMEOUT=280 gpu_tests
cp $R/gpu_tests.log $OUT/
step "decode best of 3 a process (defaults)"
for p in qwen2.5-7b qwen2.5-3b qwen2.5-0.5b qwen2.5-7b:awq; do ab $p default; done
step "px GEMV (session19/next/px-early.patch on a copy)"
rm -rf /tmp/px && mkdir /tmp/px && cp -a llmrs scripts tests reports pyproject.toml /tmp/px/ && (
  cd /tmp/px && { git apply reports/h200-qwen2.5/session19/next/px-early.patch 2>/dev/null \
    || patch -s -p1 < reports/h200-qwen2.5/session19/next/px-early.patch; } && export PYTHONPATH=/tmp/px:/tmp/site \
  && timeout 90 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_gemv_q4_gpu.py -k px > $R/px-tests.log 2>&1
  tail -2 $R/px-tests.log
  timeout 90 python3 scripts/ablate_decode.py --like qwen2.5-7b --quant awq --rounds 3 \
    --variants "full/set:q4_gemv_px=False" --json $R/px-ab.json > $R/px-ab.log 2>&1
  sed -n '/^---/,$p' $R/px-ab.log; tail -2 $R/px-ab.log | grep -i error
  timeout 60 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_quant_gpu.py -k tiny > $R/px-tiny.log 2>&1
  tail -2 $R/px-tiny.log
)
step "LLMRS_ATTN_HEADS_PER_BLOCK=8"
for p in qwen2.5-0.5b qwen2.5-7b:awq; do ab $p h8 LLMRS_ATTN_HEADS_PER_BLOCK=8; done
} 2>&1 | tee $OUT/summary.txt
rm -f $R/*.csv; tar czf $OUT/results.tgz -C $R .
