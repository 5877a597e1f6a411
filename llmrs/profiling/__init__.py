"""GPU timing of the engine's own steps (needs CuPy and a GPU).

- `profile.py`       `llmrs profile`: each kernel of a decode / prefill step against its roofline ceiling
- `timeline.py`      `llmrs profile --timeline`: a graphed step as the GPU runs it, the time each kernel adds
- `decode_bench.py`  `llmrs synth --decode-bench`: single-stream decode of a synthetic preset against the bandwidth floor
"""
