#!/usr/bin/env bash
# Session 16, call 6 (warm; carry .gguf/p02): earlier calls of the lease moved the SmolLM2 GGUF's first two thirds
# to /tmp/models (p00, p01: the tracked tree is 30 MB now, a half no longer fits beside it) and installed the wheels
# into /tmp/site (.whl does not fit beside a third either).
#   1. the SmolLM2 GGUF's GPU tests (parity, 4-bit, engine process, server) with this session's 4-bit rules;
#   2. Nsight Compute on the 7B's four AWQ linears at 256 tokens (the 256-token wgmma form, gemm_q4w2) and at one
#      token (gemv_q4, beside bf16's matvec): what bounds them, for the next session.
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/llmrs-s16}; mkdir -p "$OUT"; R=/tmp/res-s16c6; rm -rf $R; mkdir -p $R
. scripts/gpu_lib.sh
export PYTHONPATH=$PWD:/tmp/site
cat /tmp/models/p00 /tmp/models/p01 .gguf/p02 > /tmp/models/SmolLM2-135M-Instruct.Q4_1.gguf || exit 1
export LLMRS_EMBEDDED_DIR=/tmp/models
{
TEST_TIMEOUT=240 TEST_PATHS="tests/test_cuda_parity.py tests/test_quant_gpu.py tests/test_engine_process.py tests/test_server.py" gpu_tests
NCU="/usr/local/cuda/bin/ncu --clock-control none --section SpeedOfLight --section MemoryWorkloadAnalysis \
  --section SchedulerStats --section WarpStateStats --section Occupancy --section LaunchStats \
  --metrics regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio"
step "ncu: the 4-bit GEMM at 256 tokens"
timeout 150 $NCU -k "regex:gemm_q4(wg|w2)?[zm]" python3 scripts/ncu_linears.py --tokens 256 --kinds gemm \
  --labels $R/gemm-labels.json > $R/ncu-gemm.txt 2>&1
python3 scripts/ncu_summary.py $R/ncu-gemm.txt --labels $R/gemm-labels.json 2>&1 | tail -8
step "ncu: one token, gemv_q4 and bf16 matvec"
timeout 150 $NCU -k "regex:(gemv_q4|matvec)" python3 scripts/ncu_linears.py --tokens 1 --kinds gemv,bf16 \
  --labels $R/gemv-labels.json > $R/ncu-gemv.txt 2>&1
python3 scripts/ncu_summary.py $R/ncu-gemv.txt --labels $R/gemv-labels.json 2>&1 | tail -12
} 2>&1 | tee $OUT/summary.txt
tar czf $OUT/results.tgz -C $R .
