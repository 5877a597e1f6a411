#!/usr/bin/env bash
# Session 15, call 11 (carry .whl): the 4-bit wgmma GEMM no longer serialized by ptxas, taken at 128-256 tokens for
# every shape and from 64 for weights of <= 64M (qkv, o): its tests, the AWQ step profile, the AWQ server.
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/llmrs-s15}; mkdir -p "$OUT"; R=/tmp/res-s15c11; rm -rf $R; mkdir -p $R
. scripts/gpu_lib.sh
use_wheels || exit 1
{
TEST_TIMEOUT=150 TEST_PATHS="tests/test_gemm_q4_gpu.py tests/test_quant_gpu.py" gpu_tests
step "profile 7B AWQ, batch 64,256 (defaults)"
timeout 150 python3 -m llmrs profile --synthetic qwen2.5-7b-awq --batch 64,256 --context 512 \
  --out $R/profile-awq.json > $R/profile-awq.txt 2>&1
grep -E "step wall|busy|gemm|dequant" $R/profile-awq.txt | head -16
step "server qwen2.5-7b-awq (defaults): 64 and 256 concurrent"
SERVE_MODEL=qwen2.5-7b-awq serve_up awq-s15c11 && {
  for c in 64 256; do load_bench bench-7b-awq-s15c11-c$c $c $((5200 + c)); done
  serve_down
}
bench_table $R
} 2>&1 | tee $OUT/summary.txt
tar czf $OUT/results.tgz -C $R .
