#!/usr/bin/env bash
# (the fold was reverted after this call: it measured slower; see reports/h200-qwen2.5/README.md, ninth session)
# Session 9, call 6 (carry .whl and _base = `git archive eafe490 llmrs`): the 7B's post-attention RMSNorm folded into
# gate_up's paired matvec (GATE_UP_NORM_FOLD_MAX_K 4096; qkv's stays apart above 2048). The fold / fused-epilogue /
# graph tests, then single-stream decode of the 7B, base (eafe490, no fold at 3584) vs this tree, twice each.
cd "$(dirname "$0")/../../.."
export OUT=${OUT:-/tmp/llmrs-s9c6}; mkdir -p $OUT; R=/tmp/res-s9c6; mkdir -p $R
. scripts/gpu_lib.sh; use_wheels
{
step "GPU tests: folded norms, fused epilogues, graphs"
timeout 150 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_cuda_kernels.py -k "fold or fused" \
  tests/test_cuda_graphs.py > $R/gpu_tests.log 2>&1
grep -E "^(FAILED|ERROR)|passed|failed" $R/gpu_tests.log | tail -6
} 2>&1 | tee $OUT/summary.txt
OUT=$OUT/ab TESTS=0 RUNS="1 2" AWQ=0 MODELS="qwen2.5-7b" AB_VAR=LLMRS_FUSE_NORM AB_VALUES="base auto" \
  BASE_TREE=$PWD/_base bash scripts/gpu_ab.sh 2>&1 | grep -v '^$'
