#!/usr/bin/env bash
# session 20 call6 (one call, carry .whl): Nsight Compute over one launch of each decode linear of a layer (7B and
# 3B: the bf16 matvec, the 4-bit gemv_q4 and matvec_q4; scripts/ncu_linears.py), the SM clock left free
# (--clock-control none: durations comparable with the benches), summarized by scripts/ncu_summary.py: where the
# one-stream step's projections lose to the bandwidth floor (down ~83%, qkv / o ~80% in the graphed kernel bench).
set -uo pipefail
export PYTHONUNBUFFERED=1
. scripts/gpu_lib.sh
use_wheels || exit 1
R=/tmp/res-s20c6; mkdir -p $R
NCU=/usr/local/cuda/bin/ncu
{
for p in qwen2.5-7b qwen2.5-3b; do
  step "ncu $p"
  timeout 200 $NCU --clock-control none --section SpeedOfLight --section SchedulerStats --section WarpStateStats \
    --section InstructionStats --section LaunchStats --section Occupancy --section MemoryWorkloadAnalysis \
    --metrics "regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio" \
    -k "regex:gemv_q4|matvec" python3 scripts/ncu_linears.py --preset $p --labels $R/labels-$p.json \
    > $R/ncu-$p.txt 2> $R/ncu-$p.err
  python3 scripts/ncu_summary.py $R/ncu-$p.txt --labels $R/labels-$p.json --json $R/ncu-$p.json
  tail -3 $R/ncu-$p.err
done
} 2>&1 | tee $OUT/summary.txt
tar czf $OUT/results.tgz -C $R .
