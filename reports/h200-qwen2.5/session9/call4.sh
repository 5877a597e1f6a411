#!/usr/bin/env bash
# Session 9, call 4 (carry .whl): the GEMM splits merged (4 blocks an SM), o's bf16 input from decode_attn_tc, the
# frozen start-up heap. (1) the GPU tests these touch; (2) the 4-bit GEMM timing test at 1/2/4/8 blocks an SM;
# (3) servers, cold prompts (1 stream, 64/256 concurrent x 2): AWQ 7B; bf16 7B with --max-num-batched-tokens 8192
# (default 2048; call3 gave 15,094 / 15,466 tok/s at 256); each with LLMRS_GC_LOG_MS=5 (collections >= 5 ms).
cd "$(dirname "$0")/../../.."
export OUT=${OUT:-/tmp/llmrs-s9c4}; mkdir -p $OUT; R=/tmp/res-s9c4; mkdir -p $R
. scripts/gpu_lib.sh; use_wheels
export LLMRS_GC_LOG_MS=5
{
step "GPU tests: attention, prefill, tc, 4-bit, graphs, kernels, parity"
timeout 240 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_attention_tc_gpu.py \
  tests/test_prefill_attention_gpu.py tests/test_cuda_kernels.py tests/test_gemm_q4_gpu.py tests/test_quant_gpu.py \
  tests/test_gemv_q4_gpu.py tests/test_cuda_graphs.py tests/test_cuda_parity.py tests/test_attention_gqa_gpu.py \
  > $R/gpu_tests.log 2>&1
grep -E "^(FAILED|ERROR)|passed|failed" $R/gpu_tests.log | tail -8
for v in 1 2 4 8; do
  step "gemm_q4 timing, LLMRS_Q4_GEMM_BLOCKS_PER_SM=$v"
  LLMRS_Q4_GEMM_BLOCKS_PER_SM=$v timeout 100 python3 -m pytest -q -s -m gpu -p no:cacheprovider \
    tests/test_gemm_q4_gpu.py -k timing > $R/q4-timing-$v.txt 2>&1
  grep -E "T *(16|32|64|96|128)\b|passed|failed" $R/q4-timing-$v.txt | head -14
done
SERVE_MODEL=qwen2.5-7b-awq serve_bench awq
serve_bench b8192 --max-num-batched-tokens 8192
grep -h "llmrs gc" $R/serve-7b-*.log | sort | uniq -c | sort -rn | head -20
python3 - $R <<'PY'
import glob, json, sys
for f in sorted(glob.glob(sys.argv[1] + "/bench-7b-*.json")):
    for r in json.load(open(f))["runs"]:
        s = r["summary"]; i = s["itl_ms"]; t = s["ttft_ms"]
        print(f"{f.split('/')[-1]:36s} {s['output_throughput']:8.0f} tok/s  TPOT {s['tpot_ms']['mean']:.2f}  "
              f"TTFT mean {t['mean']:.0f}  ITL p99 {i['percentiles']['p99']:.1f} max {i['max']:.1f} ms")
PY
} 2>&1 | tee $OUT/summary.txt
cp $R/gpu_tests.log $OUT/
tar czf $OUT/results.tgz -C $R .
