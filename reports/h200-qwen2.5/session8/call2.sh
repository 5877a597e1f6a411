#!/usr/bin/env bash
# Session 8, call 2 (carry .whl): the decode graph's L2 prefetch branch (cuda_l2.py). Its GPU tests and the graph
# tests, then single-stream decode (0.5B / 3B / 7B, 2 runs, + 7B AWQ) at LLMRS_L2_PREFETCH_MB = 0 (off) / 24 (7B:
# o's weights) / 48 (o + 24 MiB of gate_up) and 32 forked at qkv instead of attention, then `llmrs profile` of
# the 7B at B = 1, 64 with 0 and 48 (graph walls).
cd "$(dirname "$0")/../../.."
export OUT=${OUT:-/tmp/llmrs-s8c2}; mkdir -p $OUT; R=/tmp/res-s8c2; mkdir -p $R
. scripts/gpu_lib.sh; use_wheels
{
step "GPU tests: l2 prefetch + graphs"
timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_l2_prefetch.py tests/test_cuda_graphs.py 2>&1 | tail -4
OUT=$R/ab TESTS=0 RUNS="1 2" AB_VAR=LLMRS_L2_PREFETCH_MB \
  AB_VALUES="0 24 48 LLMRS_L2_PREFETCH_MB=32,LLMRS_L2_PREFETCH_AT=qkv" bash scripts/gpu_ab.sh 2>&1 | grep -v '^$'
for v in 0 48; do
  step "profile 7B B=1,64 LLMRS_L2_PREFETCH_MB=$v"
  LLMRS_L2_PREFETCH_MB=$v timeout 120 python3 -m llmrs profile --synthetic qwen2.5-7b --batch 1,64 --context 512 \
    --prefill-len 256 --steps 5 > $R/profile-7b-l2-$v.txt 2>&1
  grep -E "step wall|GPU busy" $R/profile-7b-l2-$v.txt
done
} 2>&1 | tee $OUT/summary.txt
tar czf $OUT/results.tgz -C $R .
