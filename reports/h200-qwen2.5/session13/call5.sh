#!/usr/bin/env bash
# Session 13, call 5 (carry .whl; _base = `git archive <commit before the change> llmrs`, made before the call):
# rms_norm's register-held float4 path and silu_mul's two chunks of 8 a thread (latency-bound before: 7.3 / 13.9
# us a call at 256 tokens of the 7B).
#   1. the kernel, parity and cluster GPU tests;
#   2. `llmrs profile --synthetic qwen2.5-7b --batch 1,256 --context 512 --prefill-len 256` from _base and from here,
#      alternated twice (rms_norm / silu_mul rows, walls);
#   3. the 7B single-stream decode bench from each.
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/llmrs-s13}; mkdir -p "$OUT"; R=/tmp/res-s13c5; rm -rf $R; mkdir -p $R
. scripts/gpu_lib.sh
use_wheels || exit 1
{
step "kernel / parity / cluster tests"
timeout 240 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_cuda_kernels.py tests/test_cuda_parity.py \
  tests/test_attention_cluster_gpu.py > $R/tests.log 2>&1
grep -E "^(FAILED|ERROR)|passed|failed" $R/tests.log | tail -12
for run in 1 2; do
  for tree in _base .; do
    lab=$([ $tree = . ] && echo new || echo base)
    step "profile $lab run $run"
    (cd $tree && PYTHONPATH=$PWD:/tmp/site timeout 120 python3 -m llmrs profile --synthetic qwen2.5-7b --batch 1,256 \
      --context 512 --prefill-len 256 --json $R/profile-$lab-$run.json) > $R/profile-$lab-$run.txt 2>&1
    python3 - $R/profile-$lab-$run.json <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
for st in d["steps"]:
    ks = {k["kernel"].split()[0] + " " + k["kernel"].split()[-1]: k for k in st["kernels"]}
    pick = [k for k in st["kernels"] if k["kernel"].startswith(("rms_norm", "silu_mul", "rope_kv"))]
    print(f"  {st['label']:12s} wall {st['wall_ms']:.3f} ms  " + "  ".join(
        f"{k['kernel']} {1000 * k['ms'] / k['calls']:.2f} us x{k['calls']:.0f}" for k in pick))
PY
  done
done
for tree in _base .; do
  lab=$([ $tree = . ] && echo new || echo base)
  (cd $tree && PYTHONPATH=$PWD:/tmp/site timeout 100 python3 -m llmrs synth --like qwen2.5-7b --decode-bench \
    --bandwidth-gbs 4296 --prompt-len 256 --steps 256 --json $R/decode-7b-$lab.json) > $R/decode-7b-$lab.log 2>&1
  python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print(f'decode 7B {sys.argv[2]}: {r[\"ms_per_token\"]:.3f} ms/token')" $R/decode-7b-$lab.json $lab
done
} 2>&1 | tee $OUT/summary.txt
tar czf $OUT/results.tgz -C $R .
