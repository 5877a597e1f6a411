#!/usr/bin/env bash
# Session 23, call 1 (carry .whl, ~7 min): gemv_q4's K slices as one thread-block cluster (partials pushed into the
# first block's shared memory, one cluster barrier) instead of the hand-off through L2. GPU tests of the 4-bit
# paths and the graphs; the per-kernel bench with both forms at every S (7B T=1 / T=4, 3B T=1); best of 3 a process
# with the cluster off; the decode bench (7B AWQ default, and with the o projection on the GEMV too).
set -uo pipefail
export PYTHONUNBUFFERED=1
. scripts/gpu_lib.sh
use_wheels || exit 1
R=/tmp/res-s23c1; mkdir -p $R
{
TEST_TIMEOUT=300 TEST_PATHS="tests/test_gemv_q4_gpu.py tests/test_quant_gpu.py tests/test_cuda_graphs.py tests/test_gemm_q4_gpu.py" gpu_tests
cp $R/gpu_tests.log $OUT/
step "gemv_q4 per kernel, cluster vs L2"
for pt in qwen2.5-7b:1 qwen2.5-7b:4 qwen2.5-3b:1; do
  p=${pt%%:*}; t=${pt#*:}
  timeout 150 python3 scripts/bench_gemv_q4.py --preset $p --tokens $t --splits 1,2,3,4,6,8 --json $R/gemv-$p-t$t.json \
    > $R/gemv-$p-t$t.log 2>&1
  grep -E "choice|layers|WRONG" $R/gemv-$p-t$t.log
done
grep -E "^  (o|qkv|down) " $R/gemv-qwen2.5-7b-t1.log
step "AWQ decode best of 3 a process"
for p in qwen2.5-7b qwen2.5-3b; do
  timeout 150 python3 scripts/ablate_decode.py --like $p --quant awq --rounds 3 \
    --variants "full/set:q4_gemv_cluster=False" --json $R/ab-$p-awq.json > $R/ab-$p-awq.log 2>&1
  tail -3 $R/ab-$p-awq.log
done
step "decode benches, one run a process"
for v in default o-gemv; do
  e=""; [ $v = o-gemv ] && e="LLMRS_Q4_GEMV_MIN_WEIGHTS=0"
  env $e timeout 100 python3 -m llmrs synth --like qwen2.5-7b --quant awq --decode-bench --bandwidth-gbs 4296 \
    --prompt-len 256 --steps 256 --json $R/decode-7bawq-$v.json > $R/decode-7bawq-$v.log 2>&1
  python3 -c "import json; d=json.load(open('$R/decode-7bawq-$v.json')); print('7B AWQ $v:', d['ms_per_token'], 'ms/token')"
done
} 2>&1 | tee $OUT/summary.txt
rm -f $R/*.csv; tar czf $OUT/results.tgz -C $R .
