#!/usr/bin/env bash
# For the next lease (written in session 31, not run): the 4-bit norm chain's consumers with their sums of squares
# copied into shared memory right after the PDL wait (gemm_q4.cu GV_NORM_IN_EARLY, off by default: the default
# PTX is byte-identical with and without the code; ptx-check -D GV_NORM_IN_EARLY clean on sm_80-sm_90, 127-128
# registers, no spills). Why: `llmrs profile --timeline` (session 31 call1) put the 7B AWQ's chain consumers
# +42.7 us (gate_up) and +18.1 (qkv) a step over the plain forms, eating the 73 us the chain saves.
#   PART=1 (~3 min): the 4-bit GEMV GPU tests with the define (compiles every kernel once more).
#   PART=2 (~5 min): decode bench, one run a process, alternated: 7B AWQ chain on with / without the define, and
#   auto (chain off at 3584); 3B AWQ (chain on by auto) with / without.
# If the define wins: make it unconditional (drop the #ifdef and the late loop's fallback only where K > 4096 stays),
# raise Q4_NORM_CHAIN_MAX_K if the 7B's chain now wins, rerun `pytest -m gpu tests/test_gemv_q4_gpu.py`.
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
OUT=${OUT:-/tmp/llmrs-next}; mkdir -p "$OUT"; R=/tmp/res-next; rm -rf $R; mkdir -p $R
{
if [ "${PART:-1}" = 1 ]; then
  LLMRS_CUDA_DEFINES=GV_NORM_IN_EARLY timeout 400 python3 -m pytest -q -m gpu tests/test_gemv_q4_gpu.py \
    -p no:cacheprovider > $R/gpu_tests.log 2>&1; grep -E "passed|failed|^FAILED|^E " $R/gpu_tests.log | head -12
else
  bench() {  # name, preset, env...
    local name=$1 p=$2; shift 2
    env "$@" timeout 120 python3 -m llmrs synth --like $p --quant awq --decode-bench --bandwidth-gbs 4296 \
      --prompt-len 256 --steps 256 --json $R/decode-$name.json > $R/decode-$name.log 2>&1
    python3 -c "import json; d=json.load(open('$R/decode-$name.json')); print('$name:', d['ms_per_token'], 'ms/token')"
  }
  for i in 1 2; do
    bench 7bawq-chain-early$i qwen2.5-7b LLMRS_Q4_GEMV_NORM=1 LLMRS_CUDA_DEFINES=GV_NORM_IN_EARLY
    bench 7bawq-chain$i qwen2.5-7b LLMRS_Q4_GEMV_NORM=1
    bench 7bawq-auto$i qwen2.5-7b LLMRS_X=1
  done
  bench 3bawq-early qwen2.5-3b LLMRS_CUDA_DEFINES=GV_NORM_IN_EARLY
  bench 3bawq qwen2.5-3b LLMRS_X=1
fi
} 2>&1 | tee $OUT/next.log
tar czf $OUT/next-results.tgz -C $R .
