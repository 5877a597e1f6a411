#!/usr/bin/env bash
# Session 23, call 6 (carry .whl, ~4 min): the split hand-off through L2 as one common.cuh helper
# (block_counts_last: gemv_q4's K slices, sample_tokens's blocks of a row), and the CUDA sampler sending only the
# rows that need the CPU sampler to the host. GPU tests of both; the sampler bench (one row uses the hand-off).
set -uo pipefail
export PYTHONUNBUFFERED=1
. scripts/gpu_lib.sh
use_wheels || exit 1
R=/tmp/res-s23c6; mkdir -p $R
{
TEST_TIMEOUT=240 TEST_PATHS="tests/test_gemv_q4_gpu.py tests/test_cuda_kernels.py" TEST_K="gemv or sampl or mixed" gpu_tests
cp $R/gpu_tests.log $OUT/
step "sampler bench"
timeout 120 python3 reports/h200-qwen2.5/session22/bench_sample.py --json $R/sample.json > $R/sample.log 2>&1
tail -14 $R/sample.log
step "7B AWQ decode, one run a process"
for i in 1 2; do
  timeout 100 python3 -m llmrs synth --like qwen2.5-7b --quant awq --decode-bench --bandwidth-gbs 4296 \
    --prompt-len 256 --steps 256 --json $R/decode-7bawq-$i.json > $R/decode-7bawq-$i.log 2>&1
  python3 -c "import json; d=json.load(open('$R/decode-7bawq-$i.json')); print('7B AWQ $i:', d['ms_per_token'], 'ms/token')"
done
} 2>&1 | tee $OUT/summary.txt
rm -f $R/*.csv; tar czf $OUT/results.tgz -C $R .
