"""A soak: N minutes of mixed requests at a fixed concurrency, the server's memory sampled, every error counted.

Each of `--concurrency` clients sends one request after another, drawn at random (seeded): completions or chat,
streamed or not, one choice or several (n 2-3), prompts of a few to a few hundred tokens, max_tokens 1-64, and a
share of streams (`--disconnect`) whose client leaves after a few deltas. Every `--sample-every` seconds the
resident memory (RSS) of the server and its child processes (the engine core) is read from /proc, and /metrics'
KV blocks in use when the server has them. At the end: a table per kind of request, the errors by kind, the RSS
first / last / peak and its drift, and every KV block back once the last request is done (an llmrs server).

    python -m tools.soak --model smollm2-135m --minutes 5 --concurrency 8 --json reports/cpu/soak/soak.json
    python -m tools.soak --url http://127.0.0.1:8000 --pid 12345 --minutes 30   # any OpenAI-compatible server

Without --url it starts `llmrs serve MODEL` on a free port itself (`--serve-arg` passes options on). Exit status 0
when no request failed and (on an llmrs server) every KV block came back, 1 otherwise.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import platform
import random
import statistics
import sys
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path

import httpx

WORDS = ("the quick brown fox jumps over a lazy dog while paged attention keeps every block of the cache in use "
         "and continuous batching serves many streams at once").split()
KINDS = ("completion", "completion-stream", "chat", "chat-stream", "completion-n", "chat-stream-n", "disconnect")


# ---------------------------------------------------------------------- memory
def _children(pid: int) -> list[int]:
    out: list[int] = []
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            try:
                out += map(int, Path(f"/proc/{pid}/task/{task}/children").read_text().split())
            except OSError:
                pass
    except OSError:
        pass
    return out


def _rss_kb(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def _role(pid: int) -> str:
    """What a process of the server's tree is, from its command line: the engine core (a multiprocessing child),
    multiprocessing's resource tracker, or the server (whatever else: a launcher, the API server)."""
    try:
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return "gone"
    if "multiprocessing.spawn" in cmd:
        return "engine_core"
    if "multiprocessing.resource_tracker" in cmd:
        return "resource_tracker"
    return "server"


def tree_rss_mb(pid: int) -> dict[str, float]:
    """The RSS of `pid` and its descendants in MB (10^6 bytes), summed by role (`_role`), from /proc (Linux)."""
    out: dict[str, float] = defaultdict(float)
    todo = [pid]
    while todo:
        p = todo.pop()
        out[_role(p)] += _rss_kb(p) * 1024 / 1e6
        todo += _children(p)
    return {k: round(v, 1) for k, v in out.items() if k != "gone"}


def metric(text: str, name: str) -> float | None:
    """The sum of `name`'s samples in Prometheus text (None if absent)."""
    vals = [float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith((name + " ", name + "{"))]
    return sum(vals) if vals else None


async def blocks_in_use(client: httpx.AsyncClient, url: str) -> tuple[float, float] | None:
    """(KV blocks in use, requests running + waiting) from an llmrs server's /metrics; None for another server."""
    try:
        r = await client.get(f"{url}/metrics")
    except httpx.HTTPError:
        return None
    total, free = metric(r.text, "llmrs:kv_cache_num_blocks"), metric(r.text, "llmrs:kv_cache_free_blocks")
    if r.status_code != 200 or total is None or free is None:
        return None
    busy = (metric(r.text, "llmrs:num_requests_running") or 0) + (metric(r.text, "llmrs:num_requests_waiting") or 0)
    return total - free, busy


# ---------------------------------------------------------------------- requests
def draw(rng: random.Random, kind: str, model: str, room: int) -> tuple[str, dict, int | None]:
    """(path, body, leave after this many deltas or None) of one request of `kind`."""
    # prompts that leave room for 64 tokens after a chat template (a word is 1-2 tokens)
    n_words = rng.choice([w for w in (2, 8, 32, 128, 256) if 2 * w + 128 <= room] or [2])
    text = " ".join(rng.choice(WORDS) for _ in range(n_words))
    max_tokens = rng.randint(1, 64)
    n = rng.randint(2, 3) if kind.endswith("-n") else 1
    stream = "stream" in kind or kind == "disconnect"
    body: dict = {"model": model, "max_tokens": max_tokens, "n": n, "stream": stream,
                  "temperature": rng.choice((0.0, 0.7, 1.0)), "seed": rng.randint(0, 2**31)}
    if kind.startswith("chat"):
        body["messages"] = [{"role": "user", "content": text}]
        path = "/v1/chat/completions"
    else:
        body["prompt"] = text
        path = "/v1/completions"
    if kind == "disconnect":
        body["max_tokens"], body["ignore_eos"] = 64, True
        return path, body, rng.randint(1, 8)
    return path, body, None


