"""Host (Python) overhead of the serving path, with the GPU taken out: a fake runner that answers instantly.

On an H200 a 256-sequence decode step of Qwen2.5-7B takes ~21 ms on the GPU, but the server delivered a TPOT
of ~37 ms: the difference is host work (scheduling, StepBatch, stop checks, detokenizing, queue handoff, SSE).
This harness runs the real engine, with a FakeRunner in place of the ModelRunner, and measures that host work:

- `engine`: the real LLMEngine; N requests (random prompts, ignore_eos, greedy) run to completion; every step
  timed; decode steps reported apart from prefill steps; a cProfile of the decode steps.
- `async`: the real AsyncEngine (engine thread + asyncio streams), N consumers reading their streams; wall time
  per decode step (the step loop and the consumers share the GIL, so this is what a stream really sees).
- `server`: the real `llmrs serve` app (uvicorn, FastAPI routes, SSE) over the fake runner, loaded by the real
  `llmrs bench` client; TPOT and output tok/s, plus the server's own per-step interval and a cProfile of its
  engine thread and its event-loop thread.
- `serve`: just the server (what `server` starts; usable with `llmrs bench --server-cmd`).

`--engine-process` (server / serve): the server as `llmrs serve --engine-process` runs it, the engine core (with the
fake runner) in a child process; then the per-step CPU figures are the core process's.

The fake runner's tokens are deterministic ordinary text (a passage cycled from a per-sequence offset), never a
stop token, so detokenization and stop checks do real work. `--gpu-ms` makes each step sleep (GIL released), as
the real step waits on the GPU, to see how much host work hides under it.

Usage:
  python -m tools.bench_host_overhead engine --seqs 64,256 [--profile] [--out reports/host-overhead/x.json]
  python -m tools.bench_host_overhead async --seqs 64,256
  python -m tools.bench_host_overhead server --seqs 64,256 [--gpu-ms 0] [--engine-process] [--async-scheduling]

--async-scheduling: the engine runs ahead as it does on a GPU (the fake runner's launch() returns at once, wait()
sleeps until a GPU doing --gpu-ms a step would be done). On a 2-core VM, `server --seqs 256 --rounds 1
--max-tokens 128 --gpu-ms 11.5 --engine-process`: client TPOT 16.2 ms step by step, 12.3 ms with it.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import functools
import io
import json
import os
import platform
import pstats
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from llmrs.engine.config import EngineConfig
from llmrs.engine.async_engine import AsyncEngine
from llmrs.engine.llm_engine import LLMEngine, Runner
from llmrs.model.loader import load
from llmrs.engine.sampling import SampleResult, SamplingParams

PASSAGE = (
    "Paged attention stores the keys and values of every sequence in fixed-size blocks, so memory is handed out "
    "as the sequence grows and nothing is reserved for tokens that never come. Continuous batching admits new "
    "requests at every step, and a request that finishes leaves at once: the GPU stays busy. The scheduler gives "
    "each running request some tokens per step until its computed count catches up with its length; chunked "
    "prefill, prefix caching and decode all fall out of that one rule. Numbers like 12345 and 3.14159, symbols "
    "such as #, @ and %, and a little Unicode (café, naïve, Zürich, 東京, Привет, 🙂🚀) keep the detokenizer honest. "
)


class FakeRunner(Runner):
    """Stands in for ModelRunner: `execute_and_sample` returns one token per sampled row at once (or after
    `gpu_ms` of sleep). Token of sequence b at position p: pool[(p + 37 * first_block_b) % len(pool)]."""

    device = "cpu"  # what the server prints

    def __init__(self, tokenizer, stop_ids: list[int], num_blocks: int, block_size: int, gpu_ms: float = 0.0,
                 stats_out: str | None = None):
        self.stats_out = stats_out
        ids = [t for t in tokenizer.encode(PASSAGE * 4, add_special_tokens=False) if t not in set(stop_ids)]
        self.pool = np.asarray(ids, dtype=np.int64)
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.gpu_s = gpu_ms / 1e3
        self.gpu_free_at = 0.0  # launch(): when the fake GPU finishes what is queued
        self.time_s = 0.0  # host time spent in here (subtracted from the engine's)
        # per step: (perf_counter, num_seqs, num_tokens, engine thread's CPU s, whole process's CPU s)
        self.step_starts: list[tuple[float, int, int, float, float]] = []

    def execute_and_sample(self, batch, states: list) -> list[SampleResult]:
        return self.launch(batch, states).wait()

    def launch(self, batch, states: list):
        """Async scheduling's entry point: the tokens at once, but `wait()` returns only when a GPU that runs the
        queued steps back to back for `gpu_ms` each would be done with this one (the host meanwhile goes on)."""
        t0 = time.perf_counter()
        self.step_starts.append((t0, batch.num_seqs, batch.num_tokens, time.thread_time(), time.process_time()))
        rows = batch.sample_rows
        seq = np.searchsorted(batch.query_start, rows, side="right") - 1
        toks = self.pool[(batch.positions[rows].astype(np.int64) + 37 * batch.block_tables[seq, 0]) % len(self.pool)]
        self.gpu_free_at = max(t0, self.gpu_free_at) + self.gpu_s
        self.time_s += time.perf_counter() - t0
        return _FakeStep([SampleResult(t) for t in toks.tolist()], self.gpu_free_at, self)

    def shutdown(self) -> None:
        """Called by the engine core process when it stops (--engine-process): write the step timestamps."""
        if self.stats_out:
            Path(self.stats_out).write_text(json.dumps([list(s) for s in self.step_starts]))


class _FakeStep:
    """FakeRunner.launch's handle: wait() sleeps (GIL released) until the fake GPU is done with the step."""

    def __init__(self, results: list, done_at: float, runner: FakeRunner):
        self.results, self.done_at, self.runner = results, done_at, runner

    def wait(self) -> list:
        t0 = time.perf_counter()
        if self.done_at > t0:
            time.sleep(self.done_at - t0)
        self.runner.time_s += time.perf_counter() - t0
        return self.results


