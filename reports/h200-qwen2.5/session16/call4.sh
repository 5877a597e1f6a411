#!/usr/bin/env bash
# Session 16, call 4 (carry .whl): the final rules (4-bit wgmma form from 65 tokens, its 256-token form at 129-256 and
# 425-512, wave-filling K slices):
#   1. `pytest -m gpu tests` (the SmolLM2 GGUF not carried: its tests skip);
#   2. `llmrs profile --synthetic qwen2.5-7b-awq --batch 80,112` with LLMRS_Q4_WGMMA_FROM=65 (default) and 128;
#   3. the 7B AWQ one-stream decode bench; the 7B AWQ and bf16 servers at 64 / 256 concurrent, twice each.
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/llmrs-s16}; mkdir -p "$OUT"; R=/tmp/res-s16c4; rm -rf $R; mkdir -p $R
. scripts/gpu_lib.sh
use_wheels || exit 1
{
TEST_TIMEOUT=280 TEST_PATHS="tests" gpu_tests
for from in 65 128; do
  step "profile 7B AWQ, batch 80,112, LLMRS_Q4_WGMMA_FROM=$from"
  LLMRS_Q4_WGMMA_FROM=$from timeout 100 python3 -m llmrs profile --synthetic qwen2.5-7b-awq --batch 80,112 \
    --context 512 --out $R/profile-from$from.json > $R/profile-from$from.txt 2>&1
  grep -E "step wall" $R/profile-from$from.txt
done
step "decode bench, one stream, 7B AWQ"
timeout 100 python3 -m llmrs synth --like qwen2.5-7b-awq --decode-bench --bandwidth-gbs 4296 --prompt-len 256 \
  --steps 256 --json $R/decode-7b-awq.json > $R/decode-7b-awq.log 2>&1
python3 -c "import json,sys; print('7B AWQ', round(json.load(open(sys.argv[1]))['ms_per_token'], 3), 'ms')" \
  $R/decode-7b-awq.json 2>/dev/null || tail -3 $R/decode-7b-awq.log
for m in qwen2.5-7b-awq qwen2.5-7b; do
  step "server $m (defaults): 64 and 256 concurrent, twice"
  SERVE_MODEL=$m serve_up $m && {
    for run in 1 2; do for c in 64 256; do load_bench bench-$m-run$run-c$c $c $((8000 + 100 * run + c)); done; done
    serve_down
  }
done
bench_table $R
} 2>&1 | tee $OUT/summary.txt
tar czf $OUT/results.tgz -C $R .
