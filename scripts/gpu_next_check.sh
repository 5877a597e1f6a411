#!/usr/bin/env bash
# One call on a lent H200 (carry .whl, _ask and _ms8; ~8 min), what session 13 left unmeasured:
#   1. exp/attn-shared-key (attn_partial and attn_cluster sharing attn_init / attn_key / attn_merge_warps; ptx-check
#      clean, never run on a GPU): `mkdir _ask && git archive exp/attn-shared-key llmrs tests | tar -x -C _ask` before
#      the call; its attention, kernel and parity tests from that tree, then the 7B / 3B decode bench from main and
#      from it (the same expressions: equal bits, equal times; main on session 13's lease: 4.141-4.143 / 2.308-2.319
#      ms/token); merge it if both hold;
#   2. exp/matvec-splits8 (8 warps a row for the 7B's down: ptx-check clean, never run on a GPU): `mkdir _ms8 &&
#      git archive exp/matvec-splits8 llmrs tests scripts | tar -x -C _ms8` before the call; its split test, down
#      inside graphs at splits 4 / 8, and the 7B decode bench with LLMRS_MATVEC_LONG_SPLITS=4 / 8 alternated twice
#      (if 8 wins: merge and make it the long-K default in _matvec_splits);
#   3. what bounds the 4-bit GEMM at 256 tokens (issue 6 under load: ~300-350 TFLOP/s of mma.sync, cuBLAS's wgmma
#      350-490): Nsight Compute on gemm_q4z_m8 for the 7B's four linears at T 256 (tensor pipe, shared memory,
#      issue slots, stall reasons), to choose between a 2 x 2 warp tile (half the ldmatrix traffic, twice the
#      dequantization) and a wgmma kernel;
#   4. the server TTFT's server-to-server spread (session 13: medians 9.67-11.25 ms over 10 fresh servers of the same
#      code, the engine alone 7.31-7.52): four fresh servers, each traced (LLMRS_TRACE_FILE), 24 new 256-token prompts:
#      which segment (app, route / tokenize, core, step, GPU, SSE) carries the difference between a slow and a fast
#      server.
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/llmrs-next}; mkdir -p "$OUT"; R=/tmp/res-next; rm -rf $R; mkdir -p $R
. "$(dirname "$0")/gpu_lib.sh"
use_wheels || exit 1
ROOT=$PWD
{
if [ -d _ask ]; then
  step "exp/attn-shared-key: attention, kernel and parity tests"
  (cd _ask && PYTHONPATH=$PWD:/tmp/site timeout 240 python3 -m pytest -q -m gpu -p no:cacheprovider \
    tests/test_attention_sum8_gpu.py tests/test_attention_cluster_gpu.py tests/test_cuda_kernels.py \
    tests/test_cuda_parity.py > $R/ask-tests.log 2>&1; tail -3 $R/ask-tests.log)
  for p in qwen2.5-7b qwen2.5-3b; do
    for tree in . _ask; do
      (cd $ROOT/$tree && PYTHONPATH=$PWD:/tmp/site timeout 100 python3 -m llmrs synth --like $p --decode-bench \
        --bandwidth-gbs 4296 --prompt-len 256 --steps 256 --json $R/decode-$p-$(basename $tree).json) > /dev/null 2>&1
      python3 -c "import json,sys; print(f'{sys.argv[2]:28s} {json.load(open(sys.argv[1]))[\"ms_per_token\"]:.3f} ms/token')" \
        $R/decode-$p-$(basename $tree).json "$p $tree" 2>/dev/null || echo "$p $tree: FAILED"
    done
  done
fi
if [ -d _ms8 ]; then
  step "exp/matvec-splits8: split test, down inside graphs, decode bench 4 / 8"
  (cd _ms8 && PYTHONPATH=$PWD:/tmp/site timeout 120 python3 -m pytest -q -m gpu -p no:cacheprovider \
    tests/test_cuda_kernels.py -k matvec_splits > $R/ms8-tests.log 2>&1; tail -2 $R/ms8-tests.log)
  (cd _ms8 && PYTHONPATH=$PWD:/tmp/site timeout 120 python3 scripts/bench_kernels_graph.py --like qwen2.5-7b \
    --json $R/ms8-kgraph.json > $R/ms8-kgraph.txt 2>&1; grep -E "matvec down" $R/ms8-kgraph.txt)
  for run in 1 2; do
    for v in 4 8; do
      (cd _ms8 && LLMRS_MATVEC_LONG_SPLITS=$v PYTHONPATH=$PWD:/tmp/site timeout 100 python3 -m llmrs synth \
        --like qwen2.5-7b --decode-bench --bandwidth-gbs 4296 --prompt-len 256 --steps 256 \
        --json $R/ms8-decode-$v-$run.json) > /dev/null 2>&1
      python3 -c "import json,sys; print(f'7B long splits {sys.argv[2]} run {sys.argv[3]}: {json.load(open(sys.argv[1]))[\"ms_per_token\"]:.3f} ms/token')" \
        $R/ms8-decode-$v-$run.json $v $run 2>/dev/null || echo "splits $v run $run: FAILED"
    done
  done
fi
step "ncu: gemm_q4 at 256 tokens"
timeout 300 /usr/local/cuda/bin/ncu --clock-control none --section SpeedOfLight --section ComputeWorkloadAnalysis \
  --section MemoryWorkloadAnalysis --section SchedulerStats --section WarpStateStats --section Occupancy \
  --metrics "regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio" -k "regex:gemm_q4[zm]_m" \
  python3 scripts/ncu_linears.py --tokens 256 --kinds gemm --labels $R/gemm-labels.json > $R/ncu-gemm.txt 2>&1
python3 scripts/ncu_summary.py $R/ncu-gemm.txt --labels $R/gemm-labels.json 2>&1 | tail -8
grep -E "Compute \(SM\) Throughput|Memory Throughput|L1/TEX Cache Throughput|Issue Slots Busy|Executed Ipc A" \
  $R/ncu-gemm.txt | head -24
for i in 1 2 3 4; do
  step "traced server $i"
  rm -f $R/trace-$i.txt
  serve_up traced-$i LLMRS_TRACE_FILE=$R/trace-$i.txt || continue
  LLMRS_TRACE_FILE=$R/trace-$i.txt ttft_bench traced-$i 256 $((3000 + i)) "server $i"
  python3 scripts/ttft_trace.py $R/trace-$i.txt --skip 2 --json $R/trace-$i.json | tail -14
  serve_down
done
} 2>&1 | tee $OUT/summary.txt
tar czf $OUT/results.tgz -C $R .
