"""The workload's prompts: random tokens of exact length, a ShareGPT JSON file, or a JSONL file of prompts.

Random prompts follow `vllm bench serve --dataset-name random`: input and output lengths uniform in
[L*(1-r), L*(1+r)] for --range-ratio r, token ids drawn at random, and an optional shared prefix of
--prefix-len tokens (to exercise prefix caching) in front of each. Text prompts are fitted so that the server
tokenizes them to exactly the drawn length (decode -> encode -> trim or pad, a few rounds); token-id prompts
(`--prompt-format ids`, /v1/completions only) are exact by construction and need no tokenizer.

Two traffic shapes beyond a list of prompts:
- a trace (`is_trace`: a .jsonl whose rows carry "timestamp"): each row is one request sent at its timestamp
  (seconds from the start; RequestSpec.at), with its "prompt", or else a random prompt of exactly its "input_len"
  tokens, and its "output_len";
- conversations (`multi_turn`): ShareGPT conversations turn by turn (each "human" message a turn, the reply after it
  its output length), or random ones of `turns` user messages of --input-len tokens each. Every turn is a
  RequestSpec of its conversation holding only its own user message: the history is the server's to answer, so
  the worker puts it in front at send time. `num_prompts` counts conversations.
"""

from __future__ import annotations

import asyncio
import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from llmrs.bench.records import RequestSpec
from llmrs.bench.tokenization import ID_RANGE, LocalTokenizer, Tokenizer
from llmrs.errors import UserError

DEFAULT_OUTPUT_LEN = 128
FIT_ROUNDS = 10
FIT_PARALLEL = 32


@dataclass(slots=True)
class WorkloadConfig:
    """What to send (not how fast: that is the load). Lengths are tokens."""

    num_prompts: int = 100
    input_len: int = 256
    output_len: int | None = None  # None: the dataset's reply length, else DEFAULT_OUTPUT_LEN
    range_ratio: float = 0.0
    prefix_len: int = 0
    dataset: str | None = None  # ShareGPT .json or .jsonl; None: random tokens
    prompt_format: str = "text"  # text | ids
    backend: str = "completions"
    seed: int = 0
    multi_turn: bool = False  # conversations replayed turn by turn (num_prompts: conversations)
    turns: int | None = None  # random conversations: user messages each; ShareGPT: at most this many turns each


def _lengths(rng: np.random.Generator, n: int, mean: int, ratio: float) -> np.ndarray:
    lo, hi = max(1, int(mean * (1 - ratio))), max(1, int(mean * (1 + ratio)))
    return rng.integers(lo, hi + 1, size=n)


def id_range(vocab_size: int | None) -> tuple[int, int]:
    """[lo, hi) of the random ids for a server's tokenizer: ID_RANGE, cut to a smaller vocabulary where the server
    said so (ServerTokenizer.vocab_size); its first 256 ids stay out where the rest leaves 64 or more (byte-level
    vocabularies put special tokens there), else its upper half."""
    if vocab_size is None or vocab_size >= ID_RANGE[1]:
        return ID_RANGE
    lo = ID_RANGE[0] if vocab_size - ID_RANGE[0] >= 64 else vocab_size // 2
    return lo, vocab_size


def _id_sampler(tok: Tokenizer | None):
    """Draws random ordinary token ids: from the local vocabulary minus special tokens, else `id_range` (the
    server's vocabulary where it is smaller than ID_RANGE)."""
    if isinstance(tok, LocalTokenizer):
        allowed = np.array(sorted(set(range(tok.vocab_size)) - tok.special_ids), dtype=np.int64)
        return lambda rng, k: allowed[rng.integers(0, allowed.size, size=k)].tolist()
    lo, hi = id_range(getattr(tok, "vocab_size", None))
    return lambda rng, k: rng.integers(lo, hi, size=k).tolist()


async def fit_text(tok: Tokenizer, ids: list[int], target: int, n_special: int, rng, draw) -> tuple[str, int]:
    """Text that `tok` encodes to exactly `target` tokens (specials included), starting from content `ids`.

    NOTE: decode -> encode does not round-trip (tokens merge at boundaries), hence trim/pad rounds; after
    FIT_ROUNDS the closest text is kept and its real length recorded.
    """
    want = max(0, target - n_special)
    text, got = "", 0
    for _ in range(FIT_ROUNDS):
        text = await tok.decode(ids)
        enc = await tok.encode(text)
        got = len(enc)
        if got == target:
            break
        content = enc[n_special:]
        ids = content[:want] if got > target else content + draw(rng, want - len(content))
    return text, got