async def one(client: httpx.AsyncClient, url: str, path: str, body: dict, leave_after: int | None) -> dict:
    """Send one request; what happened: ok, tokens, and an error kind when it failed."""
    t0 = time.perf_counter()
    n = body["n"]
    try:
        if not body["stream"]:
            r = await client.post(url + path, json=body)
            if r.status_code != 200:
                return {"error": f"http {r.status_code}", "detail": r.text[:300]}
            data = r.json()
            if len(data.get("choices", ())) != n or any(c.get("finish_reason") is None for c in data["choices"]):
                return {"error": "malformed answer", "detail": r.text[:300]}
            if any(c["finish_reason"] == "error" for c in data["choices"]):
                return {"error": "finish_reason error", "detail": r.text[:300]}
            return {"s": time.perf_counter() - t0, "tokens": data.get("usage", {}).get("completion_tokens", 0)}
        events, finished, done = 0, set(), False
        async with client.stream("POST", url + path, json=body) as r:
            if r.status_code != 200:
                return {"error": f"http {r.status_code}", "detail": (await r.aread()).decode(errors="replace")[:300]}
            async for line in r.aiter_lines():
                if not line.startswith("data: "):
                    continue
                if line == "data: [DONE]":
                    done = True
                    break
                ev = json.loads(line[6:])
                if "error" in ev:
                    return {"error": "stream error event", "detail": line[:300]}
                events += 1
                for c in ev.get("choices", ()):
                    if c.get("finish_reason"):
                        if c["finish_reason"] == "error":
                            return {"error": "finish_reason error", "detail": line[:300]}
                        finished.add(c["index"])
                if leave_after is not None and events >= leave_after and len(finished) < n:
                    return {"s": time.perf_counter() - t0, "left": True}  # leaves: closes the connection
        if not done or len(finished) != n:
            return {"error": "stream cut short", "detail": f"[DONE] {done}, {len(finished)} of {n} choices finished"}
        return {"s": time.perf_counter() - t0, "events": events}
    except httpx.HTTPError as e:
        return {"error": type(e).__name__, "detail": str(e)[:300]}
    except (json.JSONDecodeError, KeyError, TypeError) as e:
        return {"error": "malformed answer", "detail": repr(e)[:300]}


async def soak(args: argparse.Namespace, url: str, pid: int | None) -> dict:
    rng = random.Random(args.seed)
    limits = httpx.Limits(max_connections=args.concurrency + 4, max_keepalive_connections=args.concurrency + 4)
    async with httpx.AsyncClient(timeout=httpx.Timeout(args.timeout), limits=limits, trust_env=False) as client:
        models = (await client.get(f"{url}/v1/models")).json()["data"]
        model = args.served_model or models[0]["id"]
        room = int(models[0].get("max_model_len") or 2048)
        weights = [args.disconnect if k == "disconnect" else (1 - args.disconnect) / (len(KINDS) - 1) for k in KINDS]
        results: dict[str, list[dict]] = defaultdict(list)
        samples: list[dict] = []
        t_start = time.monotonic()
        deadline = t_start + args.minutes * 60

        async def sampler() -> None:
            while True:
                s: dict = {"t": round(time.monotonic() - t_start, 1)}
                if pid is not None:
                    s["rss_mb"] = tree_rss_mb(pid)
                kv = await blocks_in_use(client, url)
                if kv is not None:
                    s["kv_blocks_in_use"] = kv[0]
                samples.append(s)
                if time.monotonic() >= deadline:
                    return
                await asyncio.sleep(min(args.sample_every, max(0.0, deadline - time.monotonic())))

        async def worker(w: int) -> None:
            wr = random.Random(rng.randint(0, 2**31) + w)
            while time.monotonic() < deadline:
                kind = wr.choices(KINDS, weights)[0]
                path, body, leave = draw(wr, kind, model, room)
                results[kind].append(await one(client, url, path, body, leave))

        await asyncio.gather(sampler(), *(worker(w) for w in range(args.concurrency)))
        elapsed = time.monotonic() - t_start
        settled = None  # KV blocks and requests once the clients are done (an llmrs server)
        for _ in range(200):
            settled = await blocks_in_use(client, url)
            if settled is None or settled == (0, 0):
                break
            await asyncio.sleep(0.05)
    return summarize(args, url, pid, results, samples, elapsed, settled)


