#!/usr/bin/env bash
# Session 30, call 2 (no carry, ~5 min): attn_o_cluster (one token's attention + o as one kernel), its GPU tests,
# then the one-stream decode bench with it on and off (LLMRS_ATTN_O_FUSED), alternated, one run a process: 3B x3
# each way, 1.5B x2 each way.
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
OUT=${OUT:-/tmp/llmrs-s30}; mkdir -p "$OUT"; R=/tmp/res-s30c2; rm -rf $R; mkdir -p $R
{
timeout 300 python3 -m pytest -q -m gpu tests/test_attention_o_gpu.py tests/test_attention_cluster_gpu.py -k \
  "attn_o or backend" -p no:cacheprovider 2>&1 | tail -8
for i in 1 2 3; do
  for f in 1 0; do
    LLMRS_ATTN_O_FUSED=$f timeout 100 python3 -m llmrs synth --like qwen2.5-3b --decode-bench --bandwidth-gbs 4296 \
      --prompt-len 256 --steps 256 --json $R/decode-3b-f$f-$i.json > $R/decode-3b-f$f-$i.log 2>&1
    python3 -c "import json; d=json.load(open('$R/decode-3b-f$f-$i.json')); print('3b fused=$f run $i:', d['ms_per_token'], 'ms/token')"
  done
done
for i in 1 2; do
  for f in 1 0; do
    LLMRS_ATTN_O_FUSED=$f timeout 100 python3 -m llmrs synth --like qwen2.5-1.5b --decode-bench --bandwidth-gbs 4296 \
      --prompt-len 256 --steps 256 --json $R/decode-1.5b-f$f-$i.json > $R/decode-1.5b-f$f-$i.log 2>&1
    python3 -c "import json; d=json.load(open('$R/decode-1.5b-f$f-$i.json')); print('1.5b fused=$f run $i:', d['ms_per_token'], 'ms/token')"
  done
done
} 2>&1 | tee $OUT/call2.log
cp $R/*.json $OUT/ 2>/dev/null; cp $R/decode-3b-f1-1.log $OUT/ 2>/dev/null
