#!/usr/bin/env bash
# One call on a lent H200 for the 4-bit decode GEMV (issue 6): every GPU test, the GEMV/matvec timing table of
# tests/test_gemv_q4_gpu.py, the 7B AWQ single-stream decode bench, and `llmrs profile` of the 7B AWQ at batch
# 1, 4, 8 with LLMRS_Q4_GEMV=1 and 0 (graph wall times per step). Results under $OUT. Expects wheels in .whl/.
set -uo pipefail
. scripts/gpu_lib.sh; use_wheels
R=$OUT; mkdir -p $R
step "GPU tests"; LLMRS_GPU_REPORT=$R/gpu_figures.jsonl timeout 400 python3 -m pytest -q -m gpu -p no:cacheprovider -rs tests > $R/gpu_tests.log 2>&1
grep -E "^(FAILED|ERROR)|passed|failed" $R/gpu_tests.log | tail -12
grep -A12 "AWQ G128 linears" $R/gpu_tests.log | head -12
step "7B AWQ decode bench"
timeout 120 python3 -m llmrs synth --like qwen2.5-7b --quant awq --decode-bench --bandwidth-gbs 4296 --prompt-len 256 --steps 256 --json $R/decode-7b-awq.json 2>&1 | grep -E "ms_per_token|rror"
for v in 1 0; do
  step "profile 7B AWQ LLMRS_Q4_GEMV=$v"
  LLMRS_Q4_GEMV=$v timeout 120 python3 -m llmrs profile --synthetic qwen2.5-7b-awq --batch 1,4,8 --context 512 --prefill-len 64 --steps 5 --top 5 --out $R/profile-7b-awq-gemv$v.json > $R/profile-7b-awq-gemv$v.txt 2>&1
  grep -iE "^ *(decode|prefill)|step|wall|busy|rror" $R/profile-7b-awq-gemv$v.txt | head -16
done
