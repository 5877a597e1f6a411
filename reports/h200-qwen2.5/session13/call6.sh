#!/usr/bin/env bash
# Session 13, call 6 (carry .whl; _base as call 5): call 5's profile A/B again (its `--json PATH` was not the option:
# `--out PATH`): `llmrs profile --synthetic qwen2.5-7b --batch 1,256 --context 512 --prefill-len 256`, _base then
# this tree, twice: the rms_norm / silu_mul / rope rows and the step walls.
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/llmrs-s13}; mkdir -p "$OUT"; R=/tmp/res-s13c6; rm -rf $R; mkdir -p $R
. scripts/gpu_lib.sh
use_wheels || exit 1
{
for run in 1 2; do
  for tree in _base .; do
    lab=$([ $tree = . ] && echo new || echo base)
    step "profile $lab run $run"
    (cd $tree && PYTHONPATH=$PWD:/tmp/site timeout 120 python3 -m llmrs profile --synthetic qwen2.5-7b --batch 1,256 \
      --context 512 --prefill-len 256 --out $R/profile-$lab-$run.json) > $R/profile-$lab-$run.txt 2>&1
    python3 - $R/profile-$lab-$run.json <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
for st in d["steps"]:
    pick = [k for k in st["kernels"] if k["kernel"].startswith(("rms_norm", "silu_mul", "rope_kv"))]
    print(f"  {st['label']:12s} wall {st['wall_ms']:.3f} ms  " + "  ".join(
        f"{k['kernel']} {1000 * k['ms'] / k['calls']:.2f} us x{k['calls']:.0f}" for k in pick))
PY
  done
done
} 2>&1 | tee $OUT/summary.txt
tar czf $OUT/results.tgz -C $R .
