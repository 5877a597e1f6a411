"""Who was measured and on what: server identity (/v1/models, Server header, the engine), GPUs (pynvml), the client host."""

from __future__ import annotations

import os
import platform

import httpx

import llmrs


def server_identity(base_url: str, api_key: str | None = None) -> dict:
    """The server's /v1/models (ids, owners, max_model_len), HTTP `server` header and `engine`; {} fields when absent.

    `models_error` says why there is no model list (an HTTP error, a reply not shaped like OpenAI's); `unreachable`
    says why no connection could be made at all (nothing listens there, the host does not resolve). A server without
    a model list names its model elsewhere: TGI's GET /info (`model_id`), llama-server's GET /props (`model_path`);
    `models_from` then says which. `engine` (`detect_engine`) is a best guess, never an error."""
    info: dict = {"url": base_url, "models": [], "server_header": None}
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    base = base_url.rstrip("/")
    try:
        with httpx.Client(timeout=10.0, trust_env=False) as c:
            r = c.get(f"{base}/v1/models", headers=headers)
            info["server_header"] = r.headers.get("server")
            if r.status_code == 200:
                info["models"] = parse_models(r.json())
                if info["models"] is None:
                    info["models"] = []
                    info["models_error"] = "malformed reply: expected {\"data\": [{\"id\": ...}, ...]}"
            else:
                info["models_error"] = f"HTTP {r.status_code}"
            extras = _extra_routes(c, base, headers)
    except (httpx.ConnectError, httpx.ConnectTimeout) as e:
        info["models_error"] = f"{type(e).__name__}: {e}"
        info["unreachable"] = str(e) or type(e).__name__
        return info
    except (httpx.HTTPError, ValueError) as e:
        info["models_error"] = f"{type(e).__name__}: {e}"
        return info
    if not info["models"]:
        for route, key in (("/info", "model_id"), ("/props", "model_path")):
            doc = extras.get(route)
            if isinstance(doc, dict) and isinstance(doc.get(key), str) and doc[key]:
                info["models"], info["models_from"] = [{"id": doc[key]}], f"GET {route} ({key})"
                break
    info["engine"] = detect_engine(info["models"], info["server_header"], extras)
    return info


# What an engine's own routes say: TGI's /info names its router, llama-server's /props its slots and generation
# settings; a /v1/models entry's owned_by names the rest (llama-cpp-python's is "me")
ENGINE_OWNERS = {"llmrs": "llmrs", "vllm": "vllm", "sglang": "sglang", "llamacpp": "llama.cpp",
                 "me": "llama-cpp-python"}


def _extra_routes(c: httpx.Client, base: str, headers: dict) -> dict:
    """GET /info and /props where they answer 200 with a JSON object (a few ms each; errors are no answer)."""
    out = {}
    for route in ("/info", "/props"):
        try:
            r = c.get(f"{base}{route}", headers=headers, timeout=5.0)
            doc = r.json() if r.status_code == 200 else None
        except (httpx.HTTPError, ValueError):
            doc = None
        if isinstance(doc, dict):
            out[route] = doc
    return out


def detect_engine(models: list[dict], server_header: str | None, extras: dict) -> str:
    """Which engine serves: "tgi", "llama.cpp" (llama-server), "llama-cpp-python", "vllm", "sglang", "llmrs" or
    "unknown", from TGI's /info, llama-server's /props, then the models' owned_by."""
    info, props = extras.get("/info") or {}, extras.get("/props") or {}
    if "model_id" in info and ("router" in info or "max_input_tokens" in info or "max_total_tokens" in info):
        return "tgi"
    if "total_slots" in props or "default_generation_settings" in props:
        return "llama.cpp"
    for m in models:
        owner = m.get("owned_by")
        if owner in ENGINE_OWNERS:
            return ENGINE_OWNERS[owner]
        if owner and owner == m.get("id") and info.get("model_id") == owner:
            return "tgi"
    return "unknown"


def parse_models(doc: object) -> list[dict] | None:
    """The models of an OpenAI /v1/models reply ({"data": [{"id": ...}, ...]}), or None for another shape.
    Entries without a string id are left out, fields of another type than OpenAI's too."""
    data = doc.get("data") if isinstance(doc, dict) else None
    if not isinstance(data, list):
        return None
    kinds = {"id": str, "owned_by": str, "max_model_len": int, "root": str}
    return [
        {k: m[k] for k, kind in kinds.items() if isinstance(m.get(k), kind)}
        for m in data if isinstance(m, dict) and isinstance(m.get("id"), str) and m["id"]
    ]


# Prefix-cache counters (prompt tokens looked up / found) and the preemption counter in a server's Prometheus
# /metrics, by exporter prefix: llmrs and vLLM (V1) name them the same way.
PREFIX_CACHE_COUNTERS = {p: (f"{p}:prefix_cache_queries", f"{p}:prefix_cache_hits") for p in ("llmrs", "vllm")}
PREEMPTION_COUNTERS = {p: f"{p}:num_preemptions" for p in ("llmrs", "vllm")}


def metric_totals(text: str) -> dict[str, float]:
    """Each metric's value summed over its label sets, from Prometheus text exposition; a counter's `_total` suffix
    (prometheus_client adds it) dropped."""
    totals: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name.endswith("_total"):
            name = name[: -len("_total")]
        try:
            value = float(line.rsplit(" ", 1)[-1])
        except ValueError:
            continue
        totals[name] = totals.get(name, 0.0) + value
    return totals


