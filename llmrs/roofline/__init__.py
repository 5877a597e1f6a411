"""Roofline toolkit: GPU ceilings with sources, the model cost model and plots
(the PTX local-memory check is llmrs/ptx).

gpus.json + gpus.py   the GPU database (datasheet numbers, each sourced) and NVML matching
measured.py           `--measure`: real copy bandwidth and bf16 GEMM throughput, cached per GPU
formats.py            bits per weight of each storage format
model_source.py       MODEL argument -> ModelCost (preset from llmrs.model.presets, HF directory, .gguf with its
                      real tensor types)
cost.py               bytes and FLOPs of a decode step and of a prefill load
analysis.py           the roofline: which roof binds, floors, crossover batch
tp.py                 `--tp N`: per-GPU floors of a tensor-parallel step and its all-reduce share
overlay.py, plot.py   measured points and the log-log chart
render.py             the tables of `llmrs roofline` (the command itself: llmrs/cli/roofline.py)
"""
