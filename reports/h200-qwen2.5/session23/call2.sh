#!/usr/bin/env bash
# Session 23, call 2 (carry .whl, ~6 min): the cluster form capped at S = 4 (more slices keep the L2 hand-off) and
# the 7B's o on the GEMV (GEMV_ONE_TOKEN_MIN_WEIGHTS 8M). GPU tests of the GEMV; a timing probe of x written by its
# producer as bf16 in the mma's fragment order (one 16-byte load a k32 block, no conversion: -DGV_XFRAG_PROBE, wrong
# products) with 4 and 5 blocks an SM; the decode bench (7B / 3B AWQ); where the 7B AWQ step's time goes (ablation).
set -uo pipefail
export PYTHONUNBUFFERED=1
. scripts/gpu_lib.sh
use_wheels || exit 1
R=/tmp/res-s23c2; mkdir -p $R
{
TEST_TIMEOUT=200 TEST_PATHS="tests/test_gemv_q4_gpu.py tests/test_quant_marlin.py" gpu_tests
cp $R/gpu_tests.log $OUT/
step "gemv_q4 per kernel with the x-fragment probe"
for pt in qwen2.5-7b:1 qwen2.5-3b:1; do
  p=${pt%%:*}; t=${pt#*:}
  timeout 200 python3 scripts/bench_gemv_q4.py --preset $p --tokens $t --splits 1,2,3,4 \
    --variants "-DGV_XFRAG_PROBE;-DGV_XFRAG_PROBE -DGV_MINB=5" --json $R/gemv-$p-t$t.json > $R/gemv-$p-t$t.log 2>&1
  grep -E "variant|choice|layers" $R/gemv-$p-t$t.log
  grep -E "^  (gate_up|down|qkv|o) +gemv_q4 +(-D[A-Z_=0-9 ]+)?S=(1|3|4) " $R/gemv-$p-t$t.log | sed 's/  WRONG.*//'
done
step "decode benches, one run a process"
for p in qwen2.5-7b qwen2.5-3b; do
  timeout 100 python3 -m llmrs synth --like $p --quant awq --decode-bench --bandwidth-gbs 4296 \
    --prompt-len 256 --steps 256 --json $R/decode-$p-awq.json > $R/decode-$p-awq.log 2>&1
  python3 -c "import json; d=json.load(open('$R/decode-$p-awq.json')); print('$p AWQ:', d['ms_per_token'], 'ms/token')"
done
step "7B AWQ step by ablation"
timeout 200 python3 scripts/ablate_decode.py --like qwen2.5-7b --quant awq --rounds 2 \
  --variants "full/-attn/-norm/-head/-o/-qkv/-mlp" --json $R/ablate-7b-awq.json > $R/ablate-7b-awq.log 2>&1
tail -8 $R/ablate-7b-awq.log
} 2>&1 | tee $OUT/summary.txt
rm -f $R/*.csv; tar czf $OUT/results.tgz -C $R .
