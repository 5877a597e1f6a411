#!/usr/bin/env bash
# Session 15, call 5 (carry .whl): the tree with the 4-bit wgmma GEMM and the GEMM's bf16 input on by default.
#   1. `pytest -m gpu tests`;
#   2. decode bench: 7B AWQ (one stream: the GEMV, unchanged by this session) and 7B bf16;
#   3. `llmrs profile --synthetic qwen2.5-7b-awq --batch 64,256 --context 512` (defaults: gate_up at 256 tokens back
#      on dequantize + cuBLAS);
#   4. the 7B AWQ server (defaults) at 64 and 256 concurrent.
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/llmrs-s15}; mkdir -p "$OUT"; R=/tmp/res-s15c5; rm -rf $R; mkdir -p $R
. scripts/gpu_lib.sh
use_wheels || exit 1
{
TEST_TIMEOUT=300 gpu_tests
db() {  # db LABEL SYNTH-ARGS...
  local label=$1; shift
  timeout 100 python3 -m llmrs synth "$@" --decode-bench --bandwidth-gbs 4296 \
    --prompt-len 256 --steps 256 --json $R/decode-$label.json > $R/decode-$label.log 2>&1
  python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print(f'{sys.argv[2]:28s} {r[\"ms_per_token\"]:.3f} ms/token  {100*r[\"fraction_of_floor_measured\"]:.1f}% of floor')" \
    $R/decode-$label.json $label 2>/dev/null || { echo "$label: FAILED"; tail -5 $R/decode-$label.log; }
}
step "decode bench"
db 7b-awq --like qwen2.5-7b --quant awq
db 7b --like qwen2.5-7b
step "profile 7B AWQ, batch 64,256 (defaults)"
timeout 200 python3 -m llmrs profile --synthetic qwen2.5-7b-awq --batch 64,256 --context 512 \
  --out $R/profile-awq.json > $R/profile-awq.txt 2>&1
grep -E "step|busy|gemm|dequant" $R/profile-awq.txt | head -16
step "server qwen2.5-7b-awq (defaults): 64 and 256 concurrent"
SERVE_MODEL=qwen2.5-7b-awq serve_up awq-s15 && {
  for c in 64 256; do load_bench bench-7b-awq-s15-c$c $c $((5100 + c)); done
  serve_down
}
bench_table $R
} 2>&1 | tee $OUT/summary.txt
cp $R/gpu_tests.log $OUT/ 2>/dev/null
tar czf $OUT/results.tgz -C $R .
