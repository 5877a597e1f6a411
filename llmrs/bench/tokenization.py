"""The tokenizer the workload uses to build prompts of exact length: the server's own, else a local file.

Which one, in order (recorded in the results as `tokenizer`):
1. the server's `POST /tokenize` and `POST /detokenize` (vLLM's and llmrs's endpoints): exactly what the server
   will count, no files needed;
2. a local `tokenizers` Tokenizer from `--tokenizer PATH` (a tokenizer.json, or a model directory holding one);
3. none: text prompts of exact length are impossible, so random workloads need `--prompt-format ids`.
Encoding adds the special tokens the server adds to a completion prompt (e.g. BOS), so lengths match
the server's `usage.prompt_tokens`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import httpx

from llmrs.errors import UserError

ID_RANGE = (256, 32000)  # without a local vocabulary: ids every common tokenizer has as ordinary tokens


class ServerTokenizer:
    """Tokenizes through the server's /tokenize and /detokenize endpoints."""

    # None: /detokenize takes every id random prompts draw (ID_RANGE); else the first id it refuses (a
    # vocabulary smaller than that range: `probe_id_limit`)
    vocab_size: int | None = None

    def __init__(self, base_url: str, model: str, client: httpx.AsyncClient) -> None:
        self.base_url, self.model, self.client = base_url.rstrip("/"), model, client
        self.source = f"server:{self.base_url}/tokenize"

    def with_client(self, client: httpx.AsyncClient) -> ServerTokenizer:
        """The same tokenizer (endpoints, vocabulary limit) speaking through another client."""
        t = ServerTokenizer(self.base_url, self.model, client)
        t.vocab_size, t.source = self.vocab_size, self.source
        return t

    async def encode(self, text: str) -> list[int]:
        r = await self.client.post(f"{self.base_url}/tokenize", json={"model": self.model, "prompt": text})
        _check(r, "/tokenize")
        return list(r.json()["tokens"])

    async def decode(self, ids: list[int]) -> str:
        r = await self._detokenize(ids)
        _check(r, "/detokenize")
        return r.json()["prompt"]

    async def _detokenize(self, ids: list[int]) -> httpx.Response:
        return await self.client.post(f"{self.base_url}/detokenize",
                                      json={"model": self.model, "tokens": [int(i) for i in ids]})

    async def probe_id_limit(self, top: int) -> int | None:
        """The first token id the server's /detokenize refuses (4xx), found by bisection below `top`, or None
        where it takes `top - 1` (every id a random prompt draws). A vocabulary of a few hundred tokens (a test
        model) is smaller than the range random prompts draw from; vLLM's and llmrs's servers refuse ids
        outside theirs."""
        async def takes(i: int) -> bool:
            r = await self._detokenize([i])
            if r.status_code < 400:
                return True
            if r.status_code < 500:
                return False
            _check(r, "/detokenize")
            return False

        if await takes(top - 1) or not await takes(0):
            return None
        lo, hi = 0, top - 1  # lo taken, hi refused
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if await takes(mid) else (lo, mid)
        return hi


def _check(r: httpx.Response, what: str) -> None:
    """A failed tokenizer call as one clear line (UserError), not a traceback."""
    if r.status_code >= 400:
        raise UserError(f"the server's {what} answered {r.status_code}: {r.text[:200]}")


class LocalTokenizer:
    """A Hugging Face `tokenizers` tokenizer.json read from disk."""

    def __init__(self, path: str | Path) -> None:
        from tokenizers import Tokenizer

        p = Path(path)
        if p.is_dir():
            p = p / "tokenizer.json"
        if not p.is_file():
            raise UserError(f"--tokenizer: no tokenizer.json at {path}")
        try:
            self.tok = Tokenizer.from_file(str(p))
        except Exception as e:  # noqa: BLE001 - any parse failure is the user's file
            raise UserError(f"--tokenizer: cannot read {p}: {e}") from e
        self.vocab_size = self.tok.get_vocab_size()
        self.special_ids = set(self.tok.get_added_tokens_decoder())
        self.source = f"local:{p}"

    async def encode(self, text: str) -> list[int]:
        return self.tok.encode(text, add_special_tokens=True).ids

    async def decode(self, ids: list[int]) -> str:
        return self.tok.decode([int(i) for i in ids], skip_special_tokens=True)


Tokenizer = ServerTokenizer | LocalTokenizer


@dataclass(slots=True)
class TokenizerChoice:
    tokenizer: Tokenizer | None
    source: str


async def probe_server_tokenizer(base_url: str, model: str, client: httpx.AsyncClient) -> ServerTokenizer | None:
    """The server's tokenizer if its /tokenize and /detokenize answer as vLLM's do, else None."""
    tok = ServerTokenizer(base_url, model, client)
    try:
        ids = await tok.encode("hello world")
        await tok.decode(ids)
    except (httpx.HTTPError, UserError, KeyError, ValueError, TypeError):
        return None
    if not ids:
        return None
    tok.vocab_size = await tok.probe_id_limit(ID_RANGE[1])
    return tok


async def choose_tokenizer(base_url: str, model: str, client: httpx.AsyncClient, local_path: str | None,
                           model_config: str | None = None) -> TokenizerChoice:
    """Server first (it is the source of truth for lengths), then --tokenizer PATH, else none."""
    tok = await probe_server_tokenizer(base_url, model, client)
    if tok is not None:
        return TokenizerChoice(tok, tok.source)
    if local_path:
        lt = LocalTokenizer(local_path)
        return TokenizerChoice(lt, lt.source)
    return TokenizerChoice(None, "none")
