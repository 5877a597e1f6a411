#!/usr/bin/env bash
# For the next lease (written at the end of session 36, not run; carry .whl for the ncu part). ~6-8 min.
#  1. The one-stream decode bench on main (prompt 256, 256 steps, one run a process): 3B, 7B, 7B AWQ, 0.5B; the
#     H200's figures after the fence change (session 36 ran on H100s only).
#  2. What the 4-bit GEMV's arithmetic waits on (NEXT.md): scripts/bench_gemv_q4.py on the 7B at S 1, 2, 4, 8 with
#     no memory (GV_ABLATE_X GV_ABLATE_LOADS: the slope over K splits separates a k32 block's cost from a block's),
#     then without the ones HMMA (GV_ABLATE_ONES: the tensor pipe) or the decode (GV_ABLATE_DECODE: the integer
#     pipe), both with and without the memory; and -DGV_FP16 (fp16 operands: 547 instructions in the main loop
#     against 566, its outputs checked against the exact product like every other row).
#  3. Nsight Compute's per-instruction stall sampling of gemv_q4 (session35/call2.sh, SUITE=0).
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
. scripts/gpu_lib.sh
R=/tmp/res37; rm -rf $R; mkdir -p $R
T0=$(date +%s); LIMIT=${LIMIT:-420}
left() { [ $(( $(date +%s) - T0 )) -lt $LIMIT ]; }
{
echo "=== decode bench $(date +%T)"
for p in "qwen2.5-3b" "qwen2.5-7b" "qwen2.5-7b --quant awq" "qwen2.5-0.5b"; do
  decode_line $R/decode-$(echo $p | tr -d ' -').json "$p" --like $p
done
echo "=== 4-bit GEMV, 7B: what its arithmetic waits on $(date +%T)"
N='-DGV_ABLATE_X -DGV_ABLATE_LOADS'
left && timeout 240 python3 scripts/bench_gemv_q4.py --preset qwen2.5-7b --splits 1,2,4,8 \
  --variants "$N;$N -DGV_ABLATE_ONES;$N -DGV_ABLATE_DECODE;-DGV_ABLATE_ONES;-DGV_ABLATE_DECODE;-DGV_FP16" \
  --json $R/gemv-pipes-7b.json 2>&1 | grep -E "gemv_q4|layers" | grep -v " l2 "
if left; then
  mkdir -p $R/ncu
  OUT=$R/ncu SUITE=0 timeout $(( LIMIT + 150 - ($(date +%s) - T0) )) bash reports/h200-qwen2.5/session35/call2.sh \
    2>&1 | tail -70
fi
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
echo "done $(( $(date +%s) - T0 )) s"
} 2>&1 | tee $OUT/next.log
gzip -f $R/*.log 2>/dev/null
tar czf $OUT/results.tgz -C $R .
