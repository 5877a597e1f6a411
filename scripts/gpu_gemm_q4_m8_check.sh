#!/usr/bin/env bash
# One call on a lent H200 for exp/gemm-q4-m8 (carry .whl and _base = `git archive main llmrs` made beforehand):
# the 4-bit GEMM with 128-token tiles (MT 8: gemm_q4{z,m}_m8, 252 registers, 2 stages, 2 blocks an SM) from 65
# tokens instead of 64-token ones (MT 4): each decoded weight fragment feeds 8 mma, each stage's weights load once
# for 128 tokens (`llmrs ptx-check --sass`: 595 main-loop instructions for 128 HMMA against 437 for 64). Written
# without a GPU. What decides it:
#   1. the 4-bit GPU tests, with the timing test's figures (-s): gemm_q4 (MT 8) / gemm_q4 MT4 / dequantize +
#      cuBLAS at T 96..1024 on the 7B's qkv, down, gate_up (session 11 main, MT 4: gate_up T 256 258.7 / 228.6 us);
#   2. `llmrs profile --synthetic qwen2.5-7b-awq --batch 128,256` from main (_base) and from this tree with
#      LLMRS_Q4_GEMM_MAX_TOKENS=256 (the 256-sequence step through the GEMM instead of dequantize + cuBLAS;
#      session 10: 13.8 ms a step, 4.8 of it dequantizing);
#   3. if the GEMM wins at 256: the 7B AWQ through the server with LLMRS_Q4_GEMM_MAX_TOKENS=256 (session 11:
#      64 / 256 concurrent 8.1-8.4k / 12.8-13.6k tok/s; bf16 8.9-9.1k / 15.5-16.0k: issue 6's target).
# Then: keep MT 8 where it wins (MT8_FROM), raise MAX_TOKENS to where the GEMM still beats dequantize + cuBLAS.
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/llmrs-m8}; mkdir -p "$OUT"; R=/tmp/res-m8; rm -rf $R; mkdir -p $R
. "$(dirname "$0")/gpu_lib.sh"
use_wheels || exit 1
{
step "4-bit GPU tests (GEMM timing printed)"
timeout 300 python3 -m pytest -q -s -m gpu -p no:cacheprovider tests/test_gemm_q4_gpu.py tests/test_quant_gpu.py \
  tests/test_gemv_q4_gpu.py > $R/tests.log 2>&1
grep -E "^(FAILED|ERROR)|passed|failed|^N[0-9]+ K[0-9]+ T" $R/tests.log | tail -30
step "profile 7B AWQ B=128,256: main"
(cd _base && PYTHONPATH=$PWD:/tmp/site timeout 150 python3 -m llmrs profile --synthetic qwen2.5-7b-awq \
  --batch 128,256 --context 512 --steps 3) > $R/profile-awq-base.txt 2>&1
grep -E "step wall|gemm_q4|dequant|gemm gate_up|gemm down" $R/profile-awq-base.txt | head -12
step "profile 7B AWQ B=128,256: this tree, the GEMM up to 256 tokens"
LLMRS_Q4_GEMM_MAX_TOKENS=256 timeout 150 python3 -m llmrs profile --synthetic qwen2.5-7b-awq --batch 128,256 \
  --context 512 --steps 3 > $R/profile-awq-m8.txt 2>&1
grep -E "step wall|gemm_q4|dequant|gemm gate_up|gemm down" $R/profile-awq-m8.txt | head -12
LLMRS_Q4_GEMM_MAX_TOKENS=256 SERVE_MODEL=qwen2.5-7b-awq serve_bench awq-m8 > $R/serve-awq.txt 2>&1
bench_table $R
} 2>&1 | tee $OUT/summary.txt
tar czf $OUT/results.tgz -C $R .
