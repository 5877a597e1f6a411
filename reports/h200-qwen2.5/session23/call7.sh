#!/usr/bin/env bash
# Session 23, call 7 (carry .whl, ~2.5 min): the 3B AWQ's qkv (2560 x 2048 = 5.2M weights) on the GEMV at one token,
# where its RoPE + KV write ride in the epilogue, against matvec_q4 + rope_write_kv (the default under the 8M rule):
# LLMRS_Q4_GEMV_MIN_WEIGHTS=5242880 moves only that matrix. Decode bench, one run a process, interleaved.
set -uo pipefail
export PYTHONUNBUFFERED=1
. scripts/gpu_lib.sh
use_wheels || exit 1
R=/tmp/res-s23c7; mkdir -p $R
{
step "3B AWQ decode, one run a process: default / qkv on the GEMV"
for i in 1 2; do
  for v in default 5m; do
    e=""; [ $v = 5m ] && e="LLMRS_Q4_GEMV_MIN_WEIGHTS=5242880"
    env $e timeout 100 python3 -m llmrs synth --like qwen2.5-3b --quant awq --decode-bench --bandwidth-gbs 4296 \
      --prompt-len 256 --steps 256 --json $R/decode-3bawq-$v-$i.json > $R/decode-3bawq-$v-$i.log 2>&1
    python3 -c "import json; d=json.load(open('$R/decode-3bawq-$v-$i.json')); print('3B AWQ $v $i:', d['ms_per_token'], 'ms/token')"
  done
done
} 2>&1 | tee $OUT/summary.txt
rm -f $R/*.csv; tar czf $OUT/results.tgz -C $R .
