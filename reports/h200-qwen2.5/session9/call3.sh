#!/usr/bin/env bash
# Session 9, call 3 (carry .whl): (1) every GPU test after decode_attn_tc / attn_merge learned to write o's bf16
# input (no cast_bf16 o on the tc path) and freeze_heap; (2) `llmrs profile` 7B B=2,64,256 (walls; the cast gone);
# (3) the 4-bit GEMM with K slices aiming at 1/2/4/8 blocks an SM (exp/gemm-q4-splits applied to this tree in _q4s,
# LLMRS_Q4_GEMM_BLOCKS_PER_SM read at each launch): its timing test, then `llmrs profile` AWQ 7B B=16,64,256 at 1 and
# 4; (4) the 7B server with the start-up heap frozen (the default now): 1 stream, 64/256 concurrent x 2, cold
# prompts; inter-token gaps against call2's (not frozen: two ~70 ms stalls of every stream in a 256 burst).
cd "$(dirname "$0")/../../.."
export OUT=${OUT:-/tmp/llmrs-s9c3}; mkdir -p $OUT; R=/tmp/res-s9c3; mkdir -p $R
. scripts/gpu_lib.sh; use_wheels
{
TEST_TIMEOUT=200 gpu_tests
step "profile 7B B=2,64,256"
timeout 90 python3 -m llmrs profile --synthetic qwen2.5-7b --batch 2,64,256 --context 512 --steps 3 \
  > $R/profile-7b.txt 2>&1
grep -E "step wall|decode attention|cast|attn" $R/profile-7b.txt | head -14
cd _q4s
for v in 1 2 4 8; do
  step "gemm_q4 timing, LLMRS_Q4_GEMM_BLOCKS_PER_SM=$v"
  LLMRS_Q4_GEMM_BLOCKS_PER_SM=$v PYTHONPATH=$PWD:/tmp/site timeout 100 python3 -m pytest -q -s -m gpu \
    -p no:cacheprovider tests/test_gemm_q4_gpu.py -k timing > $R/q4-timing-$v.txt 2>&1
  grep -E "^N[0-9]+ K[0-9]+ T|passed|failed" $R/q4-timing-$v.txt | head -12
done
for v in 1 4; do
  step "profile 7B AWQ B=16,64,256, LLMRS_Q4_GEMM_BLOCKS_PER_SM=$v"
  LLMRS_Q4_GEMM_BLOCKS_PER_SM=$v PYTHONPATH=$PWD:/tmp/site timeout 120 python3 -m llmrs profile \
    --synthetic qwen2.5-7b-awq --batch 16,64,256 --context 512 --steps 3 > $R/profile-7b-awq-$v.txt 2>&1
  grep -E "step wall|gemm|matrix" $R/profile-7b-awq-$v.txt | head -16
done
cd ..
serve_bench frozen
python3 - $R <<'PY'
import glob, json, sys
for f in sorted(glob.glob(sys.argv[1] + "/bench-7b-*.json")):
    for r in json.load(open(f))["runs"]:
        s = r["summary"]; i = s["itl_ms"]
        print(f"{f.split('/')[-1]:40s} {s['output_throughput']:8.0f} tok/s  TPOT {s['tpot_ms']['mean']:.2f}  "
              f"ITL p99 {i['percentiles']['p99']:.1f} max {i['max']:.1f} ms")
PY
} 2>&1 | tee $OUT/summary.txt
cp $R/gpu_tests.log $OUT/
tar czf $OUT/results.tgz -C $R .
