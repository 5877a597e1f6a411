"""Re-exports of the synthetic-model names from their homes: llmrs.model.synthetic (the weights and tokenizer
the engine serves), llmrs.bench.checkpoint (`llmrs synth --out`) and llmrs.profiling.decode_bench
(`llmrs synth --decode-bench`). Import from those modules."""

from llmrs.bench.checkpoint import (SHARD_BYTES, awq_tensor_entries, clear_checkpoint, hf_config, tensor_shapes,
                                    write_checkpoint)
from llmrs.model.synthetic import (CHAT_TEMPLATE, SPECIALS, STD, GpuDraws, gpu_weights, synthetic_vocab,
                                   synthetic_weights, write_tokenizer)
from llmrs.profiling.decode_bench import SingleStream, decode_benchmark, run_ahead_intervals, single_stream

__all__ = ["CHAT_TEMPLATE", "SHARD_BYTES", "SPECIALS", "STD", "GpuDraws", "SingleStream", "awq_tensor_entries",
           "clear_checkpoint", "decode_benchmark", "gpu_weights", "hf_config", "run_ahead_intervals", "single_stream",
           "synthetic_vocab", "synthetic_weights", "tensor_shapes", "write_checkpoint", "write_tokenizer"]
