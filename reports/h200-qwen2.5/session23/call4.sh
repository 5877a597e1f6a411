#!/usr/bin/env bash
# Session 23, call 4 (carry .whl, ~6 min): the GEMV tests again (the backend-level epilogue test fixed), then an
# A/B probe: the rest of each warp's weights asked of L2 by one bulk prefetch before pdl_wait, in matrices of at
# most M x 2^20 weights (LLMRS_CUDA_DEFINES=MV_PREFETCH=M,GV_PREFETCH=M; the bf16 matvec and the 4-bit GEMV). One
# decode-bench run a process, the variants interleaved.
set -uo pipefail
export PYTHONUNBUFFERED=1
. scripts/gpu_lib.sh
use_wheels || exit 1
R=/tmp/res-s23c4; mkdir -p $R
{
TEST_TIMEOUT=200 TEST_PATHS="tests/test_gemv_q4_gpu.py" gpu_tests
cp $R/gpu_tests.log $OUT/
step "decode benches, one run a process: prefetch off / M=32 / M=1024"
for round in 1 2; do
  for p in qwen2.5-7b qwen2.5-3b qwen2.5-7b:awq qwen2.5-3b:awq; do
    q=""; case $p in *:awq) q=awq; p=${p%%:*};; esac
    for v in off 32 1024; do
      d=""; [ $v != off ] && d="MV_PREFETCH=$v,GV_PREFETCH=$v"
      f=$R/decode-$p${q:+-$q}-pf$v-r$round
      LLMRS_CUDA_DEFINES="$d" timeout 150 python3 -m llmrs synth --like $p ${q:+--quant $q} --decode-bench \
        --bandwidth-gbs 4296 --prompt-len 256 --steps 256 --json $f.json > $f.log 2>&1
      python3 -c "import json; d=json.load(open('$f.json')); print('$p ${q:-bf16} pf=$v r$round:', d['ms_per_token'], 'ms/token')"
    done
  done
done
} 2>&1 | tee $OUT/summary.txt
rm -f $R/*.csv; tar czf $OUT/results.tgz -C $R .
