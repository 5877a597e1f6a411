export PYTHONPATH=.
/usr/local/cuda/bin/ncu --section SpeedOfLight --section SchedulerStats --section WarpStateStats --section InstructionStats --section LaunchStats --section Occupancy --metrics "regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio" -k regex:"gemv_q4z|matvec_q4z" --launch-skip 2 --launch-count 14 python3 _ncu/k2.py > $OUT/ncu3.txt 2>&1
echo rc=$?
grep -E "^  [a-z_0-9]+ \(|Duration|DRAM Throughput|Issued Warp|Executed Instructions  |Achieved Occ" $OUT/ncu3.txt | head -90