def decode_diffs(starts: np.ndarray, n: int) -> np.ndarray:
    """Differences of FakeRunner.step_starts rows between consecutive full decode steps (one token for each of
    >= 90% of n sequences), pauses longer than 0.5 s (between rounds) dropped."""
    full = (starts[:, 1] == starts[:, 2]) & (starts[:, 1] >= n * 0.9)
    d = np.diff(starts, axis=0)[full[:-1] & full[1:]]
    return d[d[:, 0] < 0.5]


def random_prompts(n: int, length: int, vocab: int, stop_ids: list[int], seed: int = 0) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    bad = set(stop_ids)
    out = []
    for _ in range(n):
        ids = rng.integers(1000, min(vocab, 100_000), size=length).tolist()
        out.append([t if t not in bad else 1000 for t in ids])
    return out


# --async-scheduling: the engine plans and launches each step before the previous one's tokens are back
RUN_AHEAD = False


def build_engine(loaded, n: int, prompt_len: int, max_tokens: int, gpu_ms: float = 0.0,
                 stats_out: str | None = None, async_scheduling: bool | None = None) -> LLMEngine:
    bs = 16
    tokens = n * (prompt_len + max_tokens + bs)
    ahead = RUN_AHEAD if async_scheduling is None else async_scheduling
    cfg = EngineConfig(block_size=bs, kv_cache_tokens=tokens, max_num_seqs=n, max_num_batched_tokens=2048,
                       async_scheduling=ahead)
    runner = FakeRunner(loaded.tokenizer, loaded.stop_token_ids, -(-tokens // bs), bs, gpu_ms, stats_out)
    return LLMEngine(loaded, cfg, runner=runner)


def build_engine_in_core(model: str, n: int, prompt_len: int, gpu_ms: float, stats_out: str | None,
                         core_cpus: str | None = None, async_scheduling: bool = False) -> LLMEngine:
    """The factory the engine core process calls (--engine-process): the fake-runner engine, built there."""
    if core_cpus:
        os.sched_setaffinity(0, cpu_list(core_cpus))
    return build_engine(load(model), n, prompt_len, 0, gpu_ms, stats_out, async_scheduling)


def params(max_tokens: int) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)


def top_functions(prof: cProfile.Profile, n: int = 25) -> list[dict]:
    st = pstats.Stats(prof)
    rows = []
    for (file, line, fn), (cc, nc, tt, ct, _) in st.stats.items():  # type: ignore[attr-defined]
        short = file.split("/llmrs/")[-1] if "/llmrs/" in file else Path(file).name
        rows.append({"function": f"{short}:{line}({fn})", "calls": nc, "tottime_s": round(tt, 4),
                     "cumtime_s": round(ct, 4)})
    rows.sort(key=lambda r: -r["tottime_s"])
    return rows[:n]


def print_profile(prof: cProfile.Profile, title: str, n: int = 25) -> str:
    s = io.StringIO()
    pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(n)
    text = s.getvalue()
    print(f"--- cProfile ({title}), by own time ---")
    print("\n".join(line for line in text.splitlines() if line.strip())[:6000])
    return text


# ---------------------------------------------------------------------- engine
def run_engine(loaded, n: int, prompt_len: int, max_tokens: int, profile: bool, gpu_ms: float = 0.0) -> dict:
    eng = build_engine(loaded, n, prompt_len, max_tokens, gpu_ms)
    runner: FakeRunner = eng.runner
    for i, p in enumerate(random_prompts(n, prompt_len, loaded.config.vocab_size, loaded.stop_token_ids)):
        eng.add_request(f"r{i}", p, params(max_tokens))
    prof = cProfile.Profile() if profile else None
    decode, other, out_tokens = [], [], 0
    text_chars = 0
    t_all = time.perf_counter()
    while eng.has_unfinished():
        r0 = runner.time_s
        is_decode = not eng.scheduler.waiting and all(
            s.num_computed_tokens == s.num_tokens - 1 for s in eng.scheduler.running)
        if prof is not None and is_decode:
            prof.enable()
        t0 = time.perf_counter()
        outs = eng.step()
        dt = time.perf_counter() - t0
        if prof is not None and is_decode:
            prof.disable()
        dt -= runner.time_s - r0
        (decode if is_decode else other).append((dt, len(outs)))
        out_tokens += sum(len(o.token_ids) for o in outs)
        text_chars += sum(len(o.text) for o in outs)
    total = time.perf_counter() - t_all - runner.time_s
    assert out_tokens == n * max_tokens, (out_tokens, n * max_tokens)
    d = np.array([x for x, _ in decode])
    res = {
        "seqs": n, "prompt_len": prompt_len, "max_tokens": max_tokens, "decode_steps": len(decode),
        "other_steps": len(other), "output_tokens": out_tokens, "text_chars": text_chars,
        "decode_step_us_mean": round(float(d.mean()) * 1e6, 1),
        "decode_step_us_p50": round(float(np.median(d)) * 1e6, 1),
        "decode_us_per_token": round(float(d.mean()) * 1e6 / n, 2),
        "other_step_us_mean": round(float(np.mean([x for x, _ in other])) * 1e6, 1) if other else None,
        "total_host_s": round(total, 3),
        "total_us_per_output_token": round(total * 1e6 / out_tokens, 2),
        "fake_runner_s": round(runner.time_s, 3),
    }
    print(f"engine  seqs={n:4d}: decode step {res['decode_step_us_mean']:8.1f} us "
          f"({res['decode_us_per_token']:.2f} us/token; p50 {res['decode_step_us_p50']:.1f}), prefill-ish steps "
          f"{res['other_step_us_mean']} us x {len(other)}, whole run {res['total_us_per_output_token']:.2f} us/output "
          f"token (fake runner {runner.time_s * 1e3:.0f} ms excluded)")
    if prof is not None:
        print_profile(prof, f"engine decode steps, {n} seqs")
        res["profile_top"] = top_functions(prof)
    return res


# ---------------------------------------------------------------------- async
def run_async(loaded, n: int, prompt_len: int, max_tokens: int, gpu_ms: float, profile: bool) -> dict:
    eng = build_engine(loaded, n, prompt_len, max_tokens, gpu_ms)
    runner: FakeRunner = eng.runner
    ae = AsyncEngine(eng, model_name="fake")
    prof = cProfile.Profile() if profile else None
    if prof is not None:  # cProfile sees only the thread that enables it: wrap the engine thread's loop
        loop_fn = ae._loop

        def profiled_loop() -> None:
            prof.enable()
            try:
                loop_fn()
            finally:
                prof.disable()

        ae._loop = profiled_loop  # type: ignore[method-assign]
    prompts = random_prompts(n, prompt_len, loaded.config.vocab_size, loaded.stop_token_ids)

    async def main() -> tuple[int, float]:
        ae.start()
        t0 = time.perf_counter()

        async def consume(i: int) -> int:
            got = 0
            async for out in ae.add_request(f"r{i}", prompts[i], params(max_tokens)):
                got += len(out.token_ids)
            return got

        counts = await asyncio.gather(*(consume(i) for i in range(n)))
        dt = time.perf_counter() - t0
        await ae.shutdown()
        return sum(counts), dt

    tokens, wall = asyncio.run(main())
    assert tokens == n * max_tokens
    d = decode_diffs(np.array(runner.step_starts), n)
    res = {"seqs": n, "gpu_ms": gpu_ms, "wall_s": round(wall, 3), "output_tokens": tokens,
           "output_tok_s": round(tokens / wall, 1), "decode_steps_measured": int(len(d)),
           "decode_step_interval_us_mean": round(float(d[:, 0].mean()) * 1e6, 1),
           "decode_step_interval_us_p50": round(float(np.median(d[:, 0])) * 1e6, 1),
           "engine_thread_cpu_us_per_step": round(float(d[:, 3].mean()) * 1e6, 1),
           "process_cpu_us_per_step": round(float(d[:, 4].mean()) * 1e6, 1)}
    print(f"async   seqs={n:4d} gpu_ms={gpu_ms:g}: decode step interval {res['decode_step_interval_us_mean']:8.1f} us "
          f"(p50 {res['decode_step_interval_us_p50']:.1f}; CPU per step: engine thread "
          f"{res['engine_thread_cpu_us_per_step']:.0f} us, process {res['process_cpu_us_per_step']:.0f} us); "
          f"{res['output_tok_s']:.0f} output tok/s")
    if prof is not None:
        print_profile(prof, f"engine thread, {n} seqs")
        res["profile_top_engine_thread"] = top_functions(prof)
    return res


# ---------------------------------------------------------------------- serve / server
def serve(args) -> None:
    """`llmrs serve` over the fake runner (the app, routes and SSE are the real ones)."""
    import uvicorn

    from llmrs.server.app import ServerSettings, build_app
    from llmrs.cli.serve import http_stack

    if args.server_cpus:  # the engine core process (spawned below) inherits it
        os.sched_setaffinity(0, cpu_list(args.server_cpus))
    profs: dict[str, cProfile.Profile] = {}
    runner: FakeRunner | None = None
    if args.engine_process:
        from llmrs.engine.core_client import ProcessEngine

        factory = functools.partial(build_engine_in_core, args.model, args.max_num_seqs, args.max_model_tokens,
                                    args.gpu_ms or 0.0, args.stats_out, args.core_cpus, args.async_scheduling)
        ae = ProcessEngine.spawn(load(args.model, read_tensors=False), factory, model_name="fake")
    else:
        eng = build_engine(load(args.model), args.max_num_seqs, args.max_model_tokens, 0, args.gpu_ms or 0.0)
        runner = eng.runner
        ae = AsyncEngine(eng, model_name="fake")
    if args.profile_out and runner is not None:
        profs["engine thread"] = cProfile.Profile()
        loop_fn = ae._loop

        def profiled_loop() -> None:
            profs["engine thread"].enable()
            try:
                loop_fn()
            finally:
                profs["engine thread"].disable()

        ae._loop = profiled_loop  # type: ignore[method-assign]
    if args.profile_out:
        profs["event loop thread"] = cProfile.Profile()
        profs["event loop thread"].enable()
    app = build_app(ae, ServerSettings(served_names=["fake"], model_root=args.model))
    try:
        uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=args.port, log_level="warning",
                                      access_log=False, **http_stack())).run()
    except KeyboardInterrupt:  # uvicorn re-raises the SIGINT that `llmrs bench` stops its server with
        pass
    if args.stats_out and runner is not None:  # with --engine-process, the core writes them as it stops
        Path(args.stats_out).write_text(json.dumps([list(s) for s in runner.step_starts]))
    if args.profile_out:
        profs["event loop thread"].disable()
        with open(args.profile_out, "w") as f:
            json.dump({k: top_functions(p, 30) for k, p in profs.items()}, f)
        for k, p in profs.items():
            print_profile(p, k, 30)


