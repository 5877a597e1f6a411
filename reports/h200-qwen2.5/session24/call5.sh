#!/usr/bin/env bash
# Session 24, call 5 (carry .whl, ~7 min): SiLU x up fused into the mma.sync 4-bit GEMM too (17-64 tokens on the
# H200; 17-192 elsewhere): gemm_q4{z,m}_silu_m{2,4} + gemm_q4_reduce_silu.
#   1. tests/test_gemm_q4_silu_gpu.py (every form against gemm_q4 + silu_mul_bf16 bit for bit; the tiny AWQ model's
#      40 / 100 / 200-token steps with and without), tests/test_gemm_q4_gpu.py (less timing);
#   2. `llmrs profile --synthetic qwen2.5-7b-awq --batch 32,64 --context 512 --prefill-len 48`, LLMRS_Q4_GEMM_EPILOGUE
#      1 / 0, three rounds interleaved (graph walls);
#   3. the 7B AWQ and bf16 servers at 64 concurrent, twice each.
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/llmrs-s24}; mkdir -p "$OUT"; R=/tmp/res-s24c5; rm -rf $R; mkdir -p $R
. scripts/gpu_lib.sh
use_wheels || exit 1
{
TEST_TIMEOUT=240 TEST_PATHS="tests/test_gemm_q4_silu_gpu.py tests/test_gemm_q4_gpu.py" TEST_K="not timing" gpu_tests
for round in 1 2 3; do
  for epi in 1 0; do
    LLMRS_Q4_GEMM_EPILOGUE=$epi timeout 100 python3 -m llmrs profile --synthetic qwen2.5-7b-awq --batch 32,64 \
      --context 512 --prefill-len 48 --out $R/profile-$epi-r$round.json > $R/profile-$epi-r$round.txt 2>&1
    echo "epilogue $epi round $round: $(grep -E 'step wall' $R/profile-$epi-r$round.txt)"
  done
done
grep -iE "gate_up|silu" $R/profile-1-r3.txt $R/profile-0-r3.txt | head -12
for m in qwen2.5-7b-awq qwen2.5-7b; do
  step "server $m (defaults): 64 concurrent twice"
  SERVE_MODEL=$m serve_up $m && {
    for run in 1 2; do load_bench bench-${m#qwen2.5-}-run$run-c64 64 $((4400 + 100 * run)); done
    serve_down
  }
done
bench_table $R
} 2>&1 | tee $OUT/summary.txt
cp $R/gpu_tests.log $OUT/ 2>/dev/null
for f in $R/serve-*.log; do tail -5 $f > $R/$(basename $f .log)-tail.log; rm $f; done
rm -f $R/*.csv; tar czf $OUT/results.tgz -C $R .
