#!/usr/bin/env bash
# Session 9, call 7 (carry .whl): after the prefill and decode_attn_tc kernels' online-softmax update became one
# helper (prefill_attention.cu online_softmax), their GPU tests. Printed: "36 passed in 45.67s".
cd "$(dirname "$0")/../../.."
. scripts/gpu_lib.sh; use_wheels
timeout 110 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_prefill_attention_gpu.py \
  tests/test_attention_tc_gpu.py 2>&1 | tail -4
