#!/usr/bin/env bash
# A fresh server's first burst, on the CPU: `scripts/bench_host_overhead.py serve` (the real app and engine process
# over the fake runner, 9 ms steps), one traced `llmrs bench` of 256 text prompts at once (prompt 256, 16 new
# tokens), then scripts/burst_trace.py and the gap between the first request's entry into the app (asgi_enter) and
# the second's. Session 27: anyio's backend imported inside the first request stalled that gap.
#   bash scripts/first_burst.sh PORT [OUT_DIR]
set -uo pipefail
port=${1:?port}; out=${2:-/tmp/first-burst-$port}; mkdir -p "$out"; tf=$out/trace.txt; rm -f "$tf"
PY=${PYTHON:-.venv/bin/python}
LLMRS_TRACE_FILE=$tf timeout 300 $PY scripts/bench_host_overhead.py serve --engine-process --async-scheduling \
  --gpu-ms 9 --port "$port" > "$out/serve.log" 2>&1 &
srv=$!
for _ in $(seq 90); do
  curl -s -o /dev/null -w "%{http_code}" "http://127.0.0.1:$port/health" 2>/dev/null | grep -q 200 && break; sleep 1
done
sleep 1
LLMRS_TRACE_FILE=$tf timeout 200 $PY -m llmrs bench --url "http://127.0.0.1:$port" --input-len 256 --output-len 16 \
  --ignore-eos --workers 2 -c 256 -n 256 --seed 5 -o "$out" --name burst > "$out/bench.log" 2>&1
kill -INT $srv 2>/dev/null; wait $srv 2>/dev/null
python3 scripts/burst_trace.py "$tf" --steps 0
python3 - "$tf" <<'PY'
import sys
sys.path.insert(0, "scripts")
from burst_trace import read
ev = read(sys.argv[1])
t0 = next(t for t, name, _ in ev if name == "client_send")
enter = [t for t, name, _ in ev if name == "asgi_enter" and t >= t0]
print(f"first request in the app at {1e3 * (enter[0] - t0):.1f} ms, "
      f"the second {1e3 * (enter[1] - enter[0]):.1f} ms later")
PY
