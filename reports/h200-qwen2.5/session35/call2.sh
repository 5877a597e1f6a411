#!/usr/bin/env bash
# Session 35 (carry .whl): where the 4-bit GEMV's warps wait, instruction by instruction. Nsight Compute's
# warp-state sampling (SourceCounters, WarpStateStats, the memory workload) over one launch of gemv_q4 for the 7B's
# gate_up (37888 x 3584) and down (3584 x 18944) (scripts/ncu_linears.py, AWQ G128 random, the backend's K splits),
# the SM clock left free; the per-SASS-instruction stall samples exported as CSV (ncu -i ... --page source).
# Then (SUITE=1, the default) the whole GPU suite, `pytest -m gpu tests`, on the same tree.
set -uo pipefail
export PYTHONUNBUFFERED=1
. scripts/gpu_lib.sh
use_wheels || exit 1
R=/tmp/res-s35c3; rm -rf $R; mkdir -p $R
NCU=/usr/local/cuda/bin/ncu; [ -x $NCU ] || NCU=$(command -v ncu)
{
step "ncu gemv_q4, 7B gate_up and down"
for i in 2 3; do  # the launches of ncu_linears.py --kinds gemv: qkv, o, gate_up, down
  timeout 200 $NCU --clock-control none --import-source no --section SpeedOfLight --section SchedulerStats \
    --section WarpStateStats --section SourceCounters --section MemoryWorkloadAnalysis \
    --section MemoryWorkloadAnalysis_Chart --section Occupancy --section LaunchStats \
    --metrics "regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio" \
    -k "regex:gemv_q4" --launch-skip $i --launch-count 1 -o $R/gemv-$i -f \
    python3 scripts/ncu_linears.py --preset qwen2.5-7b --kinds gemv --labels $R/labels.json > $R/run-$i.log 2>&1
  tail -2 $R/run-$i.log
  $NCU -i $R/gemv-$i.ncu-rep --print-summary none > $R/details-$i.txt 2>&1
  grep -E "gemv_q4|Duration|DRAM Throughput|Warp Cycles Per Issued|Achieved Occupancy|L2 Hit|Issued Warp|stalled_(long|wait|math|not_sel|barrier|short|dispatch)" \
    $R/details-$i.txt | head -30
  $NCU -i $R/gemv-$i.ncu-rep --page source --print-source sass --csv > $R/source-$i.csv 2> $R/source-$i.err \
    || tail -3 $R/source-$i.err
  python3 scripts/ncu_sass_top.py $R/source-$i.csv --top 25
done
[ "${SUITE:-1}" = 1 ] && TEST_TIMEOUT=420 gpu_tests
} 2>&1 | tee $OUT/summary.txt
gzip $R/details-*.txt $R/source-*.csv $R/gpu_tests.log 2>/dev/null; tar czf $OUT/results.tgz -C $R --exclude '*.ncu-rep' .
