#!/usr/bin/env bash
# session 20 call4 (the fourth of four back-to-back calls: .whl + p00, p01, p02 of the SmolLM2 GGUF moved to
# /tmp/models first, p03 carried): the whole GPU suite with the pushed cluster merge (default) and the real SmolLM2
# Q4_1, then `llmrs profile` of the 7B at 1 / 64 / 256 sequences (context 512) with it.
set -uo pipefail
export PYTHONUNBUFFERED=1
. scripts/gpu_lib.sh
use_gguf_thirds || exit 1
R=/tmp/res-s20c4; mkdir -p $R
{
TEST_TIMEOUT=300 gpu_tests
cp $R/gpu_tests.log $OUT/
step "profile qwen2.5-7b"
timeout 150 python3 -m llmrs profile --synthetic qwen2.5-7b --batch 1,64,256 --context 512 --steps 5 \
  --top 10 --out $R/profile-7b.json > $R/profile-7b.txt 2>&1
head -60 $R/profile-7b.txt
} 2>&1 | tee $OUT/summary.txt
rm -f $R/*.csv; tar czf $OUT/results.tgz -C $R .
