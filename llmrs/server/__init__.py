"""`llmrs serve`: an OpenAI-compatible HTTP server over an EngineClient (llmrs/engine/protocol.py).

    llmrs/cli/serve.py   the `serve` command: bind, load, run uvicorn; Ctrl-C / SIGTERM exit 0 after a clean shutdown
    app.py       the FastAPI app and its ASGI guard (Bearer auth on /v1, body size limit)
    routes.py    /v1/completions, /v1/chat/completions, /v1/models, /health, /tokenize, /detokenize, /metrics
    serving.py   HTTP request -> engine requests -> one merged stream of deltas; abort on disconnect
    protocol.py  request schemas (unknown fields rejected) -> SamplingParams
    sse.py       server-sent events
    errors.py    OpenAI-shaped errors; every client mistake a 4xx naming the problem
    metrics.py   Prometheus metrics with vLLM's names under `llmrs:`
"""