async def _random_specs(cfg: WorkloadConfig, tok: Tokenizer | None, out_len: int) -> list[RequestSpec]:
    rng = np.random.default_rng(cfg.seed)
    draw = _id_sampler(tok)
    in_lens = _lengths(rng, cfg.num_prompts, cfg.input_len, cfg.range_ratio)
    out_lens = _lengths(rng, cfg.num_prompts, out_len, cfg.range_ratio)
    prefix = draw(rng, cfg.prefix_len) if cfg.prefix_len else []
    prompts = await _random_prompts(cfg.prompt_format, tok, [int(n) for n in in_lens], rng, draw, prefix)
    return [RequestSpec(i, p, n, int(o)) for i, ((p, n), o) in enumerate(zip(prompts, out_lens, strict=True))]


async def _random_prompts(fmt: str, tok: Tokenizer | None, lengths: list[int], rng: np.random.Generator, draw,
                          prefix: list[int] | None = None, prefixed: list[bool] | None = None,
                          ) -> list[tuple[str | list[int], int]]:
    """(prompt, its token count) of random prompts of `lengths` tokens (plus `prefix`'s in front of each, or of those
    `prefixed` names): token ids (`fmt` "ids"), else text the tokenizer encodes to exactly that many."""
    prefix = prefix or []
    pre = [prefix if prefixed is None or prefixed[i] else [] for i in range(len(lengths))]
    if fmt == "ids":
        return [(pre[i] + draw(rng, n), len(pre[i]) + n) for i, n in enumerate(lengths)]
    if tok is None:
        raise UserError(
            "random text prompts need a tokenizer: the server has no tokenize endpoint llmrs knows; pass "
            "--tokenizer (a tokenizer.json, a Hugging Face directory, a .gguf or an embedded model name) or "
            "--model-config (the served model), or use --prompt-format ids with --backend completions"
        )
    n_special = len(await tok.encode(""))
    sem = asyncio.Semaphore(FIT_PARALLEL)
    seeds = rng.integers(0, 2**63 - 1, size=len(lengths))
    body_ids = [draw(rng, max(0, n - n_special)) for n in lengths]

    async def one(i: int) -> tuple[str, int]:
        async with sem:
            return await fit_text(tok, pre[i] + body_ids[i], len(pre[i]) + lengths[i], n_special,
                                  np.random.default_rng(seeds[i]), draw)

    return list(await asyncio.gather(*(one(i) for i in range(len(lengths)))))


def read_prompts(path: str) -> list[tuple[str | list[int], int | str | None]]:
    """(prompt, output) pairs from ShareGPT JSON (output: the reply text) or JSONL (output: its "output_len").

    JSONL rows: a string, or {"prompt": text or [token ids], "output_len": N >= 1 (optional)}. A malformed row or
    item is a UserError naming its line (JSONL) or index (ShareGPT), never skipped in silence.
    """
    p = Path(path)
    text = _read_text(path)
    if p.suffix == ".jsonl":
        out = [_jsonl_row(path, i, ln) for i, ln in enumerate(text.split("\n"), 1) if ln.strip()]
    else:
        try:
            data = json.loads(text)
        except ValueError as e:
            raise UserError(f"--dataset: {path} is not valid JSON: {e}") from None
        items = data if isinstance(data, list) else []
        out = [row for i, item in enumerate(items) if (row := _sharegpt_item(path, i, item))]
    if not out:
        raise UserError(f"--dataset: {path} has no prompts (expected ShareGPT JSON or .jsonl with 'prompt' fields)")
    return out


def _sharegpt_item(path: str, i: int, item: object) -> tuple[str, str | None] | None:
    """(first turn, reply) of ShareGPT item `i`; None for an item without conversation (skipped, as vLLM does)."""
    turns = (item.get("conversations") or item.get("conversation") or []) if isinstance(item, dict) else []
    if not turns:
        return None
    where = f"--dataset: {path} item {i}"
    if not isinstance(turns, list) or not all(isinstance(t, dict) for t in turns[:2]):
        raise UserError(f"{where}: 'conversations' must be a list of {{\"from\": ..., \"value\": text}} objects")
    first, reply = turns[0].get("value"), turns[1].get("value") if len(turns) > 1 else None
    if first is not None and not isinstance(first, str) or reply is not None and not isinstance(reply, str):
        raise UserError(f"{where}: a turn's 'value' must be text")
    return (first, reply) if first else None


