#!/usr/bin/env bash
# Session 22, call 2 (carry .whl, ~6 min): 16 warps an attn_cluster 4-head block the default now (call1: 7B 3.934 ->
# 3.908, 3B 2.126 -> 2.077 ms/token best of 3). The whole GPU suite with it (no GGUF: those tests skip), the A/B
# again the other way (set:attn_cluster_warps=8) with LLMRS_MATVEC_STREAMK=long's form (down only, not the lm_head),
# then `llmrs synth --decode-bench` one run a process (7B twice, 3B, 0.5B, 7B AWQ: the README's figures).
set -uo pipefail
export PYTHONUNBUFFERED=1
. scripts/gpu_lib.sh
use_wheels || exit 1
R=/tmp/res-s22c2; mkdir -p $R
{
TEST_TIMEOUT=300 gpu_tests
cp $R/gpu_tests.log $OUT/
step "decode best of 3 a process"
for p in qwen2.5-7b qwen2.5-3b; do
  timeout 120 python3 scripts/ablate_decode.py --like $p --rounds 3 \
    --variants "full/set:attn_cluster_warps=8/set:matvec_streamk=long" --json $R/ab-$p.json > $R/ab-$p.log 2>&1
  tail -4 $R/ab-$p.log; grep -B1 "kernels:" $R/ab-$p.log | grep -v "^--" | sed 's/^qwen.*round 1 *//'
done
step "decode benches, one run a process"
for p in qwen2.5-7b:1 qwen2.5-7b:2 qwen2.5-3b:1 qwen2.5-0.5b:1 qwen2.5-7b:awq; do
  n=${p#*:}; p=${p%%:*}; q=""; [ "$n" = awq ] && q=awq
  timeout 100 python3 -m llmrs synth --like $p ${q:+--quant $q} --decode-bench --bandwidth-gbs 4296 --prompt-len 256 \
    --steps 256 --json $R/decode-$p-$n.json > $R/decode-$p-$n.log 2>&1
  python3 -c "import json; d=json.load(open('$R/decode-$p-$n.json')); print('$p $n:', d['ms_per_token'], 'ms/token')"
done
} 2>&1 | tee $OUT/summary.txt
rm -f $R/*.csv; tar czf $OUT/results.tgz -C $R .
