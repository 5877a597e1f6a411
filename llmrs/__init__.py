"""llmrs: an LLM inference engine with a benchmarking and roofline toolkit."""

__version__ = "0.1.0"
