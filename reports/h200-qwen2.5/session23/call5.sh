#!/usr/bin/env bash
# Session 23, call 5 (carry .whl, ~5 min): the final tree. The whole GPU suite; where the 7B AWQ's gains come from
# (best of 3 a process: the fused epilogues off, the clusters off); the README's one-stream figures (one run a
# process).
set -uo pipefail
export PYTHONUNBUFFERED=1
. scripts/gpu_lib.sh
use_wheels || exit 1
R=/tmp/res-s23c5; mkdir -p $R
{
TEST_TIMEOUT=300 gpu_tests
cp $R/gpu_tests.log $OUT/
step "7B AWQ best of 3 a process"
timeout 150 python3 scripts/ablate_decode.py --like qwen2.5-7b --quant awq --rounds 3 \
  --variants "full/set:q4_gemv_epilogue=False/set:q4_gemv_cluster=False" --json $R/ab-7b-awq.json > $R/ab-7b-awq.log 2>&1
tail -4 $R/ab-7b-awq.log
step "decode benches, one run a process"
for p in qwen2.5-7b:1 qwen2.5-7b:2 qwen2.5-3b:1 qwen2.5-0.5b:1 qwen2.5-7b:awq qwen2.5-7b:awq2 qwen2.5-3b:awq qwen2.5-0.5b:awq; do
  n=${p#*:}; p=${p%%:*}; q=""; case $n in awq*) q=awq;; esac
  timeout 100 python3 -m llmrs synth --like $p ${q:+--quant $q} --decode-bench --bandwidth-gbs 4296 --prompt-len 256 \
    --steps 256 --json $R/decode-$p-$n.json > $R/decode-$p-$n.log 2>&1
  python3 -c "import json; d=json.load(open('$R/decode-$p-$n.json')); print('$p $n:', d['ms_per_token'], 'ms/token', round(100 * d['fraction_of_floor_measured'], 1), '% of floor')"
done
} 2>&1 | tee $OUT/summary.txt
rm -f $R/*.csv; tar czf $OUT/results.tgz -C $R .
