#!/usr/bin/env bash
# Two calls on a lent H200 that check what CPU-only sessions changed, then measure the engine-process split.
#   PART=tests bash scripts/gpu_verify.sh   every GPU test; the server suite on cuda (SmolLM2, in one process and
#                                           with --engine-process); tests/test_engine_process.py on cuda
#   PART=perf  bash scripts/gpu_verify.sh   llmrs profile at batch 1 (0.5B, 3B, 7B: the per-kernel table of one
#                                           stream); the 7B through the server at 1 / 64 / 256 concurrent, in one
#                                           process and with --engine-process, each sweep run twice
# Results: $OUT/summary-$PART.txt + $OUT/results-$PART.tgz. Expects wheels in .whl/; the SmolLM2 GGUF as
# /tmp/models/part1 (an earlier call) + .gguf/part2 (carried).
set -uo pipefail
export PYTHONUNBUFFERED=1
PART=${PART:-tests}
OUT=${OUT:-/tmp/llmrs-verify}; mkdir -p "$OUT"; R=/tmp/res-$PART; mkdir -p $R
. "$(dirname "$0")/gpu_lib.sh"
use_wheels || exit 1
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
use_gguf

{
if [ "$PART" = tests ]; then
  gpu_tests
  step "server suite on cuda, one process"; LLMRS_TEST_DEVICE=cuda LLMRS_ENGINE_PROCESS=0 timeout 150 python3 -m pytest -q \
    -p no:cacheprovider tests/test_server.py 2>&1 | tail -4
  step "server suite + engine-process tests on cuda, --engine-process"; LLMRS_TEST_DEVICE=cuda LLMRS_ENGINE_PROCESS=1 \
    timeout 200 python3 -m pytest -q -p no:cacheprovider tests/test_server.py tests/test_engine_process.py 2>&1 | tail -4
else
  for p in qwen2.5-0.5b qwen2.5-3b qwen2.5-7b; do
    step "profile $p, one stream"
    timeout 100 python3 -m llmrs profile --synthetic $p --batch 1 --context 512 --prefill-len 256 --steps 5 --top 14 \
      --out $R/profile-$p-b1.json > $R/profile-$p-b1.txt 2>&1
    cat $R/profile-$p-b1.txt
  done
  serve_bench oneproc --no-engine-process
  serve_bench engproc --engine-process
fi
} 2>&1 | tee $OUT/summary-$PART.txt
tar czf $OUT/results-$PART.tgz -C $R .
