#!/usr/bin/env bash
# Session 31, call 5 (no carry): the 0.5B's one-token attention, decode_attn_tc + attn_merge (auto) against the
# one-launch cluster form (LLMRS_ATTN_KERNEL=partial: attn_cluster d2), alternated; the 7B AWQ at a 640-token prompt
# with auto's clusters of 8 and the old clusters of 16.
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
OUT=${OUT:-/tmp/llmrs-s31}; mkdir -p "$OUT"; R=/tmp/res-s31c5; rm -rf $R; mkdir -p $R
{
bench() {  # name, preset, prompt, quant ("" or awq), env
  local name=$1 p=$2 pl=$3 q=$4; shift 4
  env "$@" timeout 120 python3 -m llmrs synth --like $p ${q:+--quant $q} --decode-bench --bandwidth-gbs 4296 \
    --prompt-len $pl --steps 256 --json $R/decode-$name.json > $R/decode-$name.log 2>&1
  python3 -c "import json; d=json.load(open('$R/decode-$name.json')); print('$name:', d['ms_per_token'], 'ms/token')"
}
bench 0.5b-auto1 qwen2.5-0.5b 256 "" LLMRS_X=1
bench 0.5b-partial1 qwen2.5-0.5b 256 "" LLMRS_ATTN_KERNEL=partial
bench 0.5b-auto2 qwen2.5-0.5b 256 "" LLMRS_X=1
bench 0.5b-partial2 qwen2.5-0.5b 256 "" LLMRS_ATTN_KERNEL=partial
bench 7bawq-p640-auto qwen2.5-7b 640 awq LLMRS_X=1
bench 7bawq-p640-cl16 qwen2.5-7b 640 awq LLMRS_ATTN_CLUSTER=16
} 2>&1 | tee $OUT/call5.log
tar czf $OUT/call5-results.tgz -C $R .
