"""The tokenizer the workload uses to build prompts of exact length: the server's own, else a local one.

Which one, in order (recorded in the results as `tokenizer`):
1. the server's tokenize and detokenize endpoints, in whichever shape it speaks (`SHAPES`, probed once at the start
   and named in the source string): exactly what the server will count, no files needed;
2. `--tokenizer`: a tokenizer.json, a Hugging Face model directory, a .gguf file or an embedded model name;
3. `--model-config`: the served model (the same kinds, or a config.json meaning its directory): its tokenizer;
4. none: text prompts of exact length are impossible, so random workloads need `--prompt-format ids`.
Encoding adds the special tokens the server adds to a completion prompt (e.g. BOS), so lengths match the server's
`usage.prompt_tokens`: the vLLM/SGLang and llama-cpp-python endpoints add them by default, llama-server's /tokenize
only when asked (`add_special`), a local tokenizer through its post-processor (GGUF: `tokenizer.ggml.add_bos_token`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import httpx

from llmrs.errors import UserError

ID_RANGE = (256, 32000)  # without a local vocabulary: ids every common tokenizer has as ordinary tokens
GGUF_MAGIC = b"GGUF"


@dataclass(frozen=True, slots=True)
class Shape:
    """One server's tokenize / detokenize endpoints: paths, request fields, the reply's text field."""

    name: str  # the engine family that speaks it
    label: str  # how the results name it ("server:" + label)
    tokenize: str
    detokenize: str
    text_field: str  # the detokenize reply's text
    text_key: str  # the tokenize request's text field
    extra: tuple[tuple[str, object], ...] = ()  # more tokenize request fields
    with_model: bool = True  # requests carry "model"
    probe_ids: bool = True  # /detokenize refuses ids outside the vocabulary with a 4xx (`probe_id_limit`)

    def tokenize_body(self, model: str, text: str) -> dict:
        body: dict = {self.text_key: text, **dict(self.extra)}
        if self.with_model:
            body["model"] = model
        return body

    def detokenize_body(self, model: str, ids: list[int]) -> dict:
        body: dict = {"tokens": [int(i) for i in ids]}
        if self.with_model:
            body["model"] = model
        return body


# vLLM and llmrs: {"model", "prompt"} -> {"tokens", "count", ...}; /detokenize -> {"prompt"}; special tokens added by
# default (add_special_tokens: true)
VLLM = Shape("vllm", "vLLM-style POST /tokenize {prompt}", "/tokenize", "/detokenize", "prompt", "prompt")
# SGLang: the same request, /detokenize answers {"text"}
SGLANG = Shape("sglang", "SGLang POST /tokenize {prompt}", "/tokenize", "/detokenize", "text", "prompt")
# llama.cpp's llama-server: {"content", "add_special"} -> {"tokens"}; /detokenize {"tokens"} -> {"content"}. Its
# /tokenize adds BOS only with add_special (default false), its completions always: ask for it. An id outside the
# vocabulary is a 500 there, not a 4xx: its vocabulary size comes from /v1/models' meta.n_vocab instead.
LLAMA_SERVER = Shape("llama.cpp", "llama.cpp POST /tokenize {content}", "/tokenize", "/detokenize", "content",
                     "content", extra=(("add_special", True),), with_model=False, probe_ids=False)
# llama-cpp-python: /extras/tokenize {"input", "model"?} -> {"tokens"} (BOS as its completions add it);
# /extras/detokenize {"tokens"} -> {"text"}, a 500 for bytes that are not whole UTF-8 characters; an id outside the
# vocabulary is not refused cleanly there (never probed)
LLAMA_CPP_PYTHON = Shape("llama-cpp-python", "llama-cpp-python POST /extras/tokenize", "/extras/tokenize",
                         "/extras/detokenize", "text", "input", probe_ids=False)
SHAPES = (VLLM, LLAMA_SERVER, LLAMA_CPP_PYTHON)  # probe order (SGLANG: VLLM's request, told apart by the reply)


class ServerTokenizer:
    """Tokenizes through the server's tokenize and detokenize endpoints, in its `shape`."""

    # None: /detokenize takes every id random prompts draw (ID_RANGE); else the first id it refuses (a
    # vocabulary smaller than that range: `probe_id_limit`)
    vocab_size: int | None = None

    def __init__(self, base_url: str, model: str, client: httpx.AsyncClient, shape: Shape = VLLM,
                 undecodable: set[int] | None = None) -> None:
        self.base_url, self.model, self.client, self.shape = base_url.rstrip("/"), model, client, shape
        # ids the server's detokenize refuses on their own (llama-cpp-python: a piece that is part of a UTF-8
        # character), left out of what is decoded; shared by every copy (`with_client`)
        self.undecodable = undecodable if undecodable is not None else set()
        self.source = f"server:{shape.label}"

    def with_client(self, client: httpx.AsyncClient) -> ServerTokenizer:
        """The same tokenizer (shape, endpoints, vocabulary limit) speaking through another client."""
        t = ServerTokenizer(self.base_url, self.model, client, self.shape, self.undecodable)
        t.vocab_size, t.source = self.vocab_size, self.source
        return t

    async def encode(self, text: str) -> list[int]:
        r = await self.client.post(f"{self.base_url}{self.shape.tokenize}",
                                   json=self.shape.tokenize_body(self.model, text))
        _check(r, self.shape.tokenize)
        return list(r.json()["tokens"])

    async def decode(self, ids: list[int]) -> str:
        ids = [int(i) for i in ids if int(i) not in self.undecodable]
        r = await self._detokenize(ids)
        if r.status_code >= 400 and len(ids) > 1:
            kept = await self._decodable(ids)
            if not kept:  # nothing decodes on its own: the server's failure, not the ids'
                _check(r, self.shape.detokenize)
            r = await self._detokenize(kept)
        _check(r, self.shape.detokenize)
        return r.json()[self.shape.text_field]

    async def _decodable(self, ids: list[int]) -> list[int]:
        """`ids` without those the server cannot detokenize on their own (remembered in `undecodable`), found by
        halving: ids that decode alone are whole UTF-8 text each, so what is left decodes together."""
        if len(ids) == 1:
            if (await self._detokenize(ids)).status_code < 400:
                return ids
            self.undecodable.add(ids[0])
            return []
        mid = len(ids) // 2
        out = []
        for half in (ids[:mid], ids[mid:]):
            out += half if (await self._detokenize(half)).status_code < 400 else await self._decodable(half)
        return out

    async def _detokenize(self, ids: list[int]) -> httpx.Response:
        return await self.client.post(f"{self.base_url}{self.shape.detokenize}",
                                      json=self.shape.detokenize_body(self.model, ids))

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
            _check(r, self.shape.detokenize)
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


