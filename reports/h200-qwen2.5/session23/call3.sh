#!/usr/bin/env bash
# Session 23, call 3 (carry .whl, ~7 min): gemv_q4's paired forms (gate_up + SiLU x up, qkv + RoPE + KV write in the
# epilogue). GPU tests (the GEMV, the quantized models, graphs, parity, the bf16 pair kernels whose rope epilogue
# moved into common.cuh); best of 3 a process with the epilogues off; the decode bench (7B / 3B AWQ).
set -uo pipefail
export PYTHONUNBUFFERED=1
. scripts/gpu_lib.sh
use_wheels || exit 1
R=/tmp/res-s23c3; mkdir -p $R
{
TEST_TIMEOUT=330 TEST_PATHS="tests/test_gemv_q4_gpu.py tests/test_quant_gpu.py tests/test_cuda_graphs.py tests/test_cuda_parity.py tests/test_cuda_kernels.py" gpu_tests
cp $R/gpu_tests.log $OUT/
step "AWQ decode best of 3 a process"
for p in qwen2.5-7b qwen2.5-3b; do
  timeout 150 python3 scripts/ablate_decode.py --like $p --quant awq --rounds 3 \
    --variants "full/set:q4_gemv_epilogue=False" --json $R/ab-$p-awq.json > $R/ab-$p-awq.log 2>&1
  tail -3 $R/ab-$p-awq.log
done
step "decode benches, one run a process"
for p in qwen2.5-7b qwen2.5-3b qwen2.5-0.5b; do
  timeout 100 python3 -m llmrs synth --like $p --quant awq --decode-bench --bandwidth-gbs 4296 \
    --prompt-len 256 --steps 256 --json $R/decode-$p-awq.json > $R/decode-$p-awq.log 2>&1
  python3 -c "import json; d=json.load(open('$R/decode-$p-awq.json')); print('$p AWQ:', d['ms_per_token'], 'ms/token')"
done
} 2>&1 | tee $OUT/summary.txt
rm -f $R/*.csv; tar czf $OUT/results.tgz -C $R .
