#!/usr/bin/env bash
# One call on a lent H200 (carry .whl; ~4 min): the bf16 gate/up GEMM output on the 7B AWQ server (the dequantize +
# cuBLAS path, above 192 tokens a step) with LLMRS_GATE_UP_BF16 0 / 1: 64 and 256 concurrent (prompt 256, 256 new
# tokens, fresh seeds), one server each.
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/llmrs-awqgu}; mkdir -p "$OUT"; R=/tmp/res-awqgu; rm -rf $R; mkdir -p $R
. "$(dirname "$0")/gpu_lib.sh"
use_wheels || exit 1
{
for v in 0 1; do
  step "7B AWQ server, LLMRS_GATE_UP_BF16=$v"
  SERVE_MODEL=qwen2.5-7b-awq SERVE_WAIT=200 serve_up awq-gu$v LLMRS_GATE_UP_BF16=$v || continue
  for c in 64 256; do load_bench bench-7b-awq-gu$v-c$c $c $((3000 + c)); done
  serve_down
done
bench_table $R
} 2>&1 | tee $OUT/summary.txt
tar czf $OUT/results.tgz -C $R .
