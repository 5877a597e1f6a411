#!/usr/bin/env bash
# Session 28, call 2 (no carry, ~7 min): A/B of session 27's pinned first block-table read in decode_attn_tc
# (prefill_attention_pinned.cu = session27/decode_attn_tc_pin_first_table_read.patch applied to f7f00c9's file; not
# kept in git: COMMANDS.md says how to recreate it). (1) the attention GPU
# tests and test_early_loads (rule 3) on the pinned tree; (2) `llmrs profile` 7B bf16 at 64 / 256 decodes, context
# 384 (step walls: the overlap shows in the graphs, not in the eager per-kernel times), pinned / before alternated
# x3; (3) one-stream decode benches, one run a process, alternated: 7B AWQ x2 each, 7B bf16 x1, 3B bf16 x1.
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
OUT=${OUT:-/tmp/llmrs-s28}; mkdir -p "$OUT"; R=/tmp/res-s28c2; rm -rf $R; mkdir -p $R
. scripts/gpu_lib.sh
D=reports/h200-qwen2.5/session28
BEFORE=/tmp/prefill_attention_before.cu; cp llmrs/kernels_cu/prefill_attention.cu $BEFORE
use() { if [ $1 = before ]; then cp $BEFORE llmrs/kernels_cu/prefill_attention.cu; \
        else cp $D/prefill_attention_pinned.cu llmrs/kernels_cu/prefill_attention.cu; fi; }
{
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
use pinned
sed -i 's/(r"decode_attn_tc(_bf16)?_d64", 2), (r"decode_attn_tc", 1)/(r"decode_attn_tc", 3)/' tests/test_early_loads.py
grep -c '(r"decode_attn_tc", 3)' tests/test_early_loads.py
step "tests on the pinned tree: test_early_loads (CPU SASS) + attention_tc GPU"
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_early_loads.py 2>&1 | tail -2
TEST_TIMEOUT=200 TEST_PATHS="tests/test_attention_tc_gpu.py" gpu_tests; cp $R/gpu_tests.log $OUT/
step "profile 7B bf16 decode 64/256 at 384, pinned / before x3"
i=0
for v in pinned before pinned before pinned before; do
  i=$((i + 1)); use $v
  echo "$v $i: $(python3 -m llmrs profile --synthetic qwen2.5-7b --batch 64,256 --context 384 --prefill-len 16 --top 2 \
    -o $R/p-$v-$i.json 2>&1 | grep -E "step wall|decode_attn" | tr -s ' │' ' ' | tr '\n' ' ')"
done
step "one-stream decode benches (prompt 256, 256 steps), one run a process"
for spec in "qwen2.5-7b awq" "qwen2.5-7b awq" "qwen2.5-7b -" "qwen2.5-3b -"; do
  set -- $spec
  for v in pinned before; do
    use $v; q=$2; [ $q = - ] && q=
    timeout 120 python3 -m llmrs synth --like $1 ${q:+--quant $q} --decode-bench --bandwidth-gbs 4296 \
      --prompt-len 256 --steps 256 --json $R/d-$1-$2-$v-$RANDOM.json > $R/d.log 2>&1
    echo "$1 ${2} $v: $(ls -t $R/d-$1-$2-$v-*.json | head -1 | xargs python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['ms_per_token'])") ms/token"
  done
done
use before
} 2>&1 | tee $OUT/call2.log
tar -C $R -cJf $OUT/results.tar.xz .
