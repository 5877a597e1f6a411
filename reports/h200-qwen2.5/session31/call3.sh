#!/usr/bin/env bash
# Session 31, call 3 (carry .whl): the whole GPU suite on this tree (the timeline's test, the cluster rule), then
# one-stream decode at a 640-token prompt (contexts 641-896: the clusters of 16's range) with auto (clusters of 8 on
# the 7B now) and LLMRS_ATTN_CLUSTER=16 (the old auto), and the 7B / 3B figures at the prompt 256.
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
. scripts/gpu_lib.sh; use_wheels || exit 1
OUT=${OUT:-/tmp/llmrs-s31}; mkdir -p "$OUT"; R=/tmp/res-s31c3; rm -rf $R; mkdir -p $R
{
timeout 330 python3 -m pytest -q -m gpu tests -p no:cacheprovider > $R/gpu_tests.log 2>&1
grep -E "passed|failed|^FAILED|^ERROR" $R/gpu_tests.log | tail -12
bench() {  # name, preset, prompt, env
  local name=$1 p=$2 pl=$3; shift 3
  env "$@" timeout 90 python3 -m llmrs synth --like $p --decode-bench --bandwidth-gbs 4296 --prompt-len $pl \
    --steps 256 --json $R/decode-$name.json > $R/decode-$name.log 2>&1
  python3 -c "import json; d=json.load(open('$R/decode-$name.json')); print('$name:', d['ms_per_token'], 'ms/token')"
}
bench 7b-p640-auto qwen2.5-7b 640 LLMRS_X=1
bench 7b-p640-cl16 qwen2.5-7b 640 LLMRS_ATTN_CLUSTER=16
bench 7b-p640-auto2 qwen2.5-7b 640 LLMRS_X=1
bench 7b-p640-cl16b qwen2.5-7b 640 LLMRS_ATTN_CLUSTER=16
bench 7b-p256 qwen2.5-7b 256 LLMRS_X=1
bench 3b-p256 qwen2.5-3b 256 LLMRS_X=1
} 2>&1 | tee $OUT/call3.log
cp $R/*.json $R/*.log $OUT/ 2>/dev/null
