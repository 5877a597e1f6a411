"""Tokenizer (HF `tokenizers`), chat templates (jinja2, rendered the way transformers does) and the
incremental detokenizer used for streaming.

Two sources end in the same `Tokenizer`:
- a Hugging Face directory: tokenizer.json + tokenizer_config.json (chat template, special tokens);
- a GGUF file: vocabulary, merges and token types under `tokenizer.ggml.*` rebuilt into a byte-level BPE
  (the GPT-2 family, which covers SmolLM2, Llama 3 and Qwen2 GGUFs) or, for llama.cpp's "llama" vocabulary
  (Llama 2, Mistral, TinyLlama), a sentencepiece BPE with byte fallback; chat template from
  `tokenizer.chat_template`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from llmrs.errors import UserError

# llama.cpp pre-tokenizer names -> split regex (the regexes the vocabularies were trained with)
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_PRE_SPLITS = {"llama-bpe": _LLAMA3_SPLIT, "llama3": _LLAMA3_SPLIT, "qwen2": _QWEN2_SPLIT}
_CONTROL = 3
_USER_DEFINED = 4


@dataclass(slots=True)
class Tokenizer:
    tk: Any  # tokenizers.Tokenizer
    chat_template: str | None = None
    bos_token: str | None = None
    eos_token: str | None = None
    bos_token_id: int | None = None
    eos_token_id: int | None = None
    special_tokens: dict[str, str] = field(default_factory=dict)
    _token_bytes: dict[bool, "TokenBytes | None"] = field(default_factory=dict, repr=False, compare=False)

    # ------------------------------------------------------------------ basics
    @property
    def vocab_size(self) -> int:
        return self.tk.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        # encode_batch_fast (tokenizers >= 0.20; pyproject asks >= 0.21) skips the character offsets `encode` tracks
        # and nobody here reads: the same ids in about half the time (a 256-token prompt: 0.19 vs 0.38 ms on a
        # 2-core VM), on the server's event loop for every request (tests/model/test_tokenizer.py checks the two agree)
        try:
            return self.tk.encode_batch_fast([text], add_special_tokens=add_special_tokens)[0].ids
        except TypeError:
            # tokenizers refuses a str it cannot convert to UTF-8: a lone UTF-16 surrogate ("\ud800" in JSON, or
            # invalid UTF-8 bytes that Python decoded with surrogateescape). A client's mistake, not a bug.
            bad = next((i for i, c in enumerate(text) if "\ud800" <= c <= "\udfff"), None) if isinstance(text, str) \
                else None
            if bad is None:
                raise
            raise UserError(f"the text is not valid Unicode: a lone surrogate U+{ord(text[bad]):04X} at character "
                            f"{bad}") from None

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self.tk.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def token_id(self, token: str) -> int | None:
        return self.tk.token_to_id(token)

    def token_bytes(self, skip_special_tokens: bool = True) -> "TokenBytes | None":
        """Each token's bytes as `decode` joins them (byte-level BPE only; None for other decoders)."""
        tb = self._token_bytes.get(skip_special_tokens, False)
        if tb is False:
            tb = self._token_bytes[skip_special_tokens] = TokenBytes.build(self, skip_special_tokens)
        return tb

    # ------------------------------------------------------------------ chat
    def apply_chat_template(
        self, messages: list[dict[str, Any]], add_generation_prompt: bool = True, **kwargs: Any
    ) -> str:
        if not self.chat_template:
            raise UserError("this model has no chat template; use a raw prompt instead of --chat")
        return render_chat_template(
            self.chat_template,
            messages,
            add_generation_prompt=add_generation_prompt,
            bos_token=self.bos_token or "",
            eos_token=self.eos_token or "",
            **self.special_tokens,
            **kwargs,
        )

    def encode_chat(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True) -> list[int]:
        # The template already writes BOS where the model wants one: encode without adding specials.
        return self.encode(self.apply_chat_template(messages, add_generation_prompt), add_special_tokens=False)

    # ------------------------------------------------------------------ constructors
    @classmethod
    def from_hf_dir(cls, model_dir: Path) -> "Tokenizer":
        from tokenizers import Tokenizer as HFTokenizer

        path = model_dir / "tokenizer.json"
        if not path.exists():
            raise UserError(f"{model_dir}: no tokenizer.json")
        try:
            tk = HFTokenizer.from_file(str(path))
        except Exception as e:
            raise UserError(f"{path}: cannot load tokenizer ({e})") from None
        cfg: dict[str, Any] = {}
        cfg_path = model_dir / "tokenizer_config.json"
        if cfg_path.exists():
            cfg = json.loads(cfg_path.read_text())
        template = cfg.get("chat_template")
        jinja = model_dir / "chat_template.jinja"
        if template is None and jinja.exists():
            template = jinja.read_text()
        if isinstance(template, list):  # named templates: take the default one
            template = next((t["template"] for t in template if t.get("name") == "default"), None)

        def tok_str(key: str) -> str | None:
            v = cfg.get(key)
            return v.get("content") if isinstance(v, dict) else v

        bos, eos = tok_str("bos_token"), tok_str("eos_token")
        specials = {k: tok_str(k) for k in ("pad_token", "unk_token") if tok_str(k)}
        return cls(
            tk=tk,
            chat_template=template,
            bos_token=bos,
            eos_token=eos,
            bos_token_id=tk.token_to_id(bos) if bos else None,
            eos_token_id=tk.token_to_id(eos) if eos else None,
            special_tokens=specials,
        )

    @classmethod
    def from_gguf(cls, gf: Any) -> "Tokenizer":
        from tokenizers import AddedToken, Regex, decoders, pre_tokenizers, processors
        from tokenizers import Tokenizer as HFTokenizer
        from tokenizers.models import BPE

        md = gf.metadata
        kind = md.get("tokenizer.ggml.model")
        if kind not in ("gpt2", "llama"):
            raise UserError(f"{gf.path}: GGUF tokenizer model {kind!r} is not supported (supported: gpt2 byte-level "
                            "BPE, llama sentencepiece BPE)")
        tokens = gf.string_array("tokenizer.ggml.tokens")
        types = gf.int_array("tokenizer.ggml.token_type")
        vocab = {t: i for i, t in enumerate(tokens)}
        bos_id = md.get("tokenizer.ggml.bos_token_id")
        eos_id = md.get("tokenizer.ggml.eos_token_id")
        add_bos = md.get("tokenizer.ggml.add_bos_token")
        if kind == "gpt2":
            merges = [tuple(m.split(" ", 1)) for m in gf.string_array("tokenizer.ggml.merges")]
            tk = HFTokenizer(BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False))
            split = _PRE_SPLITS.get(md.get("tokenizer.ggml.pre", ""))
            if split:
                tk.pre_tokenizer = pre_tokenizers.Sequence(
                    [pre_tokenizers.Split(Regex(split), behavior="isolated"),
                     pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
                )
            else:
                tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
            tk.decoder = decoders.ByteLevel()
            base_processors = [processors.ByteLevel(trim_offsets=False)]
            tk.post_processor = base_processors[0]
        else:
            tk = _sentencepiece_bpe(gf, tokens, vocab, md)
            base_processors = []
            if add_bos is None:  # llama.cpp adds BOS to a sentencepiece vocabulary that does not say otherwise
                add_bos = True
        specials = [AddedToken(t, special=True, normalized=False) for t, ty in zip(tokens, types) if ty == _CONTROL]
        tk.add_special_tokens(specials)
        user = [AddedToken(t, special=False, normalized=False) for t, ty in zip(tokens, types) if ty == _USER_DEFINED]
        if user:
            tk.add_tokens(user)
        if add_bos and bos_id is not None:
            tk.post_processor = processors.Sequence([
                *base_processors,
                processors.TemplateProcessing(
                    single=f"{tokens[bos_id]} $A", pair=f"{tokens[bos_id]} $A $B",
                    special_tokens=[(tokens[bos_id], int(bos_id))],
                ),
            ])
        return cls(
            tk=tk,
            chat_template=md.get("tokenizer.chat_template"),
            bos_token=tokens[bos_id] if bos_id is not None else None,
            eos_token=tokens[eos_id] if eos_id is not None else None,
            bos_token_id=int(bos_id) if bos_id is not None else None,
            eos_token_id=int(eos_id) if eos_id is not None else None,
        )


def _sentencepiece_bpe(gf: Any, tokens: list[str], vocab: dict[str, int], md: dict) -> Any:
    """llama.cpp's "llama" vocabulary (Llama 2, Mistral, TinyLlama GGUFs): sentencepiece BPE over pieces that spell
    a space as U+2581, merged best score first, unknown characters falling back to the <0xNN> byte tokens. The
    file holds no merges: every split of a piece into two pieces of the vocabulary is a merge ranked by the
    piece's score (ties: the piece's id, then the halves' ids), as transformers rebuilds them. A space is
    prepended to each text fragment (tokenizer.ggml.add_space_prefix, default on) and one stripped again when
    decoding."""
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import decoders, normalizers
    from tokenizers.models import BPE

    scores = gf.float_array("tokenizer.ggml.scores")
    if len(scores) != len(tokens):
        raise UserError(f"{gf.path}: tokenizer.ggml.scores has {len(scores)} entries for {len(tokens)} tokens")
    ranked: list[tuple[float, int, int, int, str, str]] = []
    for n, (piece, score) in enumerate(zip(tokens, scores)):
        for i in range(1, len(piece)):
            left, right = piece[:i], piece[i:]
            if left in vocab and right in vocab:
                ranked.append((-score, n, vocab[left], vocab[right], left, right))
    ranked.sort(key=lambda r: r[:4])
    unk_id = md.get("tokenizer.ggml.unknown_token_id")
    unk = tokens[int(unk_id)] if unk_id is not None else None
    tk = HFTokenizer(BPE(vocab=vocab, merges=[(r[4], r[5]) for r in ranked], unk_token=unk, fuse_unk=True,
                         byte_fallback=True))
    prefix = md.get("tokenizer.ggml.add_space_prefix", True)
    # as llama.cpp: a space in front of every text fragment (the first, and each after a special token), always
    # (also before a leading space), then spaces spelled U+2581; the tokenizers library runs the normalizer on
    # each fragment between added tokens
    steps_in = [normalizers.Prepend("\u2581")] if prefix else []
    tk.normalizer = normalizers.Sequence([*steps_in, normalizers.Replace(" ", "\u2581")])
    steps = [decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()]
    if prefix:
        steps.append(decoders.Strip(content=" ", left=1, right=0))
    tk.decoder = decoders.Sequence(steps)
    return tk


# ---------------------------------------------------------------------- chat templates
_ENV = None


def _jinja_env():
    """A sandboxed jinja2 environment configured as transformers configures it."""
    global _ENV
    if _ENV is None:
        from jinja2.ext import loopcontrols
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])

        def raise_exception(message: str) -> None:
            raise UserError(f"chat template error: {message}")

        def tojson(x: Any, ensure_ascii: bool = False, indent: Any = None, separators: Any = None,
                   sort_keys: bool = False) -> str:
            return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                              sort_keys=sort_keys)

        env.filters["tojson"] = tojson
        env.globals["raise_exception"] = raise_exception
        env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
        _ENV = env
    return _ENV