def _jsonl_row(path: str, line: int, text: str) -> tuple[str | list[int], int | None]:
    """One JSONL line (numbered from 1): a string, or {"prompt": text or [ids], "output_len": N}."""
    where = f"--dataset: {path} line {line}"
    try:
        r = json.loads(text)
    except ValueError as e:
        raise UserError(f"{where} is not valid JSON: {getattr(e, 'msg', e)}") from None
    if isinstance(r, str):
        prompt, n = r, None
    elif isinstance(r, dict):
        prompt = r.get("prompt", r.get("text"))
        if prompt is None:
            raise UserError(f"{where}: the row lacks 'prompt'")
        n = r.get("output_len", r.get("max_tokens"))
    else:
        raise UserError(f"{where}: a row must be a string or an object, got {type(r).__name__}")
    ids = isinstance(prompt, list) and all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in prompt)
    if not (isinstance(prompt, str) or ids):
        raise UserError(f"{where}: 'prompt' must be text or a list of token ids (integers >= 0)")
    if not prompt:
        raise UserError(f"{where}: 'prompt' is empty")
    whole = isinstance(n, int | float) and not isinstance(n, bool) and math.isfinite(n) and n == int(n)
    if n is not None and not (whole and n >= 1):
        raise UserError(f"{where}: 'output_len' must be a whole number >= 1 (got {json.dumps(n)})")
    return prompt, int(n) if n is not None else None


def _read_text(path: str) -> str:
    p = Path(path)
    if p.is_dir():
        raise UserError(f"--dataset: {path} is a directory; give a .json or .jsonl file")
    if not p.is_file():
        raise UserError(f"--dataset: no such file: {path}")
    try:
        return p.read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise UserError(f"--dataset: cannot read {path}: {getattr(e, 'strerror', None) or e}") from None


def is_trace(path: str | None) -> bool:
    """Whether --dataset is a trace: a .jsonl whose first row is an object with a "timestamp"."""
    if not path or not path.endswith(".jsonl") or not Path(path).is_file():
        return False
    try:
        with open(path) as f:
            first = next((ln for ln in f if ln.strip()), "")
        row = json.loads(first)
    except (OSError, UnicodeDecodeError, ValueError):
        return False
    return isinstance(row, dict) and "timestamp" in row


@dataclass(slots=True)
class TraceRow:
    """One request of a trace: when (s from the start), its prompt or the length of a random one, its output."""

    timestamp: float
    prompt: str | list[int] | None
    input_len: int | None
    output_len: int | None
    line: int


def _whole(v: object, least: int) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) and v == int(v) and v >= least


def read_trace(path: str) -> list[TraceRow]:
    """A trace's rows sorted by timestamp (ties keep the file's order). Every row: {"timestamp": s >= 0, "prompt":
    text or [ids] | "input_len": N >= 1, "output_len": N >= 1 (optional)}; a malformed one is a UserError naming
    its line."""
    rows = []
    for line, ln in enumerate(_read_text(path).split("\n"), 1):
        if not ln.strip():
            continue
        where = f"--dataset: {path} line {line}"
        try:
            r = json.loads(ln)
        except ValueError as e:
            raise UserError(f"{where} is not valid JSON: {getattr(e, 'msg', e)}") from None
        if not isinstance(r, dict) or "timestamp" not in r:
            raise UserError(f"{where}: a trace row must be an object with a 'timestamp' (seconds from the start)")
        ts = r["timestamp"]
        if not (isinstance(ts, int | float) and not isinstance(ts, bool) and math.isfinite(ts) and ts >= 0):
            raise UserError(f"{where}: 'timestamp' must be a number of seconds >= 0 (got {json.dumps(ts)})")
        prompt, n_in, n_out = r.get("prompt"), r.get("input_len"), r.get("output_len")
        if prompt is None and n_in is None:
            raise UserError(f"{where}: the row needs 'prompt' or 'input_len'")
        if prompt is not None:
            ids = isinstance(prompt, list) and all(_whole(t, 0) for t in prompt)
            if not (isinstance(prompt, str) or ids) or not prompt:
                raise UserError(f"{where}: 'prompt' must be non-empty text or a list of token ids (integers >= 0)")
            n_in = None
        elif not _whole(n_in, 1):
            raise UserError(f"{where}: 'input_len' must be a whole number >= 1 (got {json.dumps(n_in)})")
        if n_out is not None and not _whole(n_out, 1):
            raise UserError(f"{where}: 'output_len' must be a whole number >= 1 (got {json.dumps(n_out)})")
        rows.append(TraceRow(float(ts), prompt, None if n_in is None else int(n_in),
                             None if n_out is None else int(n_out), line))
    if not rows:
        raise UserError(f"--dataset: {path} has no rows")
    return sorted(rows, key=lambda t: t.timestamp)


