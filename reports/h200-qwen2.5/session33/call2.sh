#!/usr/bin/env bash
# Session 33, call 2 (no carry): `llmrs profile --timeline` (CUPTI through torch.profiler) of the graphed one-token
# step at context 384: the 7B AWQ with the gate_up tail on / off (LLMRS_Q4_GEMV_TAIL=0), and the 3B bf16 (issue 8's
# miss) under today's defaults (attention + o as one kernel).
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
R=/tmp/res2; rm -rf $R; mkdir -p $R
run() {  # name, preset, env...
  local name=$1 p=$2; shift 2
  env "$@" timeout 200 python3 -m llmrs profile --synthetic $p --batch 1 --context 384 --steps 20 --timeline \
    --top 25 --out $R/tl-$name.json > $R/tl-$name.log 2>&1
  echo "== $name rc=$?"; grep -v Warning $R/tl-$name.log | grep -v _warn_once | head -24
}
{
run 7bawq-tail qwen2.5-7b-awq LLMRS_X=1
run 7bawq-notail qwen2.5-7b-awq LLMRS_Q4_GEMV_TAIL=0
run 3b qwen2.5-3b LLMRS_X=1
} 2>&1 | tee $OUT/call2.log
tar czf $OUT/results.tgz -C $R .
