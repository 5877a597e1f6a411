set -uo pipefail; export PYTHONUNBUFFERED=1
. scripts/gpu_lib.sh; use_wheels || exit 1
for d in _base .; do
  (cd $d && PYTHONPATH=$PWD:/tmp/site timeout 80 python3 -m llmrs profile --synthetic qwen2.5-7b --batch 64,256 --context 512 --steps 3 --top 6 > $OUT/prof-$(basename $(realpath .)).txt 2>&1; grep -E "step wall|attn|busy" $OUT/prof-$(basename $(realpath .)).txt | head -12)
done