async def _trace_specs(cfg: WorkloadConfig, tok: Tokenizer | None, n: int | None) -> list[RequestSpec]:
    """The first `n` requests of the trace (all: None), in send order, each with its timestamp (`at`)."""
    rows = read_trace(cfg.dataset)  # type: ignore[arg-type]
    rows = rows[:n] if n else rows
    rng = np.random.default_rng(cfg.seed)
    draw = _id_sampler(tok)
    prefix = draw(rng, cfg.prefix_len) if cfg.prefix_len else []
    rand = [r for r in rows if r.prompt is None]
    made = iter(await _random_prompts(cfg.prompt_format, tok, [r.input_len for r in rand], rng, draw, prefix)
                if rand else [])
    specs = []
    for i, r in enumerate(rows):
        if r.prompt is None:
            prompt, n_in = next(made)
        elif isinstance(r.prompt, list):
            if cfg.backend == "chat":
                raise UserError(f"--dataset: {cfg.dataset} line {r.line}: token-id prompts need --backend completions")
            prompt, n_in = [int(t) for t in r.prompt], len(r.prompt)
        else:
            prompt = r.prompt
            n_in = len(await tok.encode(prompt)) if tok else 0
        specs.append(RequestSpec(i, prompt, n_in, cfg.output_len or r.output_len or DEFAULT_OUTPUT_LEN, at=r.timestamp))
    return specs


USER_ROLES = ("human", "user")


def read_conversations(path: str) -> list[list[tuple[str, str | None]]]:
    """ShareGPT conversations as [(user message, the reply after it or None), ...]; "system" turns are left out, and
    a reply with no user message before it (a conversation opened by the assistant) too."""
    if path.endswith(".jsonl"):
        raise UserError(f"--dataset {path}: multi-turn replays ShareGPT JSON conversations (a .json file)")
    try:
        data = json.loads(_read_text(path))
    except ValueError as e:
        raise UserError(f"--dataset: {path} is not valid JSON: {e}") from None
    out = []
    for i, item in enumerate(data if isinstance(data, list) else []):
        turns = (item.get("conversations") or item.get("conversation") or []) if isinstance(item, dict) else []
        if not isinstance(turns, list) or not all(isinstance(t, dict) and isinstance(t.get("value", ""), str)
                                                  for t in turns):
            raise UserError(f"--dataset: {path} item {i}: 'conversations' must be a list of "
                            "{\"from\": ..., \"value\": text} objects")
        conv: list[tuple[str, str | None]] = []
        for t in turns:
            role, value = str(t.get("from", "")).lower(), t.get("value") or ""
            if role == "system":
                continue
            if role in USER_ROLES:
                if value:
                    conv.append((value, None))
            elif conv and conv[-1][1] is None:
                conv[-1] = (conv[-1][0], value)
        if conv:
            out.append(conv)
    if not out:
        raise UserError(f"--dataset: {path} has no conversations (expected ShareGPT JSON: a list of "
                        "{\"conversations\": [{\"from\": \"human\", \"value\": ...}, ...]})")
    return out


