"""Results on disk: one versioned JSON document per `llmrs bench` invocation, one CSV of requests per run.

JSON (schema `llmrs.bench/1`): everything needed to trust and redo the numbers: the exact command, all
parameters, server identity (/v1/models, --label, the server command), tokenizer source, GPUs (pynvml),
client host and CPU use, timestamps, and per run (one per sweep point) its Summary and its CSV file name.
CSV (via pandas): one row per request, failures included, with every timing in ms (ITLs `;`-joined), the
queue-inclusive TTFT (from the scheduled send), and in a multi-turn run each request's conversation and turn.
The JSON is rewritten after every run, so an interrupted sweep keeps the runs that finished.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
from pathlib import Path

from llmrs.bench.metrics import queued_ttft, tpot
from llmrs.bench.records import RequestResult
from llmrs.errors import UserError

SCHEMA = "llmrs.bench/1"


def run_tag(concurrency: int | None, rate: float, trace_speed: float | None = None) -> str:
    """'c16-rinf': the setting of one run, used in CSV names and report keys; a trace replay's 'cinf-trace-x2'
    (sent at the trace's timestamps, `trace_speed` times as fast)."""
    c = f"c{concurrency if concurrency else 'inf'}"
    if trace_speed is not None:
        return f"{c}-trace-x{trace_speed:g}"
    return f"{c}-r{'inf' if math.isinf(rate) else f'{rate:g}'}"


def requests_frame(results: list[RequestResult], t0: float, text_tokens: dict[int, int] | None = None):
    """Per-request rows as a pandas DataFrame (times relative to the run's start t0)."""
    import pandas as pd

    ms = 1e3
    rows = []
    for r in results:
        tp = tpot(r) if r.success else None
        rows.append({
            "idx": r.idx,
            "worker": r.worker,
            "success": r.success,
            "error": r.error,
            "interrupted": r.interrupted or None,
            "scheduled_s": round(r.scheduled - t0, 6) if r.scheduled else None,
            "start_s": round(r.start - t0, 6) if r.start else None,
            "end_s": round(r.end - t0, 6) if r.end else None,
            "ttft_ms": round(r.ttft * ms, 3) if r.success else None,
            "queued_ttft_ms": round(queued_ttft(r) * ms, 3) if r.success else None,
            "tpot_ms": round(tp * ms, 3) if tp is not None else None,
            "e2el_ms": round(r.latency * ms, 3) if r.success else None,
            "input_len": r.input_len,
            "prompt_tokens": r.prompt_tokens,
            "output_tokens": r.output_tokens,
            "text_tokens": (text_tokens or {}).get(r.idx),
            "chunks": r.chunks,
            "max_tokens": r.max_tokens,
            "finish_reason": r.finish_reason or None,
            "itl_ms": ";".join(f"{g * ms:.3f}" for g in r.itl),
            "conversation": r.conversation if r.conversation >= 0 else None,
            "turn": r.turn if r.conversation >= 0 else None,
        })
    return pd.DataFrame(rows)


def write_json(path: Path, doc: dict) -> None:
    """Atomic write (temp file + rename): a crash never leaves half a results file. A place that cannot be written
    (a full disk, no permission, a directory in the way) is a UserError; the half-written temp file is removed."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    text = json.dumps(doc, indent=2, sort_keys=False, default=_jsonable) + "\n"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(text)
        os.replace(tmp, path)
    except OSError as e:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise UserError(f"cannot write results {path}: {e.strerror or e}") from None


def _jsonable(o):
    if hasattr(o, "to_dict"):
        return o.to_dict()
    if isinstance(o, Path):
        return str(o)
    raise TypeError(f"not JSON serializable: {type(o).__name__}")


def load_document(path: str | Path) -> dict:
    p = Path(path)
    try:
        doc = json.loads(p.read_text())
    except (OSError, ValueError) as e:
        raise UserError(f"cannot read results {p}: {e}") from e
    if not _has_bench_schema(doc):
        raise UserError(f"{p} is not an llmrs bench results file (no 'schema': '{SCHEMA}')")
    if doc["schema"] != SCHEMA:
        raise UserError(f"{p}: results schema {doc['schema']} is not supported (this llmrs reads {SCHEMA})")
    return doc


def _has_bench_schema(doc: object) -> bool:
    return isinstance(doc, dict) and str(doc.get("schema", "")).startswith("llmrs.bench/")


def _is_results(path: Path) -> bool:
    """Whether a JSON file carries the bench schema (a directory of reports also holds profiles, decode benches...)."""
    try:
        return _has_bench_schema(json.loads(path.read_text()))
    except (OSError, ValueError):
        return False


def find_results(paths: list[str]) -> list[Path]:
    """Results JSON files from files and directories (a directory: its *.json that are bench results, sorted;
    a file named explicitly must be one: load_document says why not), each once however often it was named."""
    out: dict[Path, Path] = {}  # resolved -> as given: a file named twice (or in a directory also given) counts once
    for s in paths:
        p = Path(s)
        if p.is_dir():
            found = sorted(q for q in p.glob("*.json") if not q.name.endswith(".tmp") and _is_results(q))
        elif p.is_file():
            found = [p]
        else:
            raise UserError(f"no such results file or directory: {s}")
        for q in found:
            out.setdefault(q.resolve(), q)
    if not out:
        raise UserError("no results files found")
    return list(out.values())


def stat(s: dict, *path: str) -> float | None:
    """The number at `path` in a saved summary (`stat(s, "ttft_ms", "median")`), None where it is missing or null
    (nothing measured: every request failed; or a results file without it)."""
    v: object = s
    for k in path:
        v = v.get(k) if isinstance(v, dict) else None
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None


def pct(s: dict, key: str, name: str) -> float | None:
    """Percentile `name` ("p99") of the distribution `key`, else its max (a run that asked for other percentiles)."""
    v = stat(s, key, "percentiles", name)
    return v if v is not None else stat(s, key, "max")
