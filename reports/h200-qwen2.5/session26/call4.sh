#!/usr/bin/env bash
# Session 26, call 4 (no carry, ~3 min): the graph walls of call 3 at 256 decodes moved more between processes
# than between trees; alternate the trees (new / before / new / before / new / before), `llmrs profile` 7B bf16 at
# 64 and 256 decodes, context 384 (step walls, the attention's eager time), then the 0.5B one-stream decode bench
# (decode_attn_tc at one token there) new / before / new / before.
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
OUT=${OUT:-/tmp/llmrs-s26}; mkdir -p "$OUT"; R=$OUT
. scripts/gpu_lib.sh
NEW=/tmp/prefill_attention_new.cu; cp llmrs/kernels_cu/prefill_attention.cu $NEW
BEFORE=reports/h200-qwen2.5/session26/prefill_attention_before.cu
use() { if [ $1 = before ]; then cp $BEFORE llmrs/kernels_cu/prefill_attention.cu; else cp $NEW llmrs/kernels_cu/prefill_attention.cu; fi; }
{
i=0
for v in new before new before new before; do
  i=$((i + 1)); use $v
  echo "$v $i: $(python3 -m llmrs profile --synthetic qwen2.5-7b --batch 64,256 --context 384 --prefill-len 16 --top 2 \
    -o $OUT/p4-$v-$i.json 2>&1 | grep -E "step wall|decode_attn" | tr -s ' │' ' ' | tr '\n' ' ')"
done
for v in new before new before; do
  use $v
  echo "0.5B $v: $(python3 -m llmrs synth --like qwen2.5-0.5b --decode-bench --bandwidth-gbs 4296 --prompt-len 256 \
    --steps 256 2>&1 | grep -E "ms_per_token " | tr -s ' │' ' ')"
done
use new
} 2>&1 | tee $OUT/call4.log
