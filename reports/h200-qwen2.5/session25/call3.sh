#!/usr/bin/env bash
# Session 25, call 3 (carry .whl, ~5 min): the step budget under load. At 256 concurrent (prompt 256, 256 new
# tokens) the run's length is the last request's TTFT (~2.1 s, the prefill burst) plus its 255 decode steps; does a
# budget of 16384 tokens a step shorten the burst against the 8192 default? Four fresh 7B bf16 servers, 8192 /
# 16384 / 16384 / 8192, each: 256 concurrent three times, 64 concurrent once (every run its own prompts).
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/llmrs-s25}; mkdir -p "$OUT"; R=/tmp/res-s25c3; rm -rf $R; mkdir -p $R
. scripts/gpu_lib.sh
use_wheels || exit 1
{
i=0
for b in 8192 16384 16384 8192; do
  i=$((i + 1))
  step "server $i: 7B bf16, --max-num-batched-tokens $b"
  SERVE_SOURCE="--synthetic qwen2.5-7b --max-num-batched-tokens $b" serve_up s$i-b$b && {
    grep -h "tokens a step" $R/serve-s$i-b$b.log | tail -1
    for run in 1 2 3; do load_bench bench-7b-s$i-b$b-run$run-c256 256 $((5000 + 100 * i + run)); done
    load_bench bench-7b-s$i-b$b-run4-c64 64 $((5000 + 100 * i + 4))
    serve_down
  }
done
step "results (output tok/s, TPOT mean)"
bench_table $R
python3 - $R <<'PY'
import glob, json, sys
for f in sorted(glob.glob(sys.argv[1] + "/bench-7b-*c256.json")):
    s = json.load(open(f))["runs"][0]["summary"]
    print(f"{f.split('/')[-1]:40s} duration {s['duration_s']:.3f} s  TTFT max {s['ttft_ms']['max']:.0f} ms"
          f"  median {s['ttft_ms']['median']:.0f} ms")
PY
} 2>&1 | tee $OUT/summary.txt
for f in $R/serve-*.log; do tail -5 $f > $R/$(basename $f .log)-tail.log; rm $f; done
rm -f $R/*.csv; tar czf $OUT/results.tgz -C $R .
