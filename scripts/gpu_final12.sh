#!/usr/bin/env bash
# Session 12's last call on a lent H200 (carry .whl; ~4 min): the mended GPU tests of the bf16 gate/up change, the
# 256-sequence decode step with LLMRS_GATE_UP_BF16 0 / 1 alternated (graph walls: session 12 call 6 saw 9.344 /
# 9.493 once), then the default server's figures (TTFT at 256 tokens, 256 and 64 concurrent, fresh seeds).
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/llmrs-final12}; mkdir -p "$OUT"; R=/tmp/res-final12; rm -rf $R; mkdir -p $R
. "$(dirname "$0")/gpu_lib.sh"
use_wheels || exit 1
{
step "GPU tests: kernels, parity"
LLMRS_GPU_REPORT=$R/gpu_figures.jsonl timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider -rs \
  tests/test_cuda_kernels.py tests/test_cuda_parity.py > $R/gpu_tests.log 2>&1
grep -E "^(FAILED|ERROR)|passed|failed" $R/gpu_tests.log | tail -8
for round in 1 2; do
  for v in 0 1; do
    LLMRS_GATE_UP_BF16=$v timeout 120 python3 -m llmrs profile --synthetic qwen2.5-7b --batch 64,256 --context 512 \
      --steps 5 --out $R/profile-gu$v-r$round.json > $R/profile-gu$v-r$round.txt 2>&1
    echo "gate_up_bf16=$v r$round: $(grep 'step wall' $R/profile-gu$v-r$round.txt | head -1)"
  done
done
server_figures final 907
} 2>&1 | tee $OUT/summary.txt
tar czf $OUT/results.tgz -C $R .
