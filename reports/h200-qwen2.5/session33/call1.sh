#!/usr/bin/env bash
# Session 33, call 1 (no carry): the paired 4-bit gate_up's tail (gemm_q4.cu GvTail, cuda_q4gemm.gemv_tail_plan).
# Decode bench (prompt 256 + 256 steps, one run a process), tail on / off (LLMRS_Q4_GEMV_TAIL=0) alternated:
# 7B AWQ x 2 each, 3B AWQ x 1 each; then the 4-bit GEMV GPU tests (the tail's bit checks among them).
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
R=/tmp/res; rm -rf $R; mkdir -p $R
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/gpu.txt
bench() {  # name, preset, env...
  local name=$1 p=$2; shift 2
  env "$@" timeout 150 python3 -m llmrs synth --like $p --quant awq --decode-bench --bandwidth-gbs 4296 \
    --prompt-len 256 --steps 256 --json $R/decode-$name.json > $R/decode-$name.log 2>&1
  python3 -c "import json; d=json.load(open('$R/decode-$name.json')); print('$name:', d['ms_per_token'], 'ms/token')" \
    || tail -5 $R/decode-$name.log
}
{
for i in 1 2; do
  bench 7bawq-tail$i qwen2.5-7b LLMRS_X=1
  bench 7bawq-notail$i qwen2.5-7b LLMRS_Q4_GEMV_TAIL=0
done
bench 3bawq-tail qwen2.5-3b LLMRS_X=1
bench 3bawq-notail qwen2.5-3b LLMRS_Q4_GEMV_TAIL=0
LLMRS_GPU_REPORT=$R/gpu_figures.jsonl timeout 240 python3 -m pytest -q -m gpu tests/test_gemv_q4_gpu.py \
  -k "tail or silu_pair or norm or repeats" -p no:cacheprovider > $R/gpu_tests.log 2>&1
grep -E "passed|failed|^FAILED|^E " $R/gpu_tests.log | head -12
grep tail $R/gpu_figures.jsonl
} 2>&1 | tee $OUT/call1.log
tar czf $OUT/results.tgz -C $R .
