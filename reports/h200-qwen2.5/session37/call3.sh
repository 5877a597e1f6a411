#!/usr/bin/env bash
# Session 37 call 3 (carry .whl): does the fp16 form keep the 4-bit GEMV's numerics? tests/test_gemv_q4_gpu.py (each
# form against the exact product of the dequantized weights, fresh random inputs, odd shapes) with the kernels
# compiled -DGV_FP16 (LLMRS_CUDA_DEFINES), then without, on the same machine.
set -uo pipefail
export PYTHONUNBUFFERED=1
. scripts/gpu_lib.sh
use_wheels || exit 1
{
for d in GV_FP16 ""; do
  echo "=== test_gemv_q4_gpu.py, LLMRS_CUDA_DEFINES=${d:-(none)} $(date +%T)"
  LLMRS_CUDA_DEFINES=$d timeout 110 python3 -m pytest -q -m gpu tests/test_gemv_q4_gpu.py -p no:cacheprovider \
    -x 2>&1 | tail -15
done
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
} 2>&1 | tee $OUT/summary.txt
