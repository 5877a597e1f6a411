#!/usr/bin/env bash
# Session 25, call 4 (carry .whl, ~6 min): the step budget under load, more servers. Call3 (two fresh servers each
# way) favoured 16384 tokens a step over the 8192 default by ~2% on the mean of 256-concurrent runs, with 8192's
# spread wider (its best runs the best of all). Six more fresh 7B bf16 servers, 16384 / 8192 alternating, each:
# 256 concurrent three times, 64 concurrent once (prompt 256, 256 new tokens, every run its own prompts).
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/llmrs-s25}; mkdir -p "$OUT"; R=/tmp/res-s25c4; rm -rf $R; mkdir -p $R
. scripts/gpu_lib.sh
use_wheels || exit 1
{
i=0
for b in 16384 8192 16384 8192 16384 8192; do
  i=$((i + 1))
  step "server $i: 7B bf16, --max-num-batched-tokens $b"
  SERVE_SOURCE="--synthetic qwen2.5-7b --max-num-batched-tokens $b" serve_up s$i-b$b && {
    for run in 1 2 3; do load_bench bench-7b-s$i-b$b-run$run-c256 256 $((6000 + 100 * i + run)); done
    load_bench bench-7b-s$i-b$b-run4-c64 64 $((6000 + 100 * i + 4))
    serve_down
  }
done
step "results (output tok/s, TPOT mean)"
bench_table $R
python3 - $R <<'PY'
import glob, json, statistics, sys
by = {}
for f in sorted(glob.glob(sys.argv[1] + "/bench-7b-*.json")):
    s = json.load(open(f))["runs"][0]["summary"]
    name = f.split("/")[-1]
    b, c = name.split("-b")[1].split("-")[0], name.rsplit("-c", 1)[1].split(".")[0]
    by.setdefault((b, c), []).append(s["output_throughput"])
    if c == "256":
        print(f"{name:40s} duration {s['duration_s']:.3f} s  TTFT max {s['ttft_ms']['max']:.0f} ms"
              f"  median {s['ttft_ms']['median']:.0f} ms")
for (b, c), v in sorted(by.items()):
    print(f"budget {b:>5s} c{c:>3s}: {len(v)} runs, mean {statistics.mean(v):,.0f}, median {statistics.median(v):,.0f},"
          f" {min(v):,.0f}-{max(v):,.0f}")
PY
} 2>&1 | tee $OUT/summary.txt
for f in $R/serve-*.log; do tail -5 $f > $R/$(basename $f .log)-tail.log; rm $f; done
rm -f $R/*.csv; tar czf $OUT/results.tgz -C $R .
