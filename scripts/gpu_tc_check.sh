#!/usr/bin/env bash
# One call on a lent H200 for exp/attn-tc (carry .whl): is decode_attn_tc right, and is it faster?
#   1. its GPU tests (exact vs float64 / attn_partial, graphs with PDL, the 7B timing line) and the attention /
#      graph tests it must not break;
#   2. decode attention inside graphs (one token) for the 7B, 3B and 0.5B: partial / gqa / tc rows;
#   3. `llmrs profile --synthetic qwen2.5-7b --batch 1,64,256 --context 512` with LLMRS_ATTN_KERNEL=auto and =tc
#      (graph walls; main: B=256 13.2 ms of which attention 5.69);
#   4. single-stream decode, auto vs tc (scripts/gpu_ab.sh, no AWQ).
# If tc wins at a batch size, give `_use_gqa`/`_attention` an auto rule for it and run serve_bench (cold prompts).
# Output: $OUT/summary.txt + $OUT/results.tgz.
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/llmrs-tc}; mkdir -p "$OUT"; R=/tmp/res-tc; mkdir -p $R
. "$(dirname "$0")/gpu_lib.sh"
use_wheels || exit 1
{
step "tests"
timeout 240 python3 -m pytest -q -s -m gpu -p no:cacheprovider tests/test_attention_tc_gpu.py \
  tests/test_attention_gqa_gpu.py tests/test_cuda_graphs.py tests/test_attention_sum8_gpu.py > $R/tests.log 2>&1
grep -E "^(FAILED|ERROR)|passed|failed|7B attention" $R/tests.log | tail -12
for p in qwen2.5-7b qwen2.5-3b qwen2.5-0.5b; do
  step "attention inside graphs, $p, one token, context 512"
  timeout 100 python3 scripts/bench_kernels_graph.py --like $p --only attention > $R/kg-$p.txt 2>&1
  grep -E "attention .*(auto)|splits=(1|8|16|32) " $R/kg-$p.txt
done
for v in auto tc; do
  step "profile 7B B=1,64,256, LLMRS_ATTN_KERNEL=$v"
  LLMRS_ATTN_KERNEL=$v timeout 150 python3 -m llmrs profile --synthetic qwen2.5-7b --batch 1,64,256 --context 512 \
    --steps 5 > $R/profile-7b-$v.txt 2>&1
  grep -E "step wall|decode attention|attn" $R/profile-7b-$v.txt | head -8
done
OUT=$R/ab TESTS=0 RUNS="1" AWQ=0 AB_VAR=LLMRS_ATTN_KERNEL AB_VALUES="auto tc" bash scripts/gpu_ab.sh 2>&1 | grep -v '^$'
} 2>&1 | tee $OUT/summary.txt
tar czf $OUT/results.tgz -C $R .
