#!/usr/bin/env bash
# Session 31, call 6 (no carry, the last ~250 s of device time): the cluster suite's backend test (64-dim heads
# now on attn_cluster at one token under auto: greedy tokens equal attn_partial + attn_merge's) and the 0.5B one
# stream with the new default.
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
OUT=${OUT:-/tmp/llmrs-s31}; mkdir -p "$OUT"
{
timeout 120 python3 -m llmrs synth --like qwen2.5-0.5b --decode-bench --bandwidth-gbs 4296 --prompt-len 256 \
  --steps 256 --json $OUT/decode-0.5b.json > $OUT/decode-0.5b.log 2>&1
python3 -c "import json; d=json.load(open('$OUT/decode-0.5b.json')); print('0.5b auto:', d['ms_per_token'], 'ms/token')"
timeout 100 python3 -m pytest -q -m gpu tests/test_attention_cluster_gpu.py -k backend_takes -p no:cacheprovider \
  2>&1 | grep -E "passed|failed|^FAILED|^E " | head -8
} 2>&1 | tee $OUT/call6.log
