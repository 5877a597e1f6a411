#!/usr/bin/env bash
# Session 32, call 2 (no carry): the cluster backend test with its fixed 512-auto expectation (LLMRS_ATTN_CLUSTER=0
# under auto runs decode_attn_tc for 64-dim heads), the attn_o GPU tests, the 3B under the new auto (8-warp
# attn_o), then session 31's norm-in-early PART=1 (the 4-bit GEMV GPU tests with GV_NORM_IN_EARLY).
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
R=/tmp/res-s32c2; rm -rf $R; mkdir -p $R
{
timeout 150 python3 -m pytest -q -m gpu tests/test_attention_cluster_gpu.py tests/test_attention_o_gpu.py \
  -p no:cacheprovider > $R/cluster_o_tests.log 2>&1; grep -E "passed|failed|^FAILED|^E " $R/cluster_o_tests.log | head -8
timeout 100 python3 -m llmrs synth --like qwen2.5-3b --decode-bench --bandwidth-gbs 4296 --prompt-len 256 \
  --steps 256 --json $R/decode-3b-auto.json > $R/decode-3b-auto.log 2>&1
python3 -c "import json; d=json.load(open('$R/decode-3b-auto.json')); print('3b auto:', d['ms_per_token'], 'ms/token')"
PART=1 OUT=$R bash reports/h200-qwen2.5/session31/next/call-norm-in-early.sh
} 2>&1 | tee $R/call2.log
tar czf $OUT/call2.tgz -C $R .