KINDS = "a tokenizer.json, a Hugging Face model directory, a .gguf file or an embedded model name"


class LocalTokenizer:
    """A tokenizer built on this machine (llmrs.model.tokenizer): from a tokenizer.json, a Hugging Face directory
    (its tokenizer.json), a GGUF file's vocabulary or an embedded model's GGUF; `option` names the flag in errors,
    `origin` the source string's prefix."""

    def __init__(self, spec: str | Path, option: str = "--tokenizer", origin: str = "local") -> None:
        from llmrs.model.loader import EMBEDDED_MODELS, embedded_model_path
        from llmrs.model.tokenizer import Tokenizer as ModelTokenizer

        spec = str(spec)
        if spec in EMBEDDED_MODELS and not Path(spec).exists():
            p, what = embedded_model_path(spec), f"{spec} (embedded, GGUF)"
        else:
            p = Path(spec).expanduser()
            if not p.exists():
                known = ", ".join(EMBEDDED_MODELS)
                raise UserError(f"{option} {spec}: no such file or directory, and not an embedded model ({known}); "
                                f"give {KINDS}")
            if p.is_file() and p.name == "config.json":  # a model's config: its directory
                p = p.parent
            what = str(p)
        if p.is_dir():
            if not (p / "tokenizer.json").is_file():
                ggufs = sorted(p.glob("*.gguf"))
                hint = f" (for a GGUF, give the file: {ggufs[0]})" if ggufs else ""
                raise UserError(f"{option} {spec}: the directory has no tokenizer.json{hint}; give {KINDS}")
            built, self.kind = ModelTokenizer.from_hf_dir(p), "hf"
        elif _is_gguf(p):
            built, self.kind = _gguf_tokenizer(p, option), "gguf"
        else:
            built, self.kind = _json_tokenizer(p, option), "tokenizer.json"
        self.tok = built.tk  # the `tokenizers` Tokenizer (a GGUF's rebuilt one included)
        self.vocab_size = self.tok.get_vocab_size()
        self.special_ids = set(self.tok.get_added_tokens_decoder())
        self.source = f"{origin}:{what}"

    async def encode(self, text: str) -> list[int]:
        return self.tok.encode(text, add_special_tokens=True).ids

    async def decode(self, ids: list[int]) -> str:
        return self.tok.decode([int(i) for i in ids], skip_special_tokens=True)


