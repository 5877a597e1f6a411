#!/usr/bin/env bash
# The runs behind reports/h200-perf/README.md, in one call on a lent H200 (see README "Profiling and CUDA graphs").
# Expects the wheels the machine lacks in .whl/; results land in $OUT.
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/llmrs-perf-out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=$PWD:/tmp/site
step() { echo; echo "=== $1"; }
step "GPU"; nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader
step "graph + profile GPU tests"
timeout 150 python3 -m pytest -q -x -m gpu -p no:cacheprovider tests/test_cuda_graphs.py tests/test_profile.py 2>&1 \
  | tee "$OUT/gpu_tests.log" | tail -15
for p in qwen2.5-0.5b qwen2.5-7b; do
  for g in 0 1; do
    step "decode bench $p graphs=$g"
    LLMRS_CUDA_GRAPHS=$g timeout 120 python3 -m llmrs synth --like $p --decode-bench --bandwidth-gbs 4296 \
      --prompt-len 256 --steps 256 --json "$OUT/decode-$p-graphs$g.json" 2>&1 | grep -E "ms_per_token|fraction_of_floor_measured|error" 
  done
done
step "profile synthetic qwen2.5-7b"
timeout 200 python3 -m llmrs profile --synthetic qwen2.5-7b --batch ${PROFILE_BATCH:-1,64} --context 512 --measure \
  --out "$OUT/profile-qwen2.5-7b.json" --plot "$OUT/profile-qwen2.5-7b.png" 2>&1 | tee "$OUT/profile-qwen2.5-7b.txt" | head -24
step "parity tests (graphs on by default)"
timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_cuda_parity.py tests/test_cuda_kernels.py 2>&1 \
  | tail -5
