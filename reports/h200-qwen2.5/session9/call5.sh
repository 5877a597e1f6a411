#!/usr/bin/env bash
# Session 9, call 5 (carry .whl): the session's final state. Every GPU test; then the servers with the new default
# step budget (8192 tokens on this GPU: the startup line says so), cold prompts: bf16 7B and AWQ 7B (1 stream,
# 64 / 256 concurrent x 2).
cd "$(dirname "$0")/../../.."
export OUT=${OUT:-/tmp/llmrs-s9c5}; mkdir -p $OUT; R=/tmp/res-s9c5; mkdir -p $R
. scripts/gpu_lib.sh; use_wheels
{
TEST_TIMEOUT=230 gpu_tests
serve_bench default
SERVE_MODEL=qwen2.5-7b-awq serve_bench awq
grep -h "tokens a step" $R/serve-7b-*.log
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
