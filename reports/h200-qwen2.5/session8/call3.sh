#!/usr/bin/env bash
# Session 8, call 3 (carry .whl): attn_partial with 4 keys in flight a warp (attention.cu ATTN_AHEAD; LLMRS_ATTN_AHEAD=1
# compiles the one-key-ahead loop of before) and rope_write_kv's sine/cosine once a token. All GPU tests, then decode
# attention inside graphs (7B / 3B at context 512, 7B at 2048) for AHEAD 1 and 4, single-stream decode A/B, and the
# 7B prefill-256 profile (rope_write_kv's time against session7's 0.287 ms).
cd "$(dirname "$0")/../../.."
export OUT=${OUT:-/tmp/llmrs-s8c3}; mkdir -p $OUT; R=/tmp/res-s8c3; mkdir -p $R
. scripts/gpu_lib.sh; use_wheels
{
gpu_tests
for spec in "qwen2.5-7b 512" "qwen2.5-3b 512" "qwen2.5-7b 2048" "qwen2.5-0.5b 512"; do
  set -- $spec
  for v in 1 4; do
    step "attention inside graphs, $1, context $2, LLMRS_ATTN_AHEAD=$v"
    LLMRS_ATTN_AHEAD=$v timeout 100 python3 scripts/bench_kernels_graph.py --like $1 --context $2 --only attention \
      > $R/kg-$1-$2-ahead$v.txt 2>&1
    grep -E "attention partial|choice" $R/kg-$1-$2-ahead$v.txt
  done
done
OUT=$R/ab TESTS=0 RUNS="1" AWQ=0 AB_VAR=LLMRS_ATTN_AHEAD AB_VALUES="1 4" bash scripts/gpu_ab.sh 2>&1 | grep -v '^$'
step "profile 7B prefill 256"
timeout 120 python3 -m llmrs profile --synthetic qwen2.5-7b --batch 1 --context 512 --prefill-len 256 --steps 5 \
  --top 14 > $R/profile-7b-prefill.txt 2>&1
grep -E "step wall|rope|rms_norm|silu|prefill_attn" $R/profile-7b-prefill.txt
} 2>&1 | tee $OUT/summary.txt
cp $R/gpu_tests.log $OUT/ 2>/dev/null
tar czf $OUT/results.tgz -C $R .
