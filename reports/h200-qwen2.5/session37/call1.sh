#!/usr/bin/env bash
# Session 37 call 1 (carry .whl): which pipe the 4-bit GEMV's arithmetic waits on. Nsight Compute over one launch of
# gemv_q4 for the 7B's gate_up (launch 2 of scripts/ncu_linears.py --kinds gemv) and down (launch 3), AWQ G128, the
# backend's K splits, SM clock left free, for three builds: the default; the decode + mma with no memory
# (GV_ABLATE_X GV_ABLATE_LOADS); that without the decode (+ GV_ABLATE_DECODE). Per run: pipe utilization
# (sm__inst_executed_pipe_* and sm__pipe_*_cycles_active as % of peak), issue slots, stall reasons per issue, and
# the top SASS lines of the warp-state sampling.
set -uo pipefail
export PYTHONUNBUFFERED=1
. scripts/gpu_lib.sh
use_wheels || exit 1
R=/tmp/res-s37c1; rm -rf $R; mkdir -p $R
NCU=/usr/local/cuda/bin/ncu; [ -x $NCU ] || NCU=$(command -v ncu)
{
for build in "default:" "nomem:GV_ABLATE_X,GV_ABLATE_LOADS" "nomem_nodecode:GV_ABLATE_X,GV_ABLATE_LOADS,GV_ABLATE_DECODE"; do
  name=${build%%:*}; defs=${build#*:}
  for i in 2 3; do
    tag=$name-$i
    step "ncu gemv_q4 $tag (${defs:-no defines})"
    LLMRS_CUDA_DEFINES=$defs timeout 150 $NCU --clock-control none --import-source no --section SpeedOfLight \
      --section SchedulerStats --section WarpStateStats --section SourceCounters --section ComputeWorkloadAnalysis \
      --section InstructionStats \
      --metrics "regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio,regex:sm__inst_executed_pipe_.*\.avg\.pct_of_peak_sustained_active,regex:sm__pipe_.*_cycles_active\.avg\.pct_of_peak_sustained_active,sm__issue_active.avg.pct_of_peak_sustained_active,smsp__inst_executed.sum,sm__cycles_active.avg" \
      -k "regex:gemv_q4" --launch-skip $i --launch-count 1 -o $R/$tag -f \
      python3 scripts/ncu_linears.py --preset qwen2.5-7b --kinds gemv --labels $R/labels.json > $R/run-$tag.log 2>&1
    tail -1 $R/run-$tag.log
    $NCU -i $R/$tag.ncu-rep --print-summary none > $R/details-$tag.txt 2>&1
    grep -E "gemv_q4|Duration|SM Frequency|Issued Warp|Warp Cycles Per Issued|Executed Ipc A" $R/details-$tag.txt | head -8
    grep -E "(pipe_.*pct_of_peak|issue_active|inst_executed.sum|stalled_.*ratio)" $R/details-$tag.txt \
      | awk '$NF != "0" && $NF+0 >= 0.05 {print "   ", $1, $NF}'
    $NCU -i $R/$tag.ncu-rep --page source --print-source sass --csv > $R/source-$tag.csv 2> $R/source-$tag.err \
      || tail -3 $R/source-$tag.err
    python3 scripts/ncu_sass_top.py $R/source-$tag.csv --top 12
  done
done
} 2>&1 | tee $OUT/summary.txt
gzip $R/details-*.txt $R/source-*.csv 2>/dev/null; tar czf $OUT/results.tgz -C $R --exclude '*.ncu-rep' .
