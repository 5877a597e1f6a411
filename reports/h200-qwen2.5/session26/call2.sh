#!/usr/bin/env bash
# Session 26, call 2 (no carry, ~5 min): (1) every cuBLASLt algorithm the heuristic offers for the 7B's four linears
# at 64 / 128 / 256 tokens against cublasGemmEx (scripts/probe_lt_algos.py: is there a faster algorithm for qkv / o /
# down, which run at 41-60% of the roof at 256 decodes?); (2) Nsight Compute on decode_attn_tc at 256 decodes,
# context 384 (1.9 ms of the 8.9 ms step at 64% of the datasheet bandwidth: what it waits on).
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
OUT=${OUT:-/tmp/llmrs-s26}; mkdir -p "$OUT"
. scripts/gpu_lib.sh
{
step "cuBLASLt algorithms"
timeout 240 python3 scripts/probe_lt_algos.py --json $OUT/lt-algos.json
step "ncu decode_attn_tc (256 decodes, context 384)"
which ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null
NCU=$(which ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)
[ -n "$NCU" ] && timeout 200 $NCU --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats \
  --section Occupancy --section LaunchStats --section SchedulerStats \
  --metrics "regex:smsp__average_warps_issue_stalled_.*_per_issue_active\\.ratio,dram__bytes_read.sum,lts__t_sector_hit_rate.pct" \
  -k "regex:decode_attn_tc" --launch-skip 40 --launch-count 2 \
  python3 -m llmrs profile --synthetic qwen2.5-7b --batch 256 --context 384 --prefill-len 16 --steps 1 --no-graphs \
  > $OUT/ncu-attn.txt 2>&1; echo "ncu rc=$?"
grep -E "decode_attn|Duration|DRAM Throughput|Memory Throughput|L2 Hit|L1/TEX Hit|Achieved Occupancy|Theoretical Occ|Stall|stalled|Block Limit|Registers|Warp Cycles|Issued Warp|No Eligible|dram__bytes|sector_hit" $OUT/ncu-attn.txt | head -90
} 2>&1 | tee $OUT/call2.log
