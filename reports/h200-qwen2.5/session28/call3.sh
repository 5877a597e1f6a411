#!/usr/bin/env bash
# Session 28, call 3 (carry .whl, ~5 min): LLMRS_GEMM_PAD_ROWS=1 (a mixed step's token count padded up so the
# burst's early steps reuse cuBLAS plans) against the default, now that the 1 ms flush spreads the burst's adds over
# many steps: four fresh synthetic 7B bf16 servers alternated (pad / default / pad / default), each a 256-token TTFT
# line (24 requests one at a time), then 256 concurrent twice (prompt 256, 256 new tokens, own prompts each run).
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/llmrs-s28}; mkdir -p "$OUT"; R=/tmp/res-s28c3; rm -rf $R; mkdir -p $R
. scripts/gpu_lib.sh
use_wheels || exit 1
{
i=0
for v in 1 0 1 0; do
  i=$((i + 1))
  step "server $i: LLMRS_GEMM_PAD_ROWS=$v"
  serve_up pad$v-$i LLMRS_GEMM_PAD_ROWS=$v && {
    ttft_bench ttft-7b-pad$v-$i 256 $((2800 + i)) "pad$v-$i"
    for run in 1 2; do load_bench bench-7b-pad$v-s$i-run$run-c256 256 $((2810 + 10 * i + run)); done
    serve_down
  }
done
step "table"
bench_table $R
} 2>&1 | tee $OUT/call3.log
tar -C $R -cJf $OUT/bench.tar.xz $(cd $R && ls bench-7b-*.json ttft-7b-*.json serve-*.log 2>/dev/null)
