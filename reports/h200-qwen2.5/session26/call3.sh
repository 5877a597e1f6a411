#!/usr/bin/env bash
# Session 26, call 3 (no carry, ~7 min): decode_attn_tc's tile loads as one block-table read a tile (constant
# per-lane offsets) and the O rescale skipped when no row's maximum moved; 165 registers, 3 blocks an SM.
# (1) GPU tests of the attention kernels, the graphs and the CUDA parity; (2) A/B/A: `llmrs profile` 7B bf16 at
# 64 / 256 decodes, context 384, and the 0.5B's one-stream decode bench (decode_attn_tc at one token there), new /
# before (session26/prefill_attention_before.cu swapped in) / new; (3) scripts/probe_lt_algos.py.
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
OUT=${OUT:-/tmp/llmrs-s26}; mkdir -p "$OUT"; R=$OUT
. scripts/gpu_lib.sh
NEW=/tmp/prefill_attention_new.cu; cp llmrs/kernels_cu/prefill_attention.cu $NEW
BEFORE=reports/h200-qwen2.5/session26/prefill_attention_before.cu
prof() {
  python3 -m llmrs profile --synthetic qwen2.5-7b --batch 64,256 --context 384 --prefill-len 16 --top 3 \
    -o $OUT/profile-$1.json 2>&1 | grep -E "step wall|decode_attn|attn_merge" | head -8
  python3 -m llmrs synth --like qwen2.5-0.5b --decode-bench --bandwidth-gbs 4296 --prompt-len 256 --steps 256 2>&1 \
    | grep -iE "ms/token|ms per token" | head -2
}
{
step "GPU tests: attention kernels, graphs, parity"
TEST_TIMEOUT=420 TEST_PATHS="tests/test_attention_tc_gpu.py tests/test_attention_gqa_gpu.py tests/test_cuda_graphs.py tests/test_cuda_parity.py" \
  gpu_tests
grep -E "7B attention B=" $OUT/gpu_tests.log | head -4
for v in new before new2; do
  step "A/B: $v"
  if [ $v = before ]; then cp $BEFORE llmrs/kernels_cu/prefill_attention.cu; else cp $NEW llmrs/kernels_cu/prefill_attention.cu; fi
  prof $v
done
cp $NEW llmrs/kernels_cu/prefill_attention.cu
step "cuBLASLt algorithms"
timeout 200 python3 scripts/probe_lt_algos.py --json $OUT/lt-algos.json
} 2>&1 | tee $OUT/call3.log
