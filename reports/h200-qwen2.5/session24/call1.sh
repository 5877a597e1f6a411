#!/usr/bin/env bash
# Session 24, call 1 (carry .whl): the wgmma forms' paired kernels (gate_up + SiLU, qkv + RoPE + KV write):
#   1. GPU tests: the paired GEMM forms, the GEMV (session 23's unrun host refactor), the 4-bit GEMM (its loader);
#   2. `llmrs profile --synthetic qwen2.5-7b-awq --batch 128,256 --context 512` with LLMRS_Q4_GEMM_EPILOGUE=1 / 0,
#      twice each, interleaved: the step walls and the gate_up / silu / qkv / rope rows.
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/llmrs-s24}; mkdir -p "$OUT"; R=/tmp/res-s24c1; rm -rf $R; mkdir -p $R
. scripts/gpu_lib.sh
use_wheels || exit 1
{
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
TEST_TIMEOUT=330 TEST_PATHS="tests/test_gemm_q4_pair_gpu.py tests/test_gemv_q4_gpu.py tests/test_gemm_q4_gpu.py" \
  TEST_K="not timing" gpu_tests
for round in 1 2; do
  for epi in 1 0; do
    step "profile 7B AWQ, batch 128,256, LLMRS_Q4_GEMM_EPILOGUE=$epi (round $round)"
    LLMRS_Q4_GEMM_EPILOGUE=$epi timeout 120 python3 -m llmrs profile --synthetic qwen2.5-7b-awq --batch 128,256 \
      --context 512 --out $R/profile-epi$epi-r$round.json > $R/profile-epi$epi-r$round.txt 2>&1
    grep -E "step wall" $R/profile-epi$epi-r$round.txt || tail -5 $R/profile-epi$epi-r$round.txt
  done
done
step "kernel rows (round 2)"
for epi in 1 0; do echo "-- epilogue $epi"; grep -iE "gate_up|silu|qkv|rope" $R/profile-epi$epi-r2.txt | head -24; done
} 2>&1 | tee $OUT/summary.txt
cp $R/gpu_tests.log $OUT/ 2>/dev/null
tar czf $OUT/results.tgz -C $R .
