#!/usr/bin/env bash
# Session 26, call 5 (no carry, ~6 min): RoPE + the K / V cache write in decode_attn_tc's prologue
# (decode_attn_tc_rope*, LLMRS_ROPE_IN_ATTENTION). (1) GPU tests: the attention kernels (the new bit-for-bit test
# against rope_write_kv + decode_attn_tc, a tiny model's decode logits with and without), the decode and prefill
# graphs, CUDA parity; (2) A/B/A/B/A/B of `llmrs profile` 7B bf16 at 64 / 256 decodes, context 384 (step walls).
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
OUT=${OUT:-/tmp/llmrs-s26}; mkdir -p "$OUT"; R=$OUT
. scripts/gpu_lib.sh
{
TEST_TIMEOUT=420 TEST_PATHS="tests/test_attention_tc_gpu.py tests/test_cuda_graphs.py tests/test_cuda_parity.py tests/test_prefill_graphs.py tests/test_profile.py" \
  gpu_tests
grep -E "7B attention B=" $OUT/gpu_tests.log | head -4
i=0
for v in 1 0 1 0 1 0; do
  i=$((i + 1))
  echo "rope_in_attention=$v ($i): $(LLMRS_ROPE_IN_ATTENTION=$v python3 -m llmrs profile --synthetic qwen2.5-7b \
    --batch 64,256 --context 384 --prefill-len 16 --top 3 -o $OUT/p5-$v-$i.json 2>&1 \
    | grep -E "step wall|decode_attn|rope_kv" | tr -s ' │' ' ' | tr '\n' ' ')"
done
} 2>&1 | tee $OUT/call5.log
