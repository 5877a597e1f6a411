#!/usr/bin/env bash
set -uo pipefail; export PYTHONUNBUFFERED=1
. scripts/gpu_lib.sh; use_wheels || exit 1
R=/tmp/res2; mkdir -p $R
step "GPU tests (main with the merged branches + q4 L2 prefetch)"
timeout 240 python3 -m pytest -q -m gpu -p no:cacheprovider tests > $R/gpu_tests.log 2>&1; grep -E "^(FAILED|ERROR)|passed|failed" $R/gpu_tests.log | tail -8
step "gemv_q4 / matvec_q4 timings (7B AWQ shapes, in graphs) by LLMRS_Q4_PREFETCH"
for v in 0 1 2 4; do
  LLMRS_Q4_PREFETCH=$v timeout 90 python3 -m pytest -q -s -p no:cacheprovider -m gpu tests/test_gemv_q4_gpu.py -k bandwidth > $R/q4-pf$v.log 2>&1
  echo "pf=$v $(tail -1 $R/q4-pf$v.log)"; grep -E "28 layers|T1:" $R/q4-pf$v.log
done
step "decode 7B AWQ by LLMRS_Q4_PREFETCH"
OUT=$R/ab-awq TESTS=0 MODELS="" AB_VAR=LLMRS_Q4_PREFETCH AB_VALUES="0 2 4" bash scripts/gpu_ab.sh | grep -v '^$'
step "decode bf16"
OUT=$R/ab-bf16 TESTS=0 AWQ=0 RUNS="1 2" AB_VALUES=1 bash scripts/gpu_ab.sh | grep -v '^$'
[ $SECONDS -lt 400 ] && OUT=$R/ttft bash scripts/ttft_probe.sh
echo "total ${SECONDS}s"
