#!/usr/bin/env bash
# Session 13, call 4 (carry .whl): the final default's server figures (synthetic 7B, `llmrs serve` defaults):
# one stream (8 requests, prompt 256, 256 new tokens: the TPOT with attn_cluster), TTFT at a 256-token prompt
# (24 new prompts), then 64 / 256 concurrent twice (256 requests each, new prompts).
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/llmrs-s13}; mkdir -p "$OUT"; R=/tmp/res-s13c4; rm -rf $R; mkdir -p $R
. scripts/gpu_lib.sh
use_wheels || exit 1
{
step "server (defaults): one stream"
serve_up s13 || exit 1
timeout 100 python3 -m llmrs bench --url http://127.0.0.1:8123 --input-len 256 --output-len 256 --ignore-eos \
  --workers 1 -o $R -c 1 -n 8 --seed 1301 --label one-stream --name bench-7b-one-stream > $R/one-stream.log 2>&1
python3 - $R/bench-7b-one-stream.json <<'PY'
import json, sys
for r in json.load(open(sys.argv[1]))["runs"]:
    s = r["summary"]
    print(f"one stream: {s['output_throughput']:.0f} tok/s, TPOT mean {s['tpot_ms']['mean']:.3f} ms, "
          f"median {s['tpot_ms'].get('median', float('nan')):.3f} ms")
PY
ttft_bench ttft-s13-in256 256 1307 "default"
for run in 1 2; do
  for c in 64 256; do load_bench bench-7b-s13-run$run-c$c $c $((1307 + run * 1000 + c)); done
done
serve_down
bench_table $R
} 2>&1 | tee $OUT/summary.txt
tar czf $OUT/results.tgz -C $R .
