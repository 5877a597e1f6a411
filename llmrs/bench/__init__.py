"""`llmrs bench` and `llmrs report`: load testing any OpenAI-compatible server, and comparison reports.

The pieces, one concept per file:

- `records.py`    RequestSpec (what to send) and RequestResult (what one request measured)
- `sse.py`        byte-level Server-Sent Events parser (the client's hot path)
- `client.py`     one streamed request: timestamps every content chunk (TTFT, ITL, E2E)
- `http1.py`      the minimal HTTP/1.1 client the workers use for plain http (httpx otherwise)
- `worker.py`     one client process: arrivals, its share of the concurrency cap, progress messages
- `runner.py`     spreads a run over worker processes and merges their timings (+ client CPU use)
- `arrivals.py`   gamma / Poisson inter-arrival times
- `tokenization.py`, `dataset.py`  prompts: random tokens of exact length, ShareGPT, JSONL
- `metrics.py`    vLLM's metric definitions (TTFT, TPOT, ITL, E2E, throughput, goodput)
- `results.py`    versioned results JSON + per-request CSV, and readers of a saved summary (stat, pct)
- `server.py`     start a server command, wait for /health, stop it afterwards
- `guard.py`      the process between the bench and its server: the server's group dies with the bench, however
                  the bench ends
- `interrupts.py` SIGINT / SIGTERM / SIGHUP: stop the run, save what finished, exit 128 + the signal
- `sysinfo.py`    who was measured and on what: server identity, GPUs, the client host
- `console.py`    the live progress bar and the result tables
- `bench.py`      one `llmrs bench` invocation (sweep included); its typer commands are llmrs/cli/bench.py
- `report.py`, `plots.py`  `llmrs report`: markdown side-by-side tables + matplotlib PNGs
- `checkpoint.py` checkpoints for benchmarks without downloads: `llmrs synth --out` (a preset's shapes, random
                  weights) and an AWQ copy of an unquantized checkpoint
"""
