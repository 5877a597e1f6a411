#!/usr/bin/env bash
# Session 9, call 1 (carry .whl): every GPU test on main (covers session 8's CPU-only changes: GGUF k-quants,
# rope_freqs, sentencepiece tokenizer, detokenizer window, host weights released in serve), then exp/attn-tc's own
# check (scripts/gpu_tc_check.sh in _tc = `git archive exp/attn-tc llmrs tests scripts`).
cd "$(dirname "$0")/../../.."
export OUT=${OUT:-/tmp/llmrs-s9c1}; mkdir -p $OUT; R=/tmp/res-s9c1; mkdir -p $R
. scripts/gpu_lib.sh; use_wheels
{ TEST_TIMEOUT=240 gpu_tests; } 2>&1 | tee $OUT/summary-main.txt
cp $R/gpu_tests.log $OUT/main-gpu-tests.log
cp -r .whl _tc/ 2>/dev/null
(cd _tc && OUT=$OUT/tc bash scripts/gpu_tc_check.sh)
