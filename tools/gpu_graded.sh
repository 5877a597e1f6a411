#!/usr/bin/env bash
# A graded bench on a lent GPU (issue 46's end-to-end check): `llmrs serve --synthetic qwen2.5-7b`, then
# `llmrs bench` at 1 / 64 / 256 concurrent (each run sized by its probe to about $DURATION s), graded against the
# GPU NVML sees, with GPU telemetry and the server's /metrics series, and its report; then `llmrs plan` calibrated on
# those runs predicts $PREDICT_C concurrent, and a bench at $PREDICT_C measures it. Results under $R (default $OUT).
# Run from a tree with .whl/ (make wheels): bash tools/gpu_graded.sh
set -u
source tools/gpu_lib.sh
R=${R:-$OUT}
DURATION=${DURATION:-30}
PREDICT_C=${PREDICT_C:-128}
use_wheels || exit 1
nvidia-smi --query-gpu=name,memory.total,power.limit --format=csv,noheader
step "llmrs serve --synthetic qwen2.5-7b"
serve_up graded || exit 1
common=(--url http://127.0.0.1:8123 --input-len 256 --output-len 256 --ignore-eos --workers 8 --duration $DURATION -o $R)
step "bench: 1 / 64 / 256 concurrent, graded"
timeout 400 python3 -m llmrs bench "${common[@]}" --sweep concurrency=1,64,256 --name graded-7b --seed 1 \
  > "$R/graded-7b.log" 2>&1; echo "bench rc $?"
grep -E "sized for|roofline \(|GPU telemetry|server /metrics|note:|warning" "$R/graded-7b.log"
step "plan: calibrated on those runs, predicting $PREDICT_C concurrent"
python3 -m llmrs plan qwen2.5-7b --gpu auto --input-len 256 --output-len 256 --concurrency $PREDICT_C \
  --calibrate "$R/graded-7b.json" > "$R/plan-c$PREDICT_C.txt" 2>&1; echo "plan rc $?"
python3 -m llmrs plan qwen2.5-7b --gpu auto --input-len 256 --output-len 256 --concurrency $PREDICT_C \
  --calibrate "$R/graded-7b.json" --json > "$R/plan-c$PREDICT_C.json" 2>>"$R/plan-c$PREDICT_C.txt"
tail -30 "$R/plan-c$PREDICT_C.txt"
step "bench: $PREDICT_C concurrent, measured"
timeout 200 python3 -m llmrs bench "${common[@]}" -c $PREDICT_C --name measured-c$PREDICT_C --seed 2 \
  > "$R/measured-c$PREDICT_C.log" 2>&1; echo "bench rc $?"
grep -E "sized for|roofline \(|GPU telemetry|server /metrics" "$R/measured-c$PREDICT_C.log"
serve_down
python3 -m llmrs report "$R/graded-7b.json" -o "$R/report" > /dev/null 2>&1; echo "report rc $?"
step "predicted vs measured"
python3 - "$R" "$PREDICT_C" <<'PY'
import json, sys
r, c = sys.argv[1], int(sys.argv[2])
for f in ("graded-7b", f"measured-c{c}"):
    for run in json.load(open(f"{r}/{f}.json"))["runs"]:
        s, g = run["summary"], run.get("roofline") or {}
        print(f"{f} {run['tag']}: n {run['num_prompts']}, out tok/s {s['output_throughput']:,.0f}, TPOT mean "
              f"{s['tpot_ms']['mean']:.2f} ms, TTFT mean {s['ttft_ms']['mean']:.1f} ms; "
              + (f"{g['fraction_of_ideal']:.1%} of ideal {g['ideal_output_tok_s']:,.0f} tok/s, MBU {g['mbu']:.1%}, "
                 f"MFU {g['mfu']:.1%}" if g.get("graded") else f"not graded: {g.get('why')}"))
print(open(f"{r}/plan-c{c}.json").read()[:3000])
PY
