"""Old import path of llm_engine.py, async_engine.py and protocol.py, kept for callers outside the engine that
have not moved yet. New code imports from those modules."""

from llmrs.engine.async_engine import AsyncEngine, take_merged  # noqa: F401
from llmrs.engine.llm_engine import (  # noqa: F401
    LLMEngine, RequestResult, check_request, gpu_weight_bytes, kv_blocks, max_kv_blocks, resolve_device,
    serving_batched_tokens, serving_config, serving_engine, use_async_scheduling, warm_up_for_serving,
)
from llmrs.engine.protocol import EngineDeadError, EngineOverloaded, EngineStats, RequestOutput  # noqa: F401