async def _conversation_specs(cfg: WorkloadConfig, tok: Tokenizer | None) -> list[RequestSpec]:
    """cfg.num_prompts conversations, turn by turn: from the ShareGPT --dataset, else random ones of cfg.turns
    user messages (the shared prefix, if any, in front of each conversation's first message)."""
    rng = np.random.default_rng(cfg.seed)
    if cfg.dataset:
        convs = read_conversations(cfg.dataset)
        order = rng.permutation(len(convs))
        picked = [convs[order[c % len(convs)]][:cfg.turns or None] for c in range(cfg.num_prompts)]
        prefix_text = ""
        if cfg.prefix_len:
            prefix_text = await tok.decode(_id_sampler(tok)(rng, cfg.prefix_len)) + " " if tok else ""
        specs = []
        for c, conv in enumerate(picked):
            for k, (msg, reply) in enumerate(conv):
                msg = prefix_text + msg if k == 0 else msg
                n_in = len(await tok.encode(msg)) if tok else 0
                out = len(await tok.encode(reply)) if tok and reply else None
                specs.append(RequestSpec(len(specs), msg, n_in, cfg.output_len or out or DEFAULT_OUTPUT_LEN,
                                         conversation=c, turn=k))
        return specs
    turns = cfg.turns or 1
    n = cfg.num_prompts * turns
    draw = _id_sampler(tok)
    in_lens = _lengths(rng, n, cfg.input_len, cfg.range_ratio)
    out_lens = _lengths(rng, n, cfg.output_len or DEFAULT_OUTPUT_LEN, cfg.range_ratio)
    prefix = draw(rng, cfg.prefix_len) if cfg.prefix_len else []
    first = [i % turns == 0 for i in range(n)]
    prompts = await _random_prompts("text", tok, [int(x) for x in in_lens], rng, draw, prefix, first)
    return [RequestSpec(i, p, m, int(o), conversation=i // turns, turn=i % turns)
            for i, ((p, m), o) in enumerate(zip(prompts, out_lens, strict=True))]


async def _file_specs(cfg: WorkloadConfig, tok: Tokenizer | None) -> list[RequestSpec]:
    rows = read_prompts(cfg.dataset)  # type: ignore[arg-type]
    rng = np.random.default_rng(cfg.seed)
    order = rng.permutation(len(rows))
    picked = [rows[order[i % len(rows)]] for i in range(cfg.num_prompts)]
    prefix_text, prefix_ids = "", []
    if cfg.prefix_len:
        prefix_ids = _id_sampler(tok)(rng, cfg.prefix_len)
        prefix_text = await tok.decode(prefix_ids) + " " if tok else ""
    specs = []
    for i, (prompt, out) in enumerate(picked):
        if isinstance(out, str):  # ShareGPT reply text: its token length, as vLLM does
            out = len(await tok.encode(out)) if tok else None
        n_out = cfg.output_len or out or DEFAULT_OUTPUT_LEN
        if isinstance(prompt, list):
            if cfg.backend == "chat":
                raise UserError("--dataset: token-id prompts need --backend completions")
            prompt = prefix_ids + [int(t) for t in prompt]
            n_in = len(prompt)
        else:
            prompt = prefix_text + prompt
            n_in = len(await tok.encode(prompt)) if tok else 0
        specs.append(RequestSpec(i, prompt, n_in, int(n_out)))
    return specs


async def build_workload(cfg: WorkloadConfig, tok: Tokenizer | None) -> list[RequestSpec]:
    """The workload's requests, deterministic for a seed."""
    if cfg.num_prompts < 1:
        raise UserError("--num-prompts must be >= 1")
    if cfg.prompt_format not in ("text", "ids"):
        raise UserError("--prompt-format must be text or ids")
    if cfg.prompt_format == "ids" and cfg.backend == "chat":
        raise UserError("--prompt-format ids needs --backend completions (chat messages are text)")
    if not 0 <= cfg.range_ratio < 1:
        raise UserError("--range-ratio must be in [0, 1)")
    if cfg.multi_turn:
        if cfg.backend != "chat":
            raise UserError("multi-turn conversations are sent as chat messages: they need --backend chat")
        if cfg.turns is not None and cfg.turns < 1:
            raise UserError(f"--turns must be >= 1 (got {cfg.turns})")
        return await _conversation_specs(cfg, tok)
    if is_trace(cfg.dataset):
        return await _trace_specs(cfg, tok, cfg.num_prompts)
    if cfg.dataset:
        return await _file_specs(cfg, tok)
    return await _random_specs(cfg, tok, cfg.output_len or DEFAULT_OUTPUT_LEN)


async def build_trace(cfg: WorkloadConfig, tok: Tokenizer | None) -> list[RequestSpec]:
    """Every request of the trace --dataset (the trace decides the count), each with its timestamp (`at`)."""
    if cfg.prompt_format not in ("text", "ids"):
        raise UserError("--prompt-format must be text or ids")
    if cfg.prompt_format == "ids" and cfg.backend == "chat":
        raise UserError("--prompt-format ids needs --backend completions (chat messages are text)")
    return await _trace_specs(cfg, tok, None)