def summarize(args, url, pid, results, samples, elapsed, settled) -> dict:
    kinds = {}
    errors: Counter = Counter()
    examples: dict[str, str] = {}
    for kind in KINDS:
        rs = results.get(kind, [])
        times = sorted(r["s"] for r in rs if "s" in r and not r.get("left"))
        for r in rs:
            if "error" in r:
                errors[r["error"]] += 1
                examples.setdefault(r["error"], r.get("detail", ""))
        kinds[kind] = {"requests": len(rs), "errors": sum("error" in r for r in rs),
                       "left_mid_stream": sum(bool(r.get("left")) for r in rs),
                       "p50_s": round(statistics.median(times), 3) if times else None,
                       "p95_s": round(times[math.ceil(0.95 * len(times)) - 1], 3) if times else None}
    with_rss = [s for s in samples if s.get("rss_mb")]
    memory = None
    if with_rss:
        rss = [round(sum(s["rss_mb"].values()), 1) for s in with_rss]
        ts = [s["t"] for s in with_rss]
        half = len(rss) // 2  # the second half: past the warm-up (a CPU KV pool's pages are touched as first used)
        slope = (statistics.linear_regression(ts[half:], rss[half:]).slope * 60
                 if len(rss) - half > 1 and len(set(ts[half:])) > 1 else 0.0)
        memory = {"first_mb": rss[0], "last_mb": rss[-1], "peak_mb": max(rss),
                  "growth_mb": round(rss[-1] - rss[0], 1), "second_half_growth_mb": round(rss[-1] - rss[half], 1),
                  "second_half_drift_mb_per_min": round(slope, 2),
                  "first_by_role_mb": with_rss[0]["rss_mb"], "last_by_role_mb": with_rss[-1]["rss_mb"]}
    total = sum(k["requests"] for k in kinds.values())
    return {
        "url": url, "pid": pid, "minutes": args.minutes, "elapsed_s": round(elapsed, 1),
        "concurrency": args.concurrency, "seed": args.seed, "disconnect_share": args.disconnect,
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version()},
        "requests": total, "requests_per_s": round(total / elapsed, 2) if elapsed else None,
        "errors": dict(errors), "error_examples": examples, "kinds": kinds, "memory": memory,
        "after": None if settled is None else {"kv_blocks_in_use": settled[0], "requests_left": settled[1]},
        "samples": samples,
    }


def report(s: dict) -> str:
    lines = [f"soak: {s['requests']} requests in {s['elapsed_s']:.0f} s ({s['requests_per_s']}/s) at concurrency "
             f"{s['concurrency']} against {s['url']}", "",
             f"{'kind':<18}{'requests':>9}{'errors':>8}{'left':>6}{'p50 s':>8}{'p95 s':>8}"]
    for kind, k in s["kinds"].items():
        p50 = "-" if k["p50_s"] is None else f"{k['p50_s']:.2f}"
        p95 = "-" if k["p95_s"] is None else f"{k['p95_s']:.2f}"
        lines.append(f"{kind:<18}{k['requests']:>9}{k['errors']:>8}{k['left_mid_stream']:>6}{p50:>8}{p95:>8}")
    lines.append("")
    lines.append("errors: " + (", ".join(f"{k} x{v}" for k, v in s["errors"].items()) if s["errors"] else "none"))
    for k, v in s["error_examples"].items():
        lines.append(f"  {k}: {v}")
    m = s["memory"]
    if m:
        roles = ", ".join(f"{k} {v:.0f}" for k, v in sorted(m["last_by_role_mb"].items()))
        lines.append(f"RSS of the server's processes: first {m['first_mb']:.0f} MB, last {m['last_mb']:.0f} MB "
                     f"({roles}), peak {m['peak_mb']:.0f} MB; growth {m['growth_mb']:+.1f} MB, in the second half "
                     f"{m['second_half_growth_mb']:+.1f} MB ({m['second_half_drift_mb_per_min']:+.2f} MB/min)")
    if s["after"] is not None:
        lines.append(f"after the run: {s['after']['kv_blocks_in_use']:.0f} KV blocks in use, "
                     f"{s['after']['requests_left']:.0f} requests running or waiting")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--url", help="a running OpenAI-compatible server (without it: `llmrs serve MODEL` is started)")
    p.add_argument("--pid", type=int, help="with --url: the server's process id, for its RSS (and its children's)")
    p.add_argument("--model", default="smollm2-135m", help="the model `llmrs serve` is started with (no --url)")
    p.add_argument("--serve-arg", action="append", default=[], help="an option for the started `llmrs serve` "
                   "(repeat; e.g. --serve-arg=--max-model-len=512)")
    p.add_argument("--served-model", help="the model name to send (default: the first of /v1/models)")
    p.add_argument("--minutes", type=float, default=5.0)
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--disconnect", type=float, default=0.1, help="share of requests that leave mid-stream")
    p.add_argument("--sample-every", type=float, default=5.0, help="seconds between RSS / KV samples")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds a request may take")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", type=Path, help="write the result here")
    args = p.parse_args(argv)
    server = None
    if args.url:
        url, pid = args.url.rstrip("/"), args.pid
    else:
        from llmrs.bench.server import ManagedServer, llmrs_serve_argv

        log = Path(tempfile.mkdtemp(prefix="llmrs-soak-")) / "server.log"
        server = ManagedServer.from_command(llmrs_serve_argv(args.model, args.serve_arg), log)
        server.start()
        url, pid = server.url, server.proc.pid
        print(f"started {server.command} (pid {pid}, ready in {server.started_s:.1f} s); log: {log}", file=sys.stderr)
    try:
        result = asyncio.run(soak(args, url, pid))
    finally:
        if server is not None:
            rc = server.stop()
            print(f"server stopped (exit code {rc})", file=sys.stderr)
    if server is not None:
        result["server_command"], result["server_exit_code"] = server.command, rc
    print(report(result))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    leaked = result["after"] is not None and result["after"] != {"kv_blocks_in_use": 0, "requests_left": 0}
    return 1 if result["errors"] or leaked or (server is not None and rc != 0) else 0


if __name__ == "__main__":
    sys.exit(main())
