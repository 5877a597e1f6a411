"""A disconnect storm against a running OpenAI-compatible server, then the KV-block accounting check.

N streamed completions at once; a share of the clients (--drop) close their connection after a random number of
deltas, the others read to the end. Then /metrics is polled until no request runs and every KV block is free
again (`llmrs:kv_cache_free_blocks` == `llmrs:kv_cache_num_blocks`): a block still held after that is a leak.

    python -m tools.disconnect_storm --url http://127.0.0.1:8000 -n 256 --drop 0.3 --max-tokens 256 --json out.json

Exit status 0 when every kept stream finished and every block came back, 1 otherwise.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time

import httpx


def metric(text: str, name: str) -> float | None:
    """The value of the first sample of `name` in Prometheus text (labels or none)."""
    for line in text.splitlines():
        if line.startswith((name + " ", name + "{")):
            return float(line.rsplit(" ", 1)[1])
    return None


async def one(client: httpx.AsyncClient, url: str, model: str, i: int, drop_after: int | None,
              max_tokens: int, prompt: str) -> dict:
    body = {"model": model, "prompt": f"{i}: {prompt}", "max_tokens": max_tokens, "stream": True,
            "ignore_eos": True, "temperature": 0.8}
    deltas, finish, error = 0, None, None
    try:
        async with client.stream("POST", f"{url}/v1/completions", json=body) as r:
            if r.status_code != 200:
                return {"i": i, "status": r.status_code, "error": (await r.aread()).decode()[:200]}
            async for line in r.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                event = json.loads(line[6:])
                if "error" in event:
                    error = event["error"].get("message")
                    break
                deltas += 1
                finish = event["choices"][0].get("finish_reason") or finish
                if drop_after is not None and deltas >= drop_after:
                    return {"i": i, "status": 200, "dropped": True, "deltas": deltas}  # leaves: closes the stream
    except httpx.HTTPError as e:
        return {"i": i, "status": 0, "error": repr(e)}
    return {"i": i, "status": 200, "dropped": False, "deltas": deltas, "finish": finish, "error": error}


async def storm(args: argparse.Namespace) -> dict:
    rng = random.Random(args.seed)
    limits = httpx.Limits(max_connections=args.n + 8, max_keepalive_connections=args.n + 8)
    async with httpx.AsyncClient(timeout=httpx.Timeout(args.timeout), limits=limits) as client:
        model = args.model
        if model is None:
            model = (await client.get(f"{args.url}/v1/models")).json()["data"][0]["id"]
        plan = [rng.randint(1, max(1, args.max_tokens - 1)) if rng.random() < args.drop else None
                for _ in range(args.n)]
        t0 = time.perf_counter()
        results = await asyncio.gather(*(one(client, args.url, model, i, d, args.max_tokens, args.prompt)
                                          for i, d in enumerate(plan)))
        wall = time.perf_counter() - t0
        deadline = time.perf_counter() + args.settle
        while True:
            text = (await client.get(f"{args.url}/metrics")).text
            running = metric(text, "llmrs:num_requests_running")
            waiting = metric(text, "llmrs:num_requests_waiting")
            free = metric(text, "llmrs:kv_cache_free_blocks")
            total = metric(text, "llmrs:kv_cache_num_blocks")
            settled = running == 0 and waiting == 0 and free == total
            if settled or time.perf_counter() > deadline:
                break
            await asyncio.sleep(0.05)
        settle_s = args.settle - max(0.0, deadline - time.perf_counter())
    kept = [r for r in results if r.get("status") == 200 and not r.get("dropped")]
    dropped = [r for r in results if r.get("dropped")]
    failed = [r for r in results if r.get("status") != 200 or r.get("error")]
    completed = [r for r in kept if r.get("finish") == "length"]  # (ignore_eos: every kept stream runs to max_tokens)
    return {"n": args.n, "drop": args.drop, "max_tokens": args.max_tokens, "wall_s": round(wall, 2),
            "dropped": len(dropped), "kept": len(kept), "kept_completed": len(completed), "failed": len(failed),
            "failures": failed[:5], "running_after": running, "waiting_after": waiting,
            "free_blocks_after": free, "num_blocks": total, "blocks_in_use_after": None if free is None else
            int(total - free), "settled": settled, "settle_s": round(settle_s, 2)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", default="http://127.0.0.1:8000")
    ap.add_argument("--model", default=None, help="model name to send (default: the server's first)")
    ap.add_argument("-n", type=int, default=256, help="concurrent streams")
    ap.add_argument("--drop", type=float, default=0.3, help="share of clients that disconnect mid-stream")
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--prompt", default="Write a long story about a lighthouse keeper and the sea.")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--timeout", type=float, default=300.0, help="per-request timeout (s)")
    ap.add_argument("--settle", type=float, default=10.0, help="seconds the blocks get to come back")
    ap.add_argument("--json", default=None, help="write the result here")
    args = ap.parse_args()
    res = asyncio.run(storm(args))
    print(f"streams {res['n']}: dropped {res['dropped']}, kept {res['kept']} (completed {res['kept_completed']}), "
          f"failed {res['failed']}; after {res['settle_s']} s: running {res['running_after']}, "
          f"blocks in use {res['blocks_in_use_after']} of {res['num_blocks']}")
    for f in res["failures"]:
        print("  failure:", f)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(res, fh, indent=1)
    ok = res["settled"] and not res["failed"] and res["kept_completed"] == res["kept"]
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
