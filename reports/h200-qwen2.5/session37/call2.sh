#!/usr/bin/env bash
# Session 37 call 2 (no carry needed): does the fp16 form (-DGV_FP16: 1 shift + 4 lop3 a code word instead of
# 3 + 4) lighten the 4-bit GEMV's arithmetic, which call 1 found ALU-pipe-heavy? bench_gemv_q4.py on the 7B at
# S 1 and 4, the default and GV_FP16, each with and without the memory (GV_ABLATE_X GV_ABLATE_LOADS); then the 7B AWQ
# one-stream decode bench (prompt 256, 256 steps, one run a process), default / GV_FP16 alternated twice. First,
# on an H200 only: the 3B, 7B, 0.5B decode bench.
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
. scripts/gpu_lib.sh
R=/tmp/res-s37c2; rm -rf $R; mkdir -p $R
{
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then  # the main figures, where an H200 came
  echo "=== decode bench on the H200 $(date +%T)"
  for p in qwen2.5-3b qwen2.5-7b qwen2.5-0.5b; do decode_line $R/decode-$p.json $p --like $p; done
fi
N='-DGV_ABLATE_X -DGV_ABLATE_LOADS'
echo "=== bench_gemv_q4 7B $(date +%T)"
timeout 200 python3 scripts/bench_gemv_q4.py --preset qwen2.5-7b --splits 1,4 \
  --variants "$N;$N -DGV_FP16;-DGV_FP16" --json $R/gemv-fp16-7b.json 2>&1 | grep -E "gemv_q4|layers" | grep -v " l2 "
echo "=== decode bench 7B AWQ, default / GV_FP16 $(date +%T)"
for r in 1 2; do
  for v in default GV_FP16; do
    d=$v; [ $v = default ] && d=
    LLMRS_CUDA_DEFINES=$d decode_line $R/decode-7bawq-$v-$r.json "7B AWQ $v run $r" --like qwen2.5-7b --quant awq
  done
done
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
} 2>&1 | tee $OUT/summary.txt
gzip -f $R/*.log 2>/dev/null; tar czf $OUT/results.tgz -C $R .