H200_STEP_MS = {64: 9.5, 256: 21.0}  # CUDA-graph decode step of synthetic Qwen2.5-7B, measured


def run_server(args, n: int) -> dict:
    gpu_ms = args.gpu_ms if args.gpu_ms is not None else H200_STEP_MS.get(n, 0.0)
    tmp = Path(tempfile.mkdtemp(prefix="llmrs-host-"))
    me = shlex.join([sys.executable, str(Path(__file__).resolve())])
    server_cmd = (f"{me} serve --port {{port}} --model {shlex.quote(args.model)} --max-num-seqs {n} "
                  f"--max-model-tokens {args.prompt_len + args.max_tokens} --gpu-ms {gpu_ms} "
                  f"--stats-out {tmp / 'steps.json'}" + (f" --profile-out {tmp / 'prof.json'}" if args.profile else "")
                  + (" --engine-process" if args.engine_process else "")
                  + (" --async-scheduling" if args.async_scheduling else "")
                  + (f" --server-cpus {args.server_cpus}" if args.server_cpus else "")
                  + (f" --core-cpus {args.core_cpus}" if args.core_cpus else ""))
    cmd = [sys.executable, "-m", "llmrs", "bench", "--server-cmd", server_cmd, "--concurrency", str(n),
           "--num-prompts", str(n * args.rounds), "--input-len", str(args.prompt_len), "--output-len",
           str(args.max_tokens), "--ignore-eos", "--prompt-format", "ids", "--workers", str(args.workers),
           "--out-dir", str(tmp), "--name", "bench"]
    path = [str(Path(__file__).resolve().parents[1])] + ([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else [])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(path)}
    pin = (lambda: os.sched_setaffinity(0, cpu_list(args.client_cpus))) if args.client_cpus else None
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, preexec_fn=pin)
    if proc.returncode != 0:
        print(proc.stdout[-3000:], proc.stderr[-3000:])
        raise SystemExit(f"bench failed ({proc.returncode})")
    bench = json.loads((tmp / "bench.json").read_text())
    summary = bench["runs"][0]["summary"]
    d = decode_diffs(np.array(json.loads((tmp / "steps.json").read_text())), n)
    gaps, eng_cpu, proc_cpu = d[:, 0], d[:, 3], d[:, 4]
    res = {"seqs": n, "gpu_ms": gpu_ms, "engine_process": args.engine_process, "server_cpus": args.server_cpus, "core_cpus": args.core_cpus,
           "client_cpus": args.client_cpus, "decode_steps_measured": int(len(gaps)),
           "decode_step_interval_us_mean": round(float(gaps.mean()) * 1e6, 1),
           "decode_step_interval_us_p50": round(float(np.median(gaps)) * 1e6, 1),
           "engine_thread_cpu_us_per_step": round(float(eng_cpu.mean()) * 1e6, 1),
           "server_process_cpu_us_per_step": round(float(proc_cpu.mean()) * 1e6, 1),
           "bench_summary": summary}
    tpot = round(summary["tpot_ms"]["mean"], 2)
    tput = round(summary["output_throughput"], 1)
    res["mean_tpot_ms"], res["output_tok_s"] = tpot, tput
    res["host_us_per_step"] = round(res["decode_step_interval_us_mean"] - gpu_ms * 1e3, 1)
    print(f"server  seqs={n:4d} gpu_ms={gpu_ms:g}: server decode step interval "
          f"{res['decode_step_interval_us_mean']:8.1f} us (p50 {res['decode_step_interval_us_p50']:.1f}; host "
          f"{res['host_us_per_step']:.0f} us beyond the fake GPU step; CPU per step: engine thread "
          f"{res['engine_thread_cpu_us_per_step']:.0f} us, whole {'core' if args.engine_process else 'server'} "
          f"{res['server_process_cpu_us_per_step']:.0f} us); "
          f"client: TPOT {tpot} ms, {tput} output tok/s, TTFT mean {summary['ttft_ms']['mean']:.2f} / min "
          f"{summary['ttft_ms'].get('min', float('nan')):.2f} ms")
    if args.profile and (tmp / "prof.json").exists():
        res["profile_top"] = json.loads((tmp / "prof.json").read_text())
        for k, rows in res["profile_top"].items():
            print(f"--- server cProfile: {k} (top by own time) ---")
            for r in rows[:20]:
                print(f"  {r['tottime_s']:8.3f}s own {r['cumtime_s']:8.3f}s cum {r['calls']:8d}  {r['function']}")
    return res


