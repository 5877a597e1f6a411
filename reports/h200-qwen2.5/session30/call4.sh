#!/usr/bin/env bash
# Session 30, call 4 (carry .whl, ~5 min): the whole GPU suite on this session's tree (the SmolLM2 GGUF not carried:
# its tests skip; its 64-dim heads never take attn_o_cluster), then the one-stream figures with auto's rule (attn_o
# at 8 splits where Hq clusters run at once): 1.5B auto / off, 3B, 7B, 0.5B, one run a process.
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
. scripts/gpu_lib.sh; use_wheels || exit 1
OUT=${OUT:-/tmp/llmrs-s30}; mkdir -p "$OUT"; R=/tmp/res-s30c4; rm -rf $R; mkdir -p $R
{
timeout 400 python3 -m pytest -q -m gpu tests -p no:cacheprovider > $R/gpu_tests.log 2>&1
grep -E "passed|failed|^FAILED|^ERROR" $R/gpu_tests.log | tail -12
for p in qwen2.5-1.5b:1 qwen2.5-1.5b:0 qwen2.5-3b:1 qwen2.5-7b:1 qwen2.5-0.5b:1; do
  f=${p#*:}; p=${p%%:*}
  LLMRS_ATTN_O_FUSED=$f timeout 100 python3 -m llmrs synth --like $p --decode-bench --bandwidth-gbs 4296 \
    --prompt-len 256 --steps 256 --json $R/decode-$p-f$f.json > $R/decode-$p-f$f.log 2>&1
  python3 -c "import json; d=json.load(open('$R/decode-$p-f$f.json')); print('$p fused=$f:', d['ms_per_token'], 'ms/token')"
done
} 2>&1 | tee $OUT/call4.log
cp $R/*.json $R/*.log $OUT/ 2>/dev/null
