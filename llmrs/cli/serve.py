"""`llmrs serve [MODEL]`: the OpenAI-compatible server.

Order of start-up: bind the port (a busy port fails at once, before the model loads), load the model and build
the engine, then serve. Ctrl-C / SIGTERM: stop accepting, give in-flight requests --shutdown-timeout seconds to
finish, abort the rest (their blocks freed), stop the engine thread (or the engine core process, with
--engine-process), exit 0.
"""

from __future__ import annotations

import contextlib
import signal
import socket
import time
from typing import Optional

import typer
from rich.console import Console

from llmrs import envs
from llmrs.cli.engine import DEQUANT_HELP
from llmrs.cli.options import model_argument, model_option, one_model
from llmrs.errors import UserError
from llmrs.model.loader import DEFAULT_MODEL, SYNTHETIC_PREFIX

console = Console(stderr=True)
BLOCK_SIZE = 16


def _bind(host: str, port: int) -> socket.socket:
    if not 0 <= port <= 65535:
        raise UserError(f"--port {port} is not a port number (0..65535)")
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as e:
        raise UserError(f"--host {host}: cannot resolve ({e})") from None
    family, _, proto, _, addr = infos[0]
    # NOTE: the protocol must be IPPROTO_TCP, not 0: asyncio turns Nagle off (TCP_NODELAY) only on accepted sockets
    # whose proto says TCP, and they inherit it from this one. With proto 0, asyncio + h11 (uvicorn without uvloop)
    # held each small SSE write until the client's delayed ACK: tens of ms per streamed request (uvloop sets it
    # itself)
    sock = socket.socket(family, socket.SOCK_STREAM, proto or socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        sock.bind(addr)
    except OSError as e:
        sock.close()
        raise UserError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
    sock.set_inheritable(True)
    return sock


def http_stack() -> dict[str, str]:
    """uvicorn's event loop and HTTP parser, from LLMRS_HTTP_STACK: "auto" (default: uvicorn's choice, uvloop and
    httptools where they are installed, else asyncio and h11) or "h11" (asyncio and h11 always), an A/B switch.
    On the H200 host (synthetic 7B) the two give the same TTFT and output tok/s within run-to-run spread, so
    `pip install -e '.[serve]'` installs neither uvloop nor httptools (uvicorn[standard] would)."""
    if envs.LLMRS_HTTP_STACK == "h11":
        return {"loop": "asyncio", "http": "h11"}
    return {"loop": "auto", "http": "auto"}


def _uvicorn_server(config, state, grace_s: float):
    import asyncio

    import uvicorn

    class Server(uvicorn.Server):
        """Two changes to uvicorn's shutdown: requests still running `grace_s` after the signal are aborted
        through the engine (their streams end with finish_reason "abort" and [DONE], their blocks are freed)
        before uvicorn's own deadline would cancel them mid-stream; and the signal is not re-raised after a
        clean shutdown (uvicorn does, so the process would die of it), so Ctrl-C / SIGTERM exit 0."""

        async def shutdown(self, sockets=None):
            async def abort_late() -> None:
                await asyncio.sleep(grace_s)
                await state.abort_all()

            task = asyncio.create_task(abort_late())
            try:
                await super().shutdown(sockets)
            finally:
                task.cancel()

        @contextlib.contextmanager
        def capture_signals(self):
            sigs = (signal.SIGINT, signal.SIGTERM)
            original = {s: signal.signal(s, self.handle_exit) for s in sigs}
            try:
                yield
            finally:
                for s, h in original.items():
                    signal.signal(s, h)

    return Server(config)


def _phase(status, model: str, phase: str, t0: float) -> None:
    """A start-up phase on the status line and, once done, as a line of its own (a log keeps them too)."""
    console.print(f"[dim]{time.perf_counter() - t0:6.1f}s  {phase}[/dim]")
    status.update(f"{model}: {phase} ...")


class _Stop(BaseException):
    """SIGTERM / SIGHUP while the model loads (uvicorn's handlers are not installed yet); a BaseException, as
    KeyboardInterrupt is, so that no `except Exception` on the way turns it into an error."""


@contextlib.contextmanager
def _stop_on_signal():
    """Within the block, SIGTERM and SIGHUP end it (the engine being built is dropped: a core process exits when
    its pipe closes) instead of killing the process mid-load; yields a list that is non-empty after such a stop."""
    stopped: list[int] = []

    def handler(signum, _frame):
        stopped.append(signum)
        raise _Stop

    sigs = (signal.SIGTERM, signal.SIGHUP)
    previous = {sig: signal.signal(sig, handler) for sig in sigs}
    try:
        yield stopped
    except _Stop:
        pass
    finally:
        for sig, h in previous.items():
            signal.signal(sig, h)


def serve(
    model: Optional[str] = model_argument("Embedded model name, Hugging Face-style directory, or .gguf file.", show_default=DEFAULT_MODEL),
    model_opt: Optional[str] = model_option(),
    host: str = typer.Option("127.0.0.1", "--host", help="Address to listen on."),
    port: int = typer.Option(8000, "--port", help="Port to listen on."),
    max_num_seqs: int = typer.Option(64, "--max-num-seqs", help="Sequences in the running batch at most."),
    max_model_len: Optional[int] = typer.Option(None, "--max-model-len", help="Context length served (prompt + output), at most the model's own; also caps the KV cache the GPU sizes [default: the model's]."),
    enable_prefix_caching: bool = typer.Option(True, "--enable-prefix-caching/--no-enable-prefix-caching", help="Reuse the KV blocks of prompt prefixes computed before."),
    max_num_batched_tokens: Optional[int] = typer.Option(None, "--max-num-batched-tokens", show_default="8192 on a GPU of >= 70 GiB other than an A100, else 2048", help="Tokens computed per engine step at most (prefill chunks + decode tokens): larger steps raise throughput under load, smaller ones keep running streams' gaps short while prompts arrive."),
    kv_cache_tokens: Optional[int] = typer.Option(None, "--kv-cache-tokens", show_default="CPU: 16384; GPU: from --gpu-memory-utilization", help="KV-cache capacity in tokens."),
    gpu_memory_utilization: float = typer.Option(0.9, "--gpu-memory-utilization", help="GPU: share of the GPU's memory for weights + activations + KV cache (the KV cache gets what is left)."),
    synthetic: Optional[str] = typer.Option(None, "--synthetic", help="Instead of MODEL: a preset's exact shapes (e.g. qwen2.5-7b) with random bf16 weights drawn on the GPU; PRESET-awq (e.g. qwen2.5-7b-awq): its linear layers AWQ 4-bit, group 128, kept packed."),
    api_key: Optional[str] = typer.Option(None, "--api-key", show_default="LLMRS_API_KEY, else none", help="Require 'Authorization: Bearer KEY' on every route but /health and /version (/metrics: see --metrics-public). An empty key is an error."),
    served_model_name: Optional[str] = typer.Option(None, "--served-model-name", show_default="MODEL", help="Model name clients send and /v1/models lists."),
    max_waiting: Optional[int] = typer.Option(None, "--max-waiting", show_default="no limit", help="Answer 429 when this many requests already wait."),
    max_body_bytes: int = typer.Option(4 * 1024 * 1024, "--max-body-bytes", help="Largest request body accepted (413 above)."),
    max_seqs_per_request: int = typer.Option(128, "--max-seqs-per-request", help="Sequences one request may make at most (prompts x n): a 400 above, before any tokenizing."),
    metrics_public: bool = typer.Option(True, "--metrics-public/--no-metrics-public", help="With --api-key: whether GET /metrics is open (as vLLM) or needs the key too."),
    docs: bool = typer.Option(False, "--docs/--no-docs", help="Serve the API docs (/docs, /redoc, /openapi.json), behind --api-key if one is set."),
    device: str = typer.Option("auto", "--device", help="auto, cpu or cuda."),
    shutdown_timeout: float = typer.Option(5.0, "--shutdown-timeout", help="Seconds in-flight requests get to finish after Ctrl-C / SIGTERM before they are aborted."),
    log_level: str = typer.Option("info", "--log-level", help="uvicorn log level: critical, error, warning, info, debug."),
    access_log: bool = typer.Option(True, "--access-log/--no-access-log", help="Log one line per HTTP request."),
    tensor_parallel_size: int = typer.Option(1, "--tensor-parallel-size", help="GPUs to split the model across (tensor parallelism over NCCL, one process per GPU; must divide the KV heads)."),
    engine_process: Optional[bool] = typer.Option(None, "--engine-process/--no-engine-process", envvar="LLMRS_ENGINE_PROCESS", show_default="on, off with --tensor-parallel-size", help="Run the engine core (scheduler, KV cache, model, sampling, detokenizing) in its own process; this one keeps HTTP, the tokenizer and the streams, so per-stream HTTP work does not share a GIL with the step loop."),
    async_scheduling: Optional[bool] = typer.Option(None, "--async-scheduling/--no-async-scheduling", show_default="on with one GPU", help="Plan and launch each decode step before the previous step's tokens are back (they are fed on the GPU), so detokenizing, streaming and planning overlap the GPU's work. --async-scheduling turns it on for the CPU too."),
    dequantize: bool = typer.Option(False, "--dequantize/--keep-quantized", help=DEQUANT_HELP),
    cpu_threads: Optional[int] = typer.Option(None, "--cpu-threads", show_default="the cores free at start", help="CPU backend: the BLAS threads of the process that runs the model (numpy's matrix products)."),
    on_engine_death: str = typer.Option("restart", "--on-engine-death", help="When the engine core dies (killed, out of memory, a step that raised, e.g. a CUDA error): 'restart' fails the requests that had started, starts a new core and runs the waiting ones on it (at most 3 restarts a minute, then as 'exit'); 'exit' stops the server at once with exit code 1, for a supervisor to restart."),
) -> None:
    """Serve MODEL over an OpenAI-compatible HTTP API (continuous batching, paged KV cache, prefix caching)."""
    import uvicorn

    from llmrs.backends.cpu import free_cores
    from llmrs.engine.async_engine import AsyncEngine
    from llmrs.server.app import ServerSettings, build_app

    for name, value, low in (("--max-num-seqs", max_num_seqs, 1), ("--max-num-batched-tokens", max_num_batched_tokens, 1),
                             ("--max-model-len", max_model_len, 2),
                             ("--kv-cache-tokens", kv_cache_tokens, BLOCK_SIZE), ("--max-body-bytes", max_body_bytes, 1),
                             ("--max-seqs-per-request", max_seqs_per_request, 1), ("--cpu-threads", cpu_threads, 1),
                             ("--max-waiting", max_waiting, 0)):
        if value is not None and value < low:
            raise UserError(f"{name} must be at least {low} (got {value})")
    if not 0 < gpu_memory_utilization <= 1:
        raise UserError(f"--gpu-memory-utilization must be in (0, 1] (got {gpu_memory_utilization:g})")
    key_source = "--api-key"
    if api_key is None:
        api_key, key_source = envs.LLMRS_API_KEY, "LLMRS_API_KEY"
    if api_key is not None and not api_key.strip():  # (an empty key must not quietly turn authentication off)
        raise UserError(f"{key_source} is empty: give a key, or leave it unset to serve without authentication")
    if shutdown_timeout < 0:
        raise UserError(f"--shutdown-timeout must be >= 0 (got {shutdown_timeout:g})")
    if log_level not in ("critical", "error", "warning", "info", "debug", "trace"):
        raise UserError(f"--log-level {log_level!r}: choose critical, error, warning, info or debug")
    model = one_model(model, model_opt)
    if synthetic and model:
        raise UserError("--synthetic PRESET replaces MODEL: give one of them")
    stack = http_stack()  # (a typo in LLMRS_HTTP_STACK fails here, before the model loads)
    from llmrs.engine.recovery import check_on_death

    check_on_death(on_engine_death)
    make_engine = AsyncEngine.from_args
    if engine_process is None:  # the default: the core in its own process, except under tensor parallelism (not yet)
        engine_process = tensor_parallel_size == 1
    if engine_process:
        if tensor_parallel_size != 1:
            raise UserError("--engine-process and --tensor-parallel-size do not combine yet: leave one of them out")
        from llmrs.engine.core_client import ProcessEngine

        make_engine = ProcessEngine.from_args
    if tensor_parallel_size != 1:  # checked before the port is bound and the model loads
        from functools import partial

        from llmrs.engine.tp_nccl import check_tp_size, tp_async_engine

        check_tp_size(tensor_parallel_size, device)
        make_engine = partial(tp_async_engine, world_size=tensor_parallel_size)
    sock = _bind(host, port)
    model = SYNTHETIC_PREFIX + synthetic if synthetic else (model or DEFAULT_MODEL)
    name = served_model_name or model
    t0 = time.perf_counter()
    options = dict(device=device, max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
                   kv_cache_tokens=kv_cache_tokens, block_size=BLOCK_SIZE, gpu_memory_utilization=gpu_memory_utilization,
                   max_model_len=max_model_len, enable_prefix_caching=enable_prefix_caching,
                   async_scheduling=async_scheduling, cpu_threads=cpu_threads or (free_cores() if device != "cuda" else None))
    if tensor_parallel_size == 1:  # (tensor parallelism dequantizes: every rank slices float tensors)
        options["keep_quantized"] = not dequantize
    from llmrs.engine.llm_engine import progress_to

    with console.status(f"loading {model} ...") as status, _stop_on_signal() as stopped, \
            progress_to(lambda phase: _phase(status, model, phase, t0)):
        engine = make_engine(model, max_waiting=max_waiting, **options)
    if stopped:
        console.print(f"stopped while loading {model}")
        return
    app = build_app(engine, ServerSettings(served_names=[name], model_root=model, api_key=api_key,
                                           max_body_bytes=max_body_bytes, block_size=BLOCK_SIZE,
                                           metrics_public=metrics_public, docs=docs,
                                           max_seqs_per_request=max_seqs_per_request))
    bound = sock.getsockname()
    threads = f" ({options['cpu_threads']} threads)" if engine.device == "cpu" and options["cpu_threads"] else ""
    console.print(f"[dim]loaded {model} in {time.perf_counter() - t0:.1f}s; max_model_len {engine.max_model_len}, "
                  f"KV cache {engine.kv_cache_tokens} tokens on {engine.device}{threads}, "
                  f"{engine.max_num_batched_tokens} tokens a step"
                  f"{', async scheduling' if engine.async_scheduling else ''}[/dim]")
    if engine_process:
        console.print(f"[dim]engine core: process {engine.pid}[/dim]")
    console.print(f"serving [cyan]{name}[/] on http://{host}:{bound[1]}/v1 (Ctrl-C to stop)")
    config = uvicorn.Config(app, log_level=log_level, access_log=access_log, lifespan="on",
                            timeout_graceful_shutdown=shutdown_timeout + 5.0, timeout_keep_alive=5, **stack)
    from llmrs.engine.core_client import freeze_heap

    freeze_heap()  # the start-up heap out of every later full collection (this process; the core froze its own)
    server = _uvicorn_server(config, app.state.llmrs, shutdown_timeout)
    # an engine dead for good (--on-engine-death exit, or restarts used up) stops the server: open streams have
    # their error, new connections are refused, then exit code 1 below (uvicorn polls should_exit every 0.1 s)
    engine.set_death_policy(on_engine_death, exit_hook=lambda: setattr(server, "should_exit", True))
    server.run(sockets=[sock])
    status, why = engine.health()
    if status == "dead":
        console.print(f"[red]error:[/] the engine is dead: {why}")
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    app.command("serve")(serve)
