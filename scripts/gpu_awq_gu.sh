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
  LLMRS_GATE_UP_BF16=$v python3 -m llmrs serve --synthetic qwen2.5-7b-awq --device cuda --max-num-seqs 256 \
    --port 8123 >"$R/serve-gu$v.log" 2>&1 &
  SRV=$!
  if wait_health 8123 200; then
    for c in 64 256; do
      timeout 120 python3 -m llmrs bench --url http://127.0.0.1:8123 --input-len 256 --output-len 256 --ignore-eos \
        --workers 8 -o $R -c $c -n 256 --seed $((3000 + c)) --label awq-gu$v --name bench-7b-awq-gu$v-c$c \
        > "$R/bench-gu$v-c$c.log" 2>&1
    done
  fi
  kill -INT $SRV; wait $SRV
done
bench_table $R
} 2>&1 | tee $OUT/summary.txt
tar czf $OUT/results.tgz -C $R .
