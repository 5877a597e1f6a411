#!/usr/bin/env bash
# One call on a lent H200: the decode-step walls behind two crossovers, from `llmrs profile` (graphs on):
#   bf16 matvec vs cuBLAS for 1-8 tokens (LLMRS_MATVEC_MAX_TOKENS 8 / 2 / 1) on synthetic Qwen2.5 7B and 0.5B;
#   4-bit gemv_q4 vs matvec_q4 (LLMRS_Q4_GEMV 1 / 0) on the 7B AWQ. After the GPU tests these touch (TESTS=0 skips;
#   TESTS=all: every GPU test); PROFILES=0 skips the profiles; SERVE=1 adds the server runs at the end;
#   CROSS_MODELS="qwen2.5-3b" picks the bf16 presets (default 7B and 0.5B), AWQ=0 skips the 4-bit profiles.
# Results: $OUT/results.tgz (profile JSON + text, bench JSON, logs); the step-wall lines printed. Expects wheels in .whl/.
set -uo pipefail
. scripts/gpu_lib.sh; use_wheels
R=/tmp/res-crossover; mkdir -p $R
if [ "${TESTS:-1}" != 0 ]; then
  step "GPU tests (${TESTS:-1})"
  files="tests/test_profile.py tests/test_quant_gpu.py tests/test_gemv_q4_gpu.py tests/test_cuda_kernels.py"
  [ "${TESTS:-1}" = all ] && files=tests
  LLMRS_GPU_REPORT=$R/gpu_figures.jsonl timeout 300 python3 -m pytest -q -m gpu -p no:cacheprovider -rs $files \
    > $R/gpu_tests.log 2>&1
  grep -E "^(FAILED|ERROR)|passed|failed" $R/gpu_tests.log | tail -8
fi
prof() {  # label, synthetic preset, batches, then VAR=VALUE settings
  local label=$1 preset=$2 batches=$3; shift 3
  env "$@" timeout 150 python3 -m llmrs profile --synthetic $preset --batch $batches --context 512 --prefill-len 16 \
    --steps 5 --top 4 --out $R/profile-$label.json > $R/profile-$label.txt 2>&1
  printf "%-34s %s\n" "$label" "$(grep -E 'step wall ms|rror' $R/profile-$label.txt | head -2 | tr -s ' │' ' ')"
}
[ "${PROFILES:-1}" = 1 ] && {
step "decode step wall ms (columns: the batches, then prefill 16)"
for m in ${CROSS_MODELS:-qwen2.5-7b qwen2.5-0.5b}; do
  for v in 8 2 1; do prof ${m#qwen2.5-}-mvmax$v $m 1,2,3,4,8 LLMRS_MATVEC_MAX_TOKENS=$v; done
done
[ "${AWQ:-1}" = 1 ] && for v in 1 0; do prof 7b-awq-gemv$v qwen2.5-7b-awq 1,2,4,8 LLMRS_Q4_GEMV=$v; done
}
# SERVE=1: the 7B (bf16, then AWQ) through `llmrs serve` at 4 and 8 concurrent streams, each crossover setting
serve_small() {  # label, preset, VAR=VALUE
  local label=$1 preset=$2 kv=$3
  env $kv python3 -m llmrs serve --synthetic $preset --device cuda --max-num-seqs 64 --port 8123 \
    >$R/serve-$label.log 2>&1 &
  local srv=$!
  wait_health 8123 150 || { tail -5 $R/serve-$label.log; kill $srv; return; }
  timeout 100 python3 -m llmrs bench --url http://127.0.0.1:8123 --input-len 256 --output-len 256 --ignore-eos \
    --workers 8 -o $R --sweep concurrency=4,8 -n 16 --label $label --name bench-$label 2>&1 | tail -4
  kill -INT $srv; wait $srv
}
if [ "${SERVE:-0}" = 1 ]; then
  step "through the server, 4 and 8 concurrent"
  serve_small 7b-mvmax1 qwen2.5-7b LLMRS_MATVEC_MAX_TOKENS=1
  serve_small 7b-mvmax8 qwen2.5-7b LLMRS_MATVEC_MAX_TOKENS=8
  serve_small 7b-awq-gemv1 qwen2.5-7b-awq LLMRS_Q4_GEMV=1
fi
tar czf $OUT/results.tgz -C $R .
