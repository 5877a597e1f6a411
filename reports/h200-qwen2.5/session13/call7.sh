#!/usr/bin/env bash
# Session 13, call 7 (carry .whl): the final tree.
#   1. `pytest -m gpu tests` (attn_cluster now also in a 64-dim form, d2);
#   2. single-stream decode bench: 0.5B auto (decode_attn_tc at one token) / LLMRS_ATTN_KERNEL=partial (attn_cluster
#      d2) / partial with LLMRS_ATTN_CLUSTER=0 (attn_partial + attn_merge); 3B, 7B (twice), 7B AWQ auto;
#   3. the default server's figures (one stream, TTFT, 64 / 256 concurrent twice), as call 4.
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/llmrs-s13}; mkdir -p "$OUT"; R=/tmp/res-s13c7; rm -rf $R; mkdir -p $R
. scripts/gpu_lib.sh
use_wheels || exit 1
{
TEST_TIMEOUT=300 gpu_tests
db() {  # db LABEL ENV... -- SYNTH-ARGS...
  local label=$1; shift; local envs=(); while [ "$1" != "--" ]; do envs+=("$1"); shift; done; shift
  env "${envs[@]}" timeout 100 python3 -m llmrs synth "$@" --decode-bench --bandwidth-gbs 4296 \
    --prompt-len 256 --steps 256 --json $R/decode-$label.json > $R/decode-$label.log 2>&1
  python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print(f'{sys.argv[2]:28s} {r[\"ms_per_token\"]:.3f} ms/token  {100*r[\"fraction_of_floor_measured\"]:.1f}% of floor')" \
    $R/decode-$label.json $label 2>/dev/null || { echo "$label: FAILED"; tail -5 $R/decode-$label.log; }
}
step "decode bench"
db 0.5b-auto X=1 -- --like qwen2.5-0.5b
db 0.5b-partial-cluster LLMRS_ATTN_KERNEL=partial -- --like qwen2.5-0.5b
db 0.5b-partial-merge LLMRS_ATTN_KERNEL=partial LLMRS_ATTN_CLUSTER=0 -- --like qwen2.5-0.5b
db 0.5b-auto-2 X=1 -- --like qwen2.5-0.5b
db 3b-auto X=1 -- --like qwen2.5-3b
db 7b-auto X=1 -- --like qwen2.5-7b
db 7b-awq-auto X=1 -- --like qwen2.5-7b --quant awq
db 7b-auto-2 X=1 -- --like qwen2.5-7b
step "server (defaults): one stream"
serve_up s13f || exit 1
timeout 100 python3 -m llmrs bench --url http://127.0.0.1:8123 --input-len 256 --output-len 256 --ignore-eos \
  --workers 1 -o $R -c 1 -n 8 --seed 1701 --label one-stream --name bench-7b-one-stream > $R/one-stream.log 2>&1
ttft_bench ttft-s13f-in256 256 1707 "default"
for run in 1 2; do
  for c in 64 256; do load_bench bench-7b-s13f-run$run-c$c $c $((1707 + run * 1000 + c)); done
done
serve_down
bench_table $R
} 2>&1 | tee $OUT/summary.txt
cp $R/gpu_tests.log $OUT/ 2>/dev/null
tar czf $OUT/results.tgz -C $R .