def _is_gguf(p: Path) -> bool:
    if p.suffix == ".gguf":
        return True
    try:
        with open(p, "rb") as f:
            return f.read(4) == GGUF_MAGIC
    except OSError:
        return False


def _gguf_tokenizer(p: Path, option: str):
    from llmrs.model.tokenizer import Tokenizer as ModelTokenizer
    from llmrs.model.weights import GGUFFile

    try:
        gf = GGUFFile(p)
        return ModelTokenizer.from_gguf(gf)
    except UserError as e:
        raise UserError(f"{option} {p}: {e}") from None
    except Exception as e:  # noqa: BLE001 - a damaged or foreign file is the user's input
        raise UserError(f"{option} {p}: not a readable GGUF file ({type(e).__name__}: {e})") from None


def _json_tokenizer(p: Path, option: str):
    from tokenizers import Tokenizer as HFTokenizer

    from llmrs.model.tokenizer import Tokenizer as ModelTokenizer

    if p.name == "tokenizer.json":  # the directory's tokenizer_config.json (special tokens) comes with it
        return ModelTokenizer.from_hf_dir(p.parent)
    try:
        return ModelTokenizer(tk=HFTokenizer.from_file(str(p)))
    except Exception as e:  # noqa: BLE001 - any parse failure is the user's file
        raise UserError(f"{option} {p}: not a tokenizer.json ({str(e)[:120]}); give {KINDS}") from None


Tokenizer = ServerTokenizer | LocalTokenizer


@dataclass(slots=True)
class TokenizerChoice:
    tokenizer: Tokenizer | None
    source: str


async def _speaks(tok: ServerTokenizer) -> list[int] | None:
    """The ids of a short text if the server answers `tok.shape`'s tokenize and detokenize, else None."""
    try:
        ids = await tok.encode("hello world")
        if not ids or not all(isinstance(i, int) for i in ids):
            return None
        r = await tok._detokenize(ids)
        if r.status_code >= 400:
            return None
        reply = r.json()
        if not isinstance(reply, dict):
            return None
        if tok.shape is VLLM and "prompt" not in reply and isinstance(reply.get("text"), str):
            tok.shape, tok.source = SGLANG, f"server:{SGLANG.label}"
        if not isinstance(reply.get(tok.shape.text_field), str):
            return None
    except (httpx.HTTPError, UserError, KeyError, ValueError, TypeError, AttributeError):
        return None
    return ids


async def _n_vocab(base_url: str, client: httpx.AsyncClient) -> int | None:
    """llama-server's vocabulary size, from its /v1/models entry's meta.n_vocab; None where it is not said."""
    try:
        r = await client.get(f"{base_url}/v1/models")
        for m in r.json().get("data") or []:
            n = (m.get("meta") or {}).get("n_vocab")
            if isinstance(n, int) and n > 0:
                return n
    except (httpx.HTTPError, ValueError, AttributeError, TypeError):
        pass
    return None


async def probe_server_tokenizer(base_url: str, model: str, client: httpx.AsyncClient) -> ServerTokenizer | None:
    """The server's tokenizer in the first shape of SHAPES it answers, else None."""
    base_url = base_url.rstrip("/")
    for shape in SHAPES:
        tok = ServerTokenizer(base_url, model, client, shape)
        if await _speaks(tok) is None:
            continue
        if tok.shape.probe_ids:
            tok.vocab_size = await tok.probe_id_limit(ID_RANGE[1])
        elif tok.shape is LLAMA_SERVER:
            n = await _n_vocab(base_url, client)
            tok.vocab_size = n if n is not None and n < ID_RANGE[1] else None
        return tok
    return None


async def choose_tokenizer(base_url: str, model: str, client: httpx.AsyncClient, local_path: str | None,
                           model_config: str | None = None) -> TokenizerChoice:
    """Server first (it is the source of truth for lengths), then --tokenizer, then --model-config's, else none."""
    tok = await probe_server_tokenizer(base_url, model, client)
    if tok is not None:
        return TokenizerChoice(tok, tok.source)
    if local_path:
        lt = LocalTokenizer(local_path)
        return TokenizerChoice(lt, lt.source)
    if model_config:
        lt = LocalTokenizer(model_config, option="--model-config", origin="model-config")
        return TokenizerChoice(lt, lt.source)
    return TokenizerChoice(None, "none")
