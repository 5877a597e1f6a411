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
if [ -z "${PROFILE_ONLY:-}" ]; then
step "GPU tests: graphs, profile, kernels, parity (graphs on by default)"
timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_cuda_graphs.py tests/test_profile.py \
  tests/test_cuda_kernels.py tests/test_cuda_parity.py 2>&1 | tail -4
for p in qwen2.5-0.5b qwen2.5-7b; do
  for g in 0 1; do
    step "decode bench $p graphs=$g"
    LLMRS_CUDA_GRAPHS=$g timeout 120 python3 -m llmrs synth --like $p --decode-bench --bandwidth-gbs 4296 \
      --prompt-len 256 --steps 256 --json "$OUT/decode-$p-graphs$g.json" 2>&1 | grep -E "ms_per_token|fraction_of_floor_measured|error"
  done
done
fi
for p in qwen2.5-7b qwen2.5-0.5b; do
  step "profile synthetic $p"
  plot=""; [ $p = qwen2.5-7b ] && plot="--plot $OUT/profile-$p.png"
  timeout 200 python3 -m llmrs profile --synthetic $p --batch 1,64 --context 512 --measure --top 14 \
    --out "$OUT/profile-$p.json" $plot >>"$OUT/profile.txt" 2>&1
done
[ -n "${PROFILE_ONLY:-}" ] && timeout 100 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_profile.py 2>&1 | tail -2
cat "$OUT/profile.txt"
