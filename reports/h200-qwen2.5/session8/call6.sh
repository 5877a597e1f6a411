#!/usr/bin/env bash
# Session 8, call 6 (carry .whl and .whl-http): the warp_sum8 bit-identity test after fixing its own assertion (an
# empty split's m is -inf), then the HTTP-stack TTFT A/B again in the other order (auto = uvloop + httptools first,
# then h11): call5's h11 run showed a steady ~43 ms end to end for a 2-token request (a 40 ms delayed-ACK stall?).
cd "$(dirname "$0")/../../.."
export OUT=${OUT:-/tmp/llmrs-s8c6}; mkdir -p $OUT; R=/tmp/res-s8c6; mkdir -p $R
. scripts/gpu_lib.sh; use_wheels
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site-http .whl-http/*.whl
{
step "warp_sum8 test"
timeout 120 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_attention_sum8_gpu.py 2>&1 | tail -3
for stack in auto h11 h11-nohttp; do
  pp=$PYTHONPATH:/tmp/site-http; s=$stack
  [ $stack = h11-nohttp ] && { pp=$PYTHONPATH; s=auto; }  # no uvloop / httptools installed: uvicorn's own fallback
  step "serve 7B, LLMRS_HTTP_STACK=$s, PYTHONPATH=$pp"
  LLMRS_HTTP_STACK=$s PYTHONPATH=$pp python3 -m llmrs serve --synthetic qwen2.5-7b --device cuda --max-num-seqs 256 \
    --port 8123 > $R/serve-$stack.log 2>&1 &
  srv=$!
  wait_health 8123 150 || { tail -20 $R/serve-$stack.log; kill $srv; continue; }
  for n in 1 256; do
    timeout 60 python3 -m llmrs bench --url http://127.0.0.1:8123 --input-len $n --output-len 2 --ignore-eos \
      --workers 1 -o $R -c 1 -n 16 --label ttft-$n --name ttft-$stack-in$n > $R/ttft-$stack-in$n.log 2>&1
    python3 - "$R/ttft-$stack-in$n.json" "$stack prompt $n" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))["runs"][0]["summary"]
t, e = s["ttft_ms"], s.get("e2e_latency_ms", s.get("e2el_ms", {}))
print(f"{sys.argv[2]:22s} TTFT min {t['min']:.2f}  median {t.get('median', float('nan')):.2f}  mean {t['mean']:.2f} ms"
      f"  ({s['completed']} requests)")
PY
    grep -E "E2E" $R/ttft-$stack-in$n.log
  done
  kill -INT $srv; wait $srv
done
} 2>&1 | tee $OUT/summary.txt
tar czf $OUT/results.tgz -C $R .
