#!/usr/bin/env bash
# Session 29, call 6 (no carry, ~4 min): the one-stream figures on this session's tree (sessions 24-29 changed the
# sampler's host side, the server and the engine core, not the decode kernels: a regression check), `llmrs synth
# --decode-bench` one run a process (7B, 3B, 0.5B, 7B AWQ, 3B AWQ); then the tokenizer's cost for one prompt by call
# form and environment (scripts/tokenizer_speed.py: default, TOKENIZERS_PARALLELISM=false, RAYON_NUM_THREADS=1).
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
OUT=${OUT:-/tmp/llmrs-s29}; mkdir -p "$OUT"; R=/tmp/res-s29c6; rm -rf $R; mkdir -p $R
{
for p in qwen2.5-7b:1 qwen2.5-3b:1 qwen2.5-0.5b:1 qwen2.5-7b:awq qwen2.5-3b:awq; do
  n=${p#*:}; p=${p%%:*}; q=""; [ "$n" = awq ] && q=awq
  timeout 100 python3 -m llmrs synth --like $p ${q:+--quant $q} --decode-bench --bandwidth-gbs 4296 --prompt-len 256 \
    --steps 256 --json $R/decode-$p-$n.json > $R/decode-$p-$n.log 2>&1
  python3 -c "import json; d=json.load(open('$R/decode-$p-$n.json')); print('$p $n:', d['ms_per_token'], 'ms/token')"
done
for e in "" "TOKENIZERS_PARALLELISM=false" "RAYON_NUM_THREADS=1"; do
  env $e python3 scripts/tokenizer_speed.py --json $R/tok-${e:-default}.json
done
} 2>&1 | tee $OUT/call6.log
cp $R/*.json $OUT/