# ---------------------------------------------------------------------- main
def cpu_list(spec: str) -> set[int]:
    """'0', '1,3' or '2-5' -> a set of CPU numbers (for os.sched_setaffinity)."""
    out: set[int] = set()
    for part in spec.split(","):
        lo, _, hi = part.partition("-")
        out.update(range(int(lo), int(hi or lo) + 1))
    return out


def machine() -> dict:
    cpu = platform.processor()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"cpu": cpu, "cores": os.cpu_count(), "python": platform.python_version(), "numpy": np.__version__}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("mode", choices=["engine", "async", "server", "serve"])
    ap.add_argument("--model", default="synthetic:qwen2.5-7b", help="its tokenizer and config are used (no weights)")
    ap.add_argument("--seqs", default="64,256")
    ap.add_argument("--prompt-len", type=int, default=256)
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--gpu-ms", type=float, default=None,
                    help="sleep per step (GIL released), like a GPU wait [engine/async: 0; server: the H200's measured "
                         "decode step of synthetic Qwen2.5-7B: 9.5 ms at 64 sequences, 21 ms at 256]")
    ap.add_argument("--async-scheduling", action="store_true",
                    help="the engine runs ahead (as on a GPU): the fake runner's launch() returns at once and its "
                         "wait() sleeps until a GPU doing --gpu-ms a step would be done")
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--repeat", type=int, default=1, help="engine/async: runs per size; the best is kept")
    ap.add_argument("--rounds", type=int, default=2, help="server: num-prompts = seqs * rounds")
    ap.add_argument("--workers", type=int, default=1, help="server: bench client processes")
    ap.add_argument("--engine-process", action="store_true",
                    help="server/serve: the engine core (with the fake runner) in its own process, as "
                         "`llmrs serve --engine-process`")
    ap.add_argument("--server-cpus", default=None, help="server/serve: pin the server (and its engine core process) "
                    "to these CPUs, e.g. 1 or 2-3 (Linux)")
    ap.add_argument("--core-cpus", default=None, help="server/serve with --engine-process: pin the engine core "
                    "process to these CPUs")
    ap.add_argument("--client-cpus", default=None, help="server: pin the `llmrs bench` client to these CPUs, e.g. 0")
    ap.add_argument("--label", default="")
    ap.add_argument("--out", type=Path, default=None, help="results JSON")
    # serve-only
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--max-num-seqs", type=int, default=256)
    ap.add_argument("--max-model-tokens", type=int, default=512)
    ap.add_argument("--stats-out", default=None)
    ap.add_argument("--profile-out", default=None)
    args = ap.parse_args()
    global RUN_AHEAD
    RUN_AHEAD = bool(args.async_scheduling)
    if args.mode == "serve":
        return serve(args)
    if args.mode != "server" and args.gpu_ms is None:
        args.gpu_ms = 0.0
    loaded = load(args.model)
    results = []
    for n in [int(x) for x in args.seqs.split(",")]:
        if args.mode == "server":
            results.append(run_server(args, n))
            continue
        runs = []
        for r in range(args.repeat):
            prof = args.profile and r == args.repeat - 1
            if args.mode == "engine":
                runs.append(run_engine(loaded, n, args.prompt_len, args.max_tokens, prof, args.gpu_ms))
            else:
                runs.append(run_async(loaded, n, args.prompt_len, args.max_tokens, args.gpu_ms, prof))
        key = "decode_step_us_mean" if args.mode == "engine" else "decode_step_interval_us_mean"
        best = min(runs, key=lambda x: x[key])
        best["profile_top" if args.mode == "engine" else "profile_top_engine_thread"] = next(
            (x.get("profile_top", x.get("profile_top_engine_thread")) for x in runs
             if "profile_top" in x or "profile_top_engine_thread" in x), None)
        best["all_runs_" + key] = [x[key] for x in runs]
        results.append(best)
    doc = {"mode": args.mode, "label": args.label, "model": args.model, "machine": machine(),
           "command": shlex.join(["python", "-m", "tools.bench_host_overhead", *sys.argv[1:]]),
           "git": subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip(),
           "results": results}
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(doc, indent=1))
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
