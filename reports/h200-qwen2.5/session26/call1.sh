#!/usr/bin/env bash
# Session 26, call 1 (no carry, ~5 min): where a loaded server's steps go. (1) `llmrs profile` of the 7B bf16 at
# 64 / 256 decodes (context 384: the 256-concurrent run's mean) and a prefill step of 32 prompts x 256 tokens (the
# 8192-token budget's burst step, new flag --prefill-seqs); (2) decode_attn_tc's blocks an SM under each carveout;
# (3) the decode profile again with LLMRS_ATTN_TC_CARVEOUT=100 and once more without (A / B / A); (4) the profile
# GPU tests.
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
OUT=${OUT:-/tmp/llmrs-s26}; mkdir -p "$OUT"
. scripts/gpu_lib.sh
{
step "profile GPU tests"
timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_profile.py 2>&1 | tail -3
step "decode_attn_tc occupancy"
python3 scripts/attn_occupancy.py
step "profile 7B: decode 64/256 at context 384, prefill 32 x 256"
python3 -m llmrs profile --synthetic qwen2.5-7b --batch 64,256 --context 384 --prefill-len 256 --prefill-seqs 32 \
  --top 14 -o $OUT/profile-7b-burst.json 2>&1 | tail -75 || true
for v in 100 "" 100; do
  step "profile 7B decode 64/256 at 384, LLMRS_ATTN_TC_CARVEOUT='$v'"
  LLMRS_ATTN_TC_CARVEOUT=$v python3 -m llmrs profile --synthetic qwen2.5-7b --batch 64,256 --context 384 \
    --prefill-len 16 --top 4 -o $OUT/profile-7b-carve${v:-default}-$RANDOM.json 2>&1 \
    | grep -E "step wall|kernel ms|attention|decode B" | head -12
done
} 2>&1 | tee $OUT/call1.log
