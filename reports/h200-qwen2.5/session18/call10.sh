#!/usr/bin/env bash
# session 18 call10 (main + LLMRS_GEMM_PAD_ROWS, off by default): the bf16 GEMMs of eager steps on gemm_rows(T) rows
# (fewer distinct token counts for cuBLAS, whose first call of a (count, shape) costs ~2.6 ms of host time). Fresh
# 7B servers alternated, pad 0 / 1, twice: TTFT over prompts of varied lengths (192-576 tokens, 32 one at a time),
# then 256 concurrent with varied lengths (prompt 128-384, output 128-384, --range-ratio 0.5), two runs. Then the
# GPU tests with LLMRS_GEMM_PAD_ROWS=1.
set -uo pipefail
export PYTHONUNBUFFERED=1
. scripts/gpu_lib.sh && use_wheels || exit 1
R=/tmp/res-c10; mkdir -p $R
{
for i in 1 2; do
  for pad in 0 1; do
    serve_up pad$pad-$i LLMRS_GEMM_PAD_ROWS=$pad || continue
    timeout 60 python3 -m llmrs bench --url http://127.0.0.1:8123 --input-len 384 --range-ratio 0.5 --output-len 2 \
      --ignore-eos --workers 1 -o $R -c 1 -n 32 --seed $((7500 + 10 * i)) --label ttft-pad$pad-$i \
      --name ttft-pad$pad-$i > $R/ttft-pad$pad-$i.log 2>&1
    ttft_line $R/ttft-pad$pad-$i.json 384 "LLMRS_GEMM_PAD_ROWS=$pad server $i (192-576)"
    for run in 1 2; do
      timeout 90 python3 -m llmrs bench --url http://127.0.0.1:8123 --input-len 256 --output-len 256 --range-ratio 0.5 \
        --ignore-eos --workers 8 -o $R -c 256 -n 256 --seed $((7600 + 100 * i + 10 * run)) --label var-pad$pad-$i-$run \
        --name bench-7b-var-pad$pad-$i-r$run > $R/var-pad$pad-$i-$run.log 2>&1
    done
    serve_down
  done
done
bench_table $R
step "GPU tests with LLMRS_GEMM_PAD_ROWS=1"
LLMRS_GEMM_PAD_ROWS=1 TEST_TIMEOUT=220 gpu_tests
} 2>&1 | tee $OUT/summary.txt
cp $R/gpu_tests.log $OUT/ 2>/dev/null
rm -f $R/*.csv; tar czf $OUT/results.tgz -C $R .
