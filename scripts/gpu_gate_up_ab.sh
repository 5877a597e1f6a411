#!/usr/bin/env bash
# One call on a lent H200 (carry .whl; ~5 min): the bf16 gate/up GEMM output (LLMRS_GATE_UP_BF16, cuBLAS writes
# gate/up as bf16, silu_mul_bf16_bf16 reads them) against the f32 output (=0): its GPU tests (kernels, parity,
# graphs), then per value `llmrs profile --synthetic qwen2.5-7b --batch 256 --prefill-len 256` (step walls: decode
# at 256 sequences, a 256-token prefill), the engine's TTFT at a 256-token prompt (scripts/ttft_engine_probe.py
# --serving), and the server at 256 concurrent (prompt 256, 256 new tokens, two fresh-seed runs).
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/llmrs-gu}; mkdir -p "$OUT"; R=/tmp/res-gu; rm -rf $R; mkdir -p $R
. "$(dirname "$0")/gpu_lib.sh"
use_wheels || exit 1
{
TEST_PATHS="${GU_TESTS:-tests/test_cuda_kernels.py tests/test_cuda_parity.py tests/test_cuda_graphs.py}" gpu_tests
for v in 0 1; do
  step "LLMRS_GATE_UP_BF16=$v: profile"
  LLMRS_GATE_UP_BF16=$v timeout 150 python3 -m llmrs profile --synthetic qwen2.5-7b --batch 256 --context 512 \
    --prefill-len 256 --steps 5 --out $R/profile-gu$v.json > $R/profile-gu$v.txt 2>&1
  grep -E "step wall|gate_up|silu" $R/profile-gu$v.txt | head -8
  LLMRS_GATE_UP_BF16=$v timeout 150 python3 scripts/ttft_engine_probe.py --serving --lens 256 --n 20 \
    --json $R/probe-gu$v.json 2>&1 | grep "engine TTFT"
done
for round in 1 2; do
  for v in 0 1; do
    step "round $round, LLMRS_GATE_UP_BF16=$v: server"
    serve_up gu$v-r$round LLMRS_GATE_UP_BF16=$v || continue
    ttft_bench ttft-gu$v-r$round 256 $((round * 100 + 7)) "gate_up_bf16=$v r$round"
    load_bench bench-7b-gu$v-r$round-c256 256 $((round * 1000 + 256))
    serve_down
  done
done
bench_table $R
} 2>&1 | tee $OUT/summary.txt
tar czf $OUT/results.tgz -C $R .
