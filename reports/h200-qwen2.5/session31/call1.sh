#!/usr/bin/env bash
# Session 31, call 1 (no carry): does CUPTI (torch.profiler) see the engine's graphed kernels? `llmrs profile
# --timeline` on the one-token step: 3B bf16, 7B AWQ with the norm chain off (auto at 3584) and on, 7B bf16.
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
OUT=${OUT:-/tmp/llmrs-s31}; mkdir -p "$OUT"
python3 -c "import torch, cupy; print('torch', torch.__version__, 'cupy', cupy.__version__)"
run() {  # name, env..., then the preset
  local name=$1; shift
  env "$@" LLMRS_TIMELINE_TRACE=$OUT/trace-$name.json timeout 280 python3 -m llmrs profile --synthetic ${PRESET} \
    --batch 1 --context 512 --steps 20 --timeline --top 25 --out $OUT/tl-$name.json > $OUT/tl-$name.log 2>&1
  echo "== $name rc=$?"; tail -40 $OUT/tl-$name.log
}
PRESET=qwen2.5-3b run 3b
PRESET=qwen2.5-7b-awq run 7bawq LLMRS_Q4_GEMV_NORM=auto
PRESET=qwen2.5-7b-awq run 7bawq-chain LLMRS_Q4_GEMV_NORM=1
PRESET=qwen2.5-7b run 7b
gzip -f $OUT/trace-*.json
