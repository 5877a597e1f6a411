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


class ServerTokenizer:
    """Tokenizes through the server's /tokenize and /detokenize endpoints."""

    vocab_size: int | None = None  # unknown: random ids are drawn from a range every common vocabulary covers

    def __init__(self, base_url: str, model: str, client: httpx.AsyncClient) -> None:
        self.base_url, self.model, self.client = base_url.rstrip("/"), model, client
        self.source = f"server:{self.base_url}/tokenize"

    async def encode(self, text: str) -> list[int]:
        r = await self.client.post(f"{self.base_url}/tokenize", json={"model": self.model, "prompt": text})
        r.raise_for_status()
        return list(r.json()["tokens"])

    async def decode(self, ids: list[int]) -> str:
        r = await self.client.post(f"{self.base_url}/detokenize", json={"model": self.model, "tokens": [int(i) for i in ids]})
        r.raise_for_status()
        return r.json()["prompt"]


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
    except (httpx.HTTPError, KeyError, ValueError, TypeError):
        return None
    return tok if ids else None


async def choose_tokenizer(base_url: str, model: str, client: httpx.AsyncClient, local_path: str | None) -> TokenizerChoice:
    """Server first (it is the source of truth for lengths), then --tokenizer PATH, else none."""
    tok = await probe_server_tokenizer(base_url, model, client)
    if tok is not None:
        return TokenizerChoice(tok, tok.source)
    if local_path:
        lt = LocalTokenizer(local_path)
        return TokenizerChoice(lt, lt.source)
    return TokenizerChoice(None, "none")
