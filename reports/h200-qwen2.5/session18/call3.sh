#!/usr/bin/env bash
# session 18 call3 (main with the long-K split rule): the one-stream decode bench of 7B / 3B / 0.5B with the new
# default (the fewest splits reaching 3584 warps), then scripts/gpu_first_run.sh (EAGER vs lazy module loading).
set -uo pipefail
. scripts/gpu_lib.sh && use_wheels || exit 1
for p in qwen2.5-7b qwen2.5-3b qwen2.5-0.5b; do
  timeout 100 python3 -m llmrs synth --like $p --decode-bench --bandwidth-gbs 4296 --prompt-len 256 --steps 256 \
    --json $OUT/decode-$p.json 2>&1 | tail -3
done | tee $OUT/decode.txt
bash scripts/gpu_first_run.sh
