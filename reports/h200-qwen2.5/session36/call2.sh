#!/usr/bin/env bash
# Session 36, call 2 (carry .whl): main after the cluster-fences change (call1's A/B). The 4-bit GEMV with x's loads
# left out (gemm_q4.cu GV_ABLATE_X) and with x staged in shared memory (GV_X_SMEM, the same outputs), 7B; the 7B
# AWQ decode with GV_X_SMEM and without; the whole GPU suite; the one-stream decode bench (prompt 256, 256 steps,
# one run a process); then Nsight Compute's per-instruction stall sampling of the 4-bit GEMV (session35/call2.sh
# with SUITE=0) while time is left.
set -uo pipefail
export PYTHONUNBUFFERED=1
. scripts/gpu_lib.sh
use_wheels || exit 1
R=/tmp/res36b; rm -rf $R; mkdir -p $R
T0=$(date +%s); LIMIT=${LIMIT:-420}
left() { [ $(( $(date +%s) - T0 )) -lt $LIMIT ]; }
{
step "4-bit GEMV: x's loads left out (GV_ABLATE_X), x staged in shared memory (GV_X_SMEM), 7B"
timeout 200 python3 scripts/bench_gemv_q4.py --preset qwen2.5-7b --splits 1,4 \
  --variants '-DGV_ABLATE_LOADS;-DGV_ABLATE_X;-DGV_ABLATE_X -DGV_ABLATE_LOADS;-DGV_X_SMEM=5120' \
  --json $R/gemv-x-7b.json 2>&1 | grep -E "gemv_q4|layers" | grep -v " l2 "
step "7B AWQ decode: GV_X_SMEM=5120 / default, alternated"
for i in ${ROUNDS:-1 2}; do
  for v in GV_X_SMEM=5120 ""; do
    LLMRS_CUDA_DEFINES=$v decode_line $R/decode-7bawq-xs${v:+1}-$i.json "7B AWQ ${v:-default} run $i" \
      --like qwen2.5-7b --quant awq
  done
done
left && TEST_TIMEOUT=300 gpu_tests
step "decode bench"
for p in "qwen2.5-3b" "qwen2.5-7b" "qwen2.5-0.5b"; do
  left || break
  decode_line $R/decode-$(echo $p | tr -d ' -').json $p --like $p
done
if left; then
  mkdir -p $R/ncu
  OUT=$R/ncu SUITE=0 timeout $(( LIMIT + 150 - ($(date +%s) - T0) )) bash reports/h200-qwen2.5/session35/call2.sh \
    2>&1 | tail -70
fi
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
echo "done $(( $(date +%s) - T0 )) s"
} 2>&1 | tee $OUT/call2.log
gzip -f $R/*.log 2>/dev/null
tar czf $OUT/results.tgz -C $R .
