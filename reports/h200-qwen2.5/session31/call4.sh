#!/usr/bin/env bash
# Session 31, call 4 (no carry): the 4-bit GEMV's balanced K slices (LLMRS_Q4_GEMV_BALANCE, cuda_q4gemm.
# gemv_balanced_splits: the 7B's gate_up in 4 slices, the 3B's and 0.5B's in 2) on / off, one run a process,
# alternated; then the 4-bit GPU tests with it on (the default). Results in one tarball (the call returns 8 files).
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
OUT=${OUT:-/tmp/llmrs-s31}; mkdir -p "$OUT"; R=/tmp/res-s31c4; rm -rf $R; mkdir -p $R
{
bench() {  # name, preset, balance
  LLMRS_Q4_GEMV_BALANCE=$3 timeout 120 python3 -m llmrs synth --like $2 --quant awq --decode-bench \
    --bandwidth-gbs 4296 --prompt-len 256 --steps 256 --json $R/decode-$1.json > $R/decode-$1.log 2>&1
  python3 -c "import json; d=json.load(open('$R/decode-$1.json')); print('$1:', d['ms_per_token'], 'ms/token')"
}
bench 7bawq-on1 qwen2.5-7b 1
bench 7bawq-off1 qwen2.5-7b 0
bench 7bawq-on2 qwen2.5-7b 1
bench 7bawq-off2 qwen2.5-7b 0
bench 3bawq-on1 qwen2.5-3b 1
bench 3bawq-off1 qwen2.5-3b 0
bench 0.5bawq-on1 qwen2.5-0.5b 1
bench 0.5bawq-off1 qwen2.5-0.5b 0
timeout 200 python3 -m pytest -q -m gpu tests/test_gemv_q4_gpu.py tests/test_quant_gpu.py -p no:cacheprovider \
  > $R/gpu_tests.log 2>&1; grep -E "passed|failed|^FAILED|^ERROR" $R/gpu_tests.log | tail -8
} 2>&1 | tee $OUT/call4.log
tar czf $OUT/call4-results.tgz -C $R .
