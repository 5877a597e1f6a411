#!/usr/bin/env bash
# Session 23, call 8 (carry .whl, ~2 min): call7's 3B AWQ qkv on the fused GEMV won (1.4571 / 1.4584 -> 1.3621 /
# 1.3623 ms/token). Here: the 3B's o too (4M: 2048 x 2048), and the 0.5B with every shape on the GEMV (0).
set -uo pipefail
export PYTHONUNBUFFERED=1
. scripts/gpu_lib.sh
use_wheels || exit 1
R=/tmp/res-s23c8; mkdir -p $R
{
step "AWQ decode, one run a process"
for pv in qwen2.5-3b:4194304 qwen2.5-3b:5242880 qwen2.5-3b:4194304 qwen2.5-0.5b:default qwen2.5-0.5b:0 qwen2.5-0.5b:default qwen2.5-0.5b:0; do
  p=${pv%%:*}; v=${pv#*:}; e=""; [ $v != default ] && e="LLMRS_Q4_GEMV_MIN_WEIGHTS=$v"
  env $e timeout 100 python3 -m llmrs synth --like $p --quant awq --decode-bench --bandwidth-gbs 4296 \
    --prompt-len 256 --steps 256 --json $R/decode-$p-$v.json > $R/decode-$p-$v.log 2>&1
  python3 -c "import json; d=json.load(open('$R/decode-$p-$v.json')); print('$p AWQ min weights $v:', d['ms_per_token'], 'ms/token')"
done
} 2>&1 | tee $OUT/summary.txt
rm -f $R/*.csv; tar czf $OUT/results.tgz -C $R .
