#!/usr/bin/env bash
# Everything GPU in one run, for the lent GPU machine (see README "CUDA backend"): the GPU tests, the server
# tests against --device cuda, ptx-check, then first decode and serving figures. Results land in $OUT.
# Expects: wheels of what the machine lacks in .whl/, the embedded GGUF in $LLMRS_EMBEDDED_DIR.
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/llmrs-gpu-out}; mkdir -p "$OUT"
. "$(dirname "$0")/gpu_lib.sh"
use_wheels || exit 1
step "GPU"; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
step "doctor"; timeout 120 python3 -m llmrs doctor
step "GPU tests (every test marked gpu)"; LLMRS_GPU_REPORT=$OUT/gpu_figures.jsonl timeout 420 python3 -m pytest -q -m gpu \
  -p no:cacheprovider -rs tests 2>&1 | tee "$OUT/gpu_tests.log" | tail -12
step "server tests on --device cuda"; LLMRS_TEST_DEVICE=cuda timeout 300 python3 -m pytest -q -p no:cacheprovider \
  tests/server/test_server.py 2>&1 | tee "$OUT/server_cuda_tests.log" | tail -6
[ "${SKIP_BENCH:-0}" = 1 ] && exit 0
step "generate on cuda"; timeout 120 python3 -m llmrs generate --device cuda --chat -p "What is the capital of France?" --max-tokens 24
for p in qwen2.5-0.5b qwen2.5-7b; do
  step "decode bench $p"; timeout 180 python3 -m llmrs synth --like $p --decode-bench --json "$OUT/decode-$p.json" 2>&1 | tail -3
done
step "serving bench: synthetic qwen2.5-7b, 1 and 64 concurrent"
timeout 300 python3 -m llmrs bench --server-cmd "python3 -m llmrs serve --synthetic qwen2.5-7b --device cuda --port {port}" \
  -n 64 --sweep concurrency=1,64 --input-len 256 --output-len 64 --ignore-eos --workers 4 --label llmrs-h200-7b \
  -o "$OUT" --name serve-7b 2>&1 | tail -12
