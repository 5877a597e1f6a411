#!/usr/bin/env bash
# One call on a lent H200 for exp/gemv-cpg (carry .whl and _base = `git archive main llmrs` made beforehand):
# gemv_q4 with two sets of code registers (no moves), running pointers, and the group size fixed at compile time
# for G 32 / 128 (the _c1 / _c4 entry points: flush at fixed k32 blocks, first mma from 0, alternating scale
# buffers). Written without a GPU: the loop's SASS went from 617 instructions for 4 k32 blocks to 585 for 8.
#   1. the 4-bit GPU tests (every gemv form against numpy, T 1..16, G 32 / 64 / 128, splits, bias, accumulate);
#   2. scripts/bench_gemv_q4.py (7B shapes, T = 1; session 10 main: gate_up 29.8 us, down 18.9, qkv 9.2-9.5,
#      o 6.5-6.8; 5 blocks an SM still spills here: `llmrs ptx-check llmrs/kernels_cu/gemm_q4.cu -D GV_MINB=5`);
#   3. the 7B AWQ single-stream decode bench, main (_base) vs this tree, twice each (session 10: 2.735 ms/token);
#   4. ncu over scripts/ncu_linears.py: why each 7B decode linear is where it is (the bf16 o / qkv / down matvecs
#      at 62-83% of the floor at one token are the 7B one-stream target's gap), via scripts/ncu_summary.py.
# If faster and the tests pass: merge, note it in README "4-bit weights" and the kernel's comment.
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/llmrs-cpg}; mkdir -p "$OUT"; R=/tmp/res-cpg; mkdir -p $R
. "$(dirname "$0")/gpu_lib.sh"
use_wheels || exit 1
{
step "4-bit GPU tests"
timeout 240 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_gemv_q4_gpu.py tests/test_quant_gpu.py \
  tests/test_gemm_q4_gpu.py tests/test_cuda_graphs.py > $R/tests.log 2>&1
grep -E "^(FAILED|ERROR)|passed|failed" $R/tests.log | tail -8
step "bench_gemv_q4 7B T=1"
timeout 150 python3 scripts/bench_gemv_q4.py --splits 1,3,4,8 --json $R/gemv-7b.json 2>&1 \
  | grep -E "variant|gemv_q4 |choice|layers|WRONG"
} 2>&1 | tee $OUT/summary.txt
OUT=$OUT/ab TESTS=0 MODELS="" AWQ=1 BASE_TREE=$PWD/_base AB_VALUES="base 1 base 1" \
  bash scripts/gpu_ab.sh 2>&1 | grep -E "AWQ|ms_per|rror" | tee -a $OUT/summary.txt
{
step "ncu: one launch of each 7B decode linear (4-bit gemv / matvec_q4, bf16 matvec)"
timeout 200 /usr/local/cuda/bin/ncu --section SpeedOfLight --section SchedulerStats --section WarpStateStats \
  --section InstructionStats --section LaunchStats --section Occupancy \
  --metrics "regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio" -k "regex:gemv_q4|matvec" \
  python3 scripts/ncu_linears.py --labels $R/ncu-labels.json > $R/ncu.txt 2>&1
python3 scripts/ncu_summary.py $R/ncu.txt --labels $R/ncu-labels.json --json $R/ncu.json
} 2>&1 | tee -a $OUT/summary.txt
tar czf $OUT/results.tgz -C $R .
