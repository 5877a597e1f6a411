#!/usr/bin/env bash
# Session 16, call 2 (carry .whl): the 256-token 4-bit wgmma form on by default (129-256 and 449-512 tokens), the
# wave-filling K slices on (at most 2 for that form):
#   1. tests/test_gemm_q4_gpu.py tests/test_quant_gpu.py (defaults: every 4-bit path against its reference);
#   2. the forms at 128 (cluster sizes: the 128-token form's fill cap) and 320 / 448 / 480 / 512 (the crossover);
#   3. `llmrs profile --synthetic qwen2.5-7b-awq --batch 64,128,256` with the defaults and LLMRS_Q4_WG_FILL=0;
#   4. the 7B AWQ server at 64 / 256 concurrent, the 7B bf16 at 256 (the same lease's reference).
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/llmrs-s16}; mkdir -p "$OUT"; R=/tmp/res-s16c2; rm -rf $R; mkdir -p $R
. scripts/gpu_lib.sh
use_wheels || exit 1
{
TEST_TIMEOUT=200 TEST_PATHS="tests/test_gemm_q4_gpu.py tests/test_quant_gpu.py" gpu_tests
step "forms at 128 (cluster sizes) and 320-512"
timeout 150 python3 scripts/bench_gemm_q4_forms.py --tokens 128,320,448,480,512 --splits --json $R/forms.json \
  > $R/forms.txt 2>&1; tail -7 $R/forms.txt
for fill in 1 0; do
  step "profile 7B AWQ, batch 64,128,256, LLMRS_Q4_WG_FILL=$fill"
  LLMRS_Q4_WG_FILL=$fill timeout 100 python3 -m llmrs profile --synthetic qwen2.5-7b-awq --batch 64,128,256 \
    --context 512 --out $R/profile-fill$fill.json > $R/profile-fill$fill.txt 2>&1
  grep -E "step wall|gemm_q4|dequant" $R/profile-fill$fill.txt | head -16
done
step "server qwen2.5-7b-awq (defaults): 64 and 256 concurrent"
SERVE_MODEL=qwen2.5-7b-awq serve_up awq && {
  for run in 1 2; do for c in 64 256; do load_bench bench-7b-awq-run$run-c$c $c $((6000 + 100 * run + c)); done; done
  serve_down
}
step "server qwen2.5-7b bf16: 256 concurrent"
SERVE_MODEL=qwen2.5-7b serve_up bf16 && {
  for run in 1 2; do load_bench bench-7b-bf16-run$run-c256 256 $((6500 + 100 * run)); done
  serve_down
}
bench_table $R
} 2>&1 | tee $OUT/summary.txt
cp $R/forms.txt $OUT/ 2>/dev/null
tar czf $OUT/results.tgz -C $R .