def prefix_cache_from(totals: dict[str, float] | None) -> dict | None:
    """{"source", "queries", "hits", "preemptions"} (token counts; requests preempted, None where the server does not
    count them) from a server's metric totals, or None when it exports neither llmrs's nor vLLM's prefix-cache
    counters."""
    for source, (queries, hits) in PREFIX_CACHE_COUNTERS.items():
        if totals and queries in totals and hits in totals:
            return {"source": source, "queries": totals[queries], "hits": totals[hits],
                    "preemptions": totals.get(PREEMPTION_COUNTERS[source])}
    return None


# Step shapes whose CUDA graph capture failed in an llmrs server (they run eagerly, slower)
GRAPH_FAILURES = "llmrs:cuda_graph_capture_failures"


def graph_capture_failures(totals: dict[str, float] | None) -> int | None:
    """The llmrs server's count of step shapes whose CUDA graph capture failed, or None (no such counter)."""
    return int(totals[GRAPH_FAILURES]) if totals and GRAPH_FAILURES in totals else None


def server_metrics(base_url: str, api_key: str | None = None) -> dict[str, float] | None:
    """The server's metric totals now (GET /metrics, `metric_totals`), or None (no such endpoint)."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        with httpx.Client(timeout=10.0, trust_env=False) as c:
            r = c.get(f"{base_url.rstrip('/')}/metrics", headers=headers)
        return metric_totals(r.text) if r.status_code == 200 else None
    except httpx.HTTPError:
        return None


def prefix_cache_delta(before: dict | None, after: dict | None, prompt_tokens: int | None = None) -> dict | None:
    """What a run added to the server's prefix-cache counters: prompt tokens looked up, found, the hit rate, and
    requests preempted (a benchmark of "new" prompts should find none of them cached).

    A hit is one of two things. A prompt, or a shared prefix, the server had seen before (an earlier point, a
    warm-up, another client). Or recomputation after preemption: a request whose KV blocks were freed when the cache
    ran full is looked up again when it is readmitted, its prompt and the output so far, and finds its own blocks
    still cached. The counters do not tell them apart, but with the run's `prompt_tokens` (each request's prompt,
    looked up at its first admission) the lookups beyond them are those of readmissions after preemption (and, on
    an llmrs server, of admissions retried while the cache was full: it counts every attempt): `requery_tokens`.
    A lookup finds at most what it looks up, so at least hits - requery_tokens of the hits were prompts seen before
    (`hit_tokens_seen_before`; every hit when nothing was preempted)."""
    if before is None or after is None or before["source"] != after["source"]:
        return None
    q, h = after["queries"] - before["queries"], after["hits"] - before["hits"]
    out = {"source": after["source"], "query_tokens": int(q), "hit_tokens": int(h),
           "hit_rate": round(h / q, 4) if q > 0 else 0.0}
    pre0, pre1 = before.get("preemptions"), after.get("preemptions")
    out["preemptions"] = int(pre1 - pre0) if pre0 is not None and pre1 is not None else None
    if prompt_tokens is not None and out["preemptions"] is not None:
        requery = max(0, int(q) - prompt_tokens) if out["preemptions"] else 0
        out["requery_tokens"] = requery
        out["hit_tokens_seen_before"] = max(0, int(h) - requery)
    return out


def prefix_cache_notes(cache: dict | None) -> list[str]:
    """What a run's prefix-cache delta (`prefix_cache_delta`) means, in words: nothing for a run that found nothing
    cached and preempted nothing; else which of its hits were prompts seen before and which were recomputation after
    preemption, and that preemption happened."""
    if not cache:
        return []
    hits, n_pre = cache["hit_tokens"], cache.get("preemptions")
    notes = []
    if n_pre:
        notes.append(f"note: the server preempted {n_pre} request(s) in this run (its KV cache was full): their KV "
                     "blocks were freed and recomputed later, which costs throughput; fewer concurrent requests or a "
                     "larger KV cache avoid it")
    if not hits:
        return notes
    share = f"{cache['hit_rate']:.0%} of this run's prompt lookups ({hits:,} of {cache['query_tokens']:,} tokens)"
    seen, requery = cache.get("hit_tokens_seen_before"), cache.get("requery_tokens", 0)
    if n_pre and seen is not None:
        again = (f"the {requery:,} tokens looked up again by requests readmitted after preemption (or retried "
                 "while the cache was full)")
        if seen == 0:
            notes.append(f"note: the server's prefix cache held {share}, all within {again}: recomputation after "
                         "preemption, not prompts it had seen before")
        else:
            notes.append(f"note: the server's prefix cache held {share}: at least {seen:,} tokens were prompts, or a "
                         f"shared prefix of them, it had seen before; the other {hits - seen:,} are within {again}: "
                         "recomputation after preemption")
    else:
        known = " (no request was preempted)" if n_pre == 0 else ""
        notes.append(f"note: the server's prefix cache held {share}{known}: it had seen these prompts, or a shared "
                     "prefix of them, before")
    return notes


def gpu_info() -> list[dict]:
    """Name, driver and memory of each NVIDIA GPU via pynvml (nvidia-ml-py); [] where there is none."""
    try:
        import pynvml
    except ImportError:
        return []
    try:
        pynvml.nvmlInit()
    except Exception:  # noqa: BLE001 - no driver / no GPU
        return []
    try:
        driver = pynvml.nvmlSystemGetDriverVersion()
        out = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            name = pynvml.nvmlDeviceGetName(h)
            out.append({
                "index": i,
                "name": name.decode() if isinstance(name, bytes) else name,
                "driver": driver.decode() if isinstance(driver, bytes) else driver,
                "memory_gib": round(pynvml.nvmlDeviceGetMemoryInfo(h).total / 2**30, 1),
            })
        return out
    except Exception:  # noqa: BLE001 - partial NVML support: report nothing rather than crash a bench
        return []
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:  # noqa: BLE001
            pass


def client_host() -> dict:
    return {
        "hostname": platform.node(),
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "llmrs_version": llmrs.__version__,
    }
