#!/usr/bin/env bash
# Session 13, call 3 (carry .whl): the tree's whole GPU suite (attn_cluster now the default where attn_partial ran),
# then the single-stream decode bench: 7B LLMRS_ATTN_CLUSTER=auto / 4 / 0, 3B auto / 16 / 0, 0.5B and 7B AWQ auto.
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/llmrs-s13}; mkdir -p "$OUT"; R=/tmp/res-s13c3; rm -rf $R; mkdir -p $R
. scripts/gpu_lib.sh
use_wheels || exit 1
{
TEST_TIMEOUT=330 gpu_tests
db() {  # db LABEL VALUE SYNTH-ARGS...
  local label=$1 v=$2; shift 2
  LLMRS_ATTN_CLUSTER=$v timeout 100 python3 -m llmrs synth "$@" --decode-bench --bandwidth-gbs 4296 \
    --prompt-len 256 --steps 256 --json $R/decode-$label-$v.json > $R/decode-$label-$v.log 2>&1
  python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print(f'{sys.argv[2]:10s} cluster={sys.argv[3]:5s} {r[\"ms_per_token\"]:.3f} ms/token  {100*r[\"fraction_of_floor_measured\"]:.1f}% of floor')" \
    $R/decode-$label-$v.json $label $v 2>/dev/null || { echo "$label $v: FAILED"; tail -5 $R/decode-$label-$v.log; }
}
step "decode bench"
for v in auto 4 0; do db 7b $v --like qwen2.5-7b; done
for v in auto 16 0; do db 3b $v --like qwen2.5-3b; done
db 0.5b auto --like qwen2.5-0.5b
db 7b-awq auto --like qwen2.5-7b --quant awq
} 2>&1 | tee $OUT/summary.txt
cp $R/gpu_tests.log $OUT/ 2>/dev/null
tar czf $OUT/results.tgz -C $R .