def render_chat_template(template: str, messages: list[dict[str, Any]], add_generation_prompt: bool = True,
                         **kwargs: Any) -> str:
    from jinja2 import TemplateError

    for m in messages:
        if not isinstance(m, dict) or "role" not in m:
            raise UserError("each chat message needs a 'role'")
    try:
        compiled = _jinja_env().from_string(template)
        return compiled.render(messages=messages, add_generation_prompt=add_generation_prompt, **kwargs)
    except TemplateError as e:
        raise UserError(f"chat template failed to render: {e}") from None


# ---------------------------------------------------------------------- streaming detokenizer
def _bytes_to_unicode() -> dict[str, int]:
    """GPT-2's byte <-> printable character table (what the ByteLevel pre-tokenizer / decoder use), inverted."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


class TokenBytes:
    """token id -> the bytes a byte-level decode contributes for it, filled lazily.

    A `tokenizers` ByteLevel decoder maps every character of every token through GPT-2's byte table (a token
    with a character outside it contributes its own UTF-8 bytes), joins the bytes of all tokens, and decodes
    the result as lossy UTF-8; skipped special tokens contribute nothing. So decode(ids) is
    b"".join(bytes(i) for i in ids).decode("utf-8", "replace") exactly, and the streaming detokenizer can
    decode one new token without re-decoding its window twice.
    NOTE: each id is checked against the tokenizer's own one-token decode the first time it is seen; one
    mismatch turns the table off (`ok` False) and every detokenizer goes back to `decode`.
    """

    __slots__ = ("tk", "skip", "specials", "cache", "ok", "_chars")

    def __init__(self, tk: Any, skip: bool, specials: set[int]):
        self.tk, self.skip, self.specials = tk, skip, specials
        self.cache: dict[int, bytes] = {}
        self.ok = True
        self._chars = _bytes_to_unicode()

    @classmethod
    def build(cls, tok: "Tokenizer", skip: bool) -> "TokenBytes | None":
        tk = tok.tk
        if type(tk.decoder).__name__ != "ByteLevel" or not hasattr(tk, "get_added_tokens_decoder"):
            return None
        specials = {i for i, t in tk.get_added_tokens_decoder().items() if t.special}
        return cls(tk, skip, specials)

    def get(self, i: int) -> bytes | None:
        b = self.cache.get(i)
        if b is None:
            b = self._compute(i)
        return b

    def _compute(self, i: int) -> bytes | None:
        if not self.ok:
            return None
        tok = self.tk.id_to_token(i)
        if tok is None or (self.skip and i in self.specials):
            b = b""
        else:
            chars = self._chars
            b = bytes(chars[c] for c in tok) if all(c in chars for c in tok) else tok.encode()
        if b.decode("utf-8", "replace") != self.tk.decode([i], skip_special_tokens=self.skip):
            self.ok = False
            return None
        self.cache[i] = b
        return b


class IncrementalDetokenizer:
    """Turns a growing list of token ids into text deltas.

    NOTE: decoding token by token breaks multi-byte characters (an emoji spans several byte-level tokens)
    and SentencePiece's leading-space rule. We decode a window that starts a few tokens back
    (`prefix_offset`) and only emit once the new text does not end in U+FFFD, the replacement character a
    half-decoded UTF-8 sequence produces. `finish()` flushes whatever is left, so no text is ever dropped:
    the concatenated deltas equal decode(prompt tail + ids) past decode(prompt tail): for a byte-level BPE that
    is the one-shot decode of the ids; for a sentencepiece vocabulary the first token keeps its leading space.

    NOTE: the fast path (byte-level BPE tokenizers, `TokenBytes`) gives exactly the same deltas: while the
    window's first part (ids[prefix_offset:read_offset]) is complete, valid UTF-8, decoding the whole window
    is decoding that part and then the new tokens' bytes on their own; so one small UTF-8 decode of the new
    tokens decides. Anything else (a character still open, invalid bytes) takes the two-decode path.
    """

    __slots__ = ("tok", "ids", "prefix_offset", "read_offset", "skip_special_tokens", "text", "_tb", "_clean")

    def __init__(self, tok: Tokenizer, prompt_ids: list[int] | None = None, skip_special_tokens: bool = True,
                 fast: bool = True):
        self.tok = tok
        # the prompt's last tokens open the first window: a sentencepiece decode strips the leading space of a
        # window's first token, so the first generated token needs a token before it to keep its own (" world"
        # after "Hello", as vLLM and llama.cpp's server return it); byte-level tokens decode the same either way
        self.ids: list[int] = list(prompt_ids or [])[-6:]
        self.prefix_offset = 0
        self.read_offset = len(self.ids)
        self.skip_special_tokens = skip_special_tokens
        self.text = ""
        self._tb = tok.token_bytes(skip_special_tokens) if fast else None
        self._clean = True  # ids[prefix_offset:read_offset] decode to complete, valid UTF-8 (empty: yes)
        if self._tb is not None and self.ids:
            self._clean = self._is_clean()

    def _decode(self, ids: list[int]) -> str:
        return self.tok.decode(ids, skip_special_tokens=self.skip_special_tokens)

    def add(self, token_id: int) -> str:
        self.ids.append(token_id)
        tb = self._tb
        if tb is not None and self._clean and tb.ok:
            if self.read_offset == len(self.ids) - 1:
                nb = tb.get(token_id)
            else:
                parts = [tb.get(i) for i in self.ids[self.read_offset :]]
                nb = None if None in parts else b"".join(parts)  # type: ignore[arg-type]
            if nb is not None:
                try:
                    new = nb.decode("utf-8")
                except UnicodeDecodeError:
                    pass  # an open character or invalid bytes: the general path below decides
                else:
                    if not new or new.endswith("\ufffd"):
                        return ""
                    self.prefix_offset = self.read_offset
                    self.read_offset = len(self.ids)
                    self.text += new
                    return new  # the new first part is these bytes: complete and valid, still clean
        prefix = self._decode(self.ids[self.prefix_offset : self.read_offset])
        full = self._decode(self.ids[self.prefix_offset :])
        if len(full) > len(prefix) and not full.endswith("\ufffd"):
            delta = full[len(prefix) :]
            self.prefix_offset = self.read_offset
            self.read_offset = len(self.ids)
            self.text += delta
            if tb is not None:
                self._clean = self._is_clean()
            return delta
        return ""

    def _is_clean(self) -> bool:
        parts = [self._tb.get(i) for i in self.ids[self.prefix_offset : self.read_offset]]  # type: ignore[union-attr]
        if None in parts:
            return False
        try:
            b"".join(parts).decode("utf-8")  # type: ignore[arg-type]
        except UnicodeDecodeError:
            return False
        return True

    def finish(self) -> str:
        prefix = self._decode(self.ids[self.prefix_offset : self.read_offset])
        full = self._decode(self.ids[self.prefix_offset :])
        delta = full[len(prefix) :] if len(full) > len(prefix) else ""
        self.prefix_offset = self.read_offset = len(self.ids)
        self.text += delta
        self._clean = True
        return delta
