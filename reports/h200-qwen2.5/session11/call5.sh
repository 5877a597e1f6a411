#!/usr/bin/env bash
# session11 call5: where the 7B's TTFT at a 256-token prompt goes (server 10.40 min / 11.02 median against a
# prefill step of 7.33 ms in `llmrs profile`, call3): the engine alone (scripts/ttft_engine_probe.py: per part of
# the first step() calls), then the server with the engine core in a process (default) and in-process.
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/llmrs-s11}; mkdir -p "$OUT"; R=/tmp/res-s11c5; rm -rf $R; mkdir -p $R
. scripts/gpu_lib.sh
use_wheels || exit 1
ttft() {  # label, serve args...
  local label=$1; shift
  python3 -m llmrs serve --synthetic qwen2.5-7b --device cuda --max-num-seqs 256 --port 8123 "$@" >"$R/serve-$label.log" 2>&1 &
  local srv=$!
  wait_health 8123 150 || { tail -20 "$R/serve-$label.log"; kill $srv; return; }
  for n in 16 256; do
    timeout 60 python3 -m llmrs bench --url http://127.0.0.1:8123 --input-len $n --output-len 2 --ignore-eos --workers 1 \
      -o $R -c 1 -n 16 --label $label --name ttft-$label-in$n > "$R/bench-$label-in$n.log" 2>&1
    python3 - "$R/ttft-$label-in$n.json" $n $label <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))["runs"][0]["summary"]
t = s["ttft_ms"]
print(f"{sys.argv[3]:14s} prompt {int(sys.argv[2]):4d}: TTFT min {t['min']:.2f}  median {t.get('median', t.get('p50')):.2f}"
      f"  mean {t['mean']:.2f} ms ({s['completed']} requests)")
PY
  done
  kill -INT $srv; wait $srv
}
{
step "engine alone"
timeout 200 python3 scripts/ttft_engine_probe.py --lens 1,16,64,256 --n 10 --json $R/engine-ttft.json
step "server TTFT"
ttft process
ttft inprocess --no-engine-process
} 2>&1 | tee $OUT/summary.txt
tar czf $OUT/results.tgz -C $R .
