"""Request schemas of the OpenAI API subset we serve (pydantic), and their translation to SamplingParams.

Every model forbids unknown fields: a parameter we do not implement is a 400 naming it, never silently ignored.
Values are checked by `SamplingParams.validate()` (one source of truth with the engine), shapes by pydantic.
Responses are plain dicts built in `serving.py` (cheaper per streamed token than pydantic models).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from llmrs.engine.sampling import SamplingParams

MAX_N = 128  # choices per request
MAX_LOGPROBS = 20


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


INT64 = (-(2**63), 2**63 - 1)  # vLLM's range for seed


class StreamOptions(_Strict):
    include_usage: bool = False
    continuous_usage_stats: bool = False  # vLLM's: every chunk carries usage (its choice's tokens so far)


class ResponseFormat(_Strict):
    type: str
    json_schema: Any = None

    @field_validator("type")
    @classmethod
    def _type(cls, v: str) -> str:
        if v != "text":
            raise ValueError(f"'{v}' is not supported (no guided decoding); only 'text'")
        return v


class _SamplingRequest(_Strict):
    """Fields shared by /v1/completions and /v1/chat/completions (OpenAI's, plus vLLM's sampling extras)."""

    model: str | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    n: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    seed: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    ignore_eos: bool | None = None
    min_tokens: int | None = None
    skip_special_tokens: bool | None = None
    user: str | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    response_format: ResponseFormat | None = None  # {"type": "text"}: the default, accepted as a no-op
    logit_bias: dict[str, float] | None = None  # {"token id": bias in [-100, 100]}, JSON's string keys

    @field_validator("logit_bias")
    @classmethod
    def _logit_bias(cls, v: dict[str, float] | None) -> dict[int, float] | None:
        if v is None:
            return None
        try:
            return {int(k): b for k, b in v.items()}
        except ValueError:
            raise ValueError("keys must be token ids (integers as strings, e.g. {\"50256\": -100})") from None

    @field_validator("seed")
    @classmethod
    def _seed(cls, v: int | None) -> int | None:
        if v is not None and not INT64[0] <= v <= INT64[1]:
            raise ValueError("seed must fit in a signed 64-bit integer")
        return v

    @field_validator("n")
    @classmethod
    def _n(cls, v: int | None) -> int | None:
        if v is not None and not 1 <= v <= MAX_N:
            raise ValueError(f"n must be in [1, {MAX_N}]")
        return v

    def sampling_params(self, max_tokens: int | None, logprobs: int | None) -> SamplingParams:
        stop = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])

        def get(value: Any, default: Any) -> Any:
            return default if value is None else value

        return SamplingParams(
            max_tokens=max_tokens,
            temperature=get(self.temperature, 1.0),
            top_p=get(self.top_p, 1.0),
            top_k=get(self.top_k, 0),
            min_p=get(self.min_p, 0.0),
            repetition_penalty=get(self.repetition_penalty, 1.0),
            presence_penalty=get(self.presence_penalty, 0.0),
            frequency_penalty=get(self.frequency_penalty, 0.0),
            seed=self.seed,
            stop=stop,
            stop_token_ids=list(self.stop_token_ids or []),
            ignore_eos=bool(self.ignore_eos),
            min_tokens=get(self.min_tokens, 0),
            logprobs=logprobs,
            skip_special_tokens=get(self.skip_special_tokens, True),
            n=get(self.n, 1),
            logit_bias=dict(self.logit_bias or {}),
        )

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    @property
    def continuous_usage(self) -> bool:
        """vLLM's continuous_usage_stats: usage in every chunk (with include_usage, as vLLM asks)."""
        return self.include_usage and bool(self.stream_options.continuous_usage_stats)


class CompletionRequest(_SamplingRequest):
    prompt: Any = Field(...)  # str | list[str] | list[int] | list[list[int]], checked below
    echo: bool | None = None
    logprobs: int | None = None

    @field_validator("prompt")
    @classmethod
    def _prompt(cls, v: Any) -> Any:
        def ids(x: Any) -> bool:
            return isinstance(x, list) and bool(x) and all(isinstance(t, int) and not isinstance(t, bool) for t in x)

        ok = (isinstance(v, str)
              or (isinstance(v, list) and bool(v) and all(isinstance(s, str) for s in v))
              or ids(v)
              or (isinstance(v, list) and bool(v) and all(ids(x) for x in v)))
        if not ok:
            raise ValueError("prompt must be a string, a list of strings, a list of token ids, "
                             "or a list of token-id lists (none of them empty)")
        return v

    @field_validator("logprobs")
    @classmethod
    def _logprobs(cls, v: int | None) -> int | None:
        if v is not None and not 0 <= v <= MAX_LOGPROBS:
            raise ValueError(f"logprobs must be in [0, {MAX_LOGPROBS}]")
        return v


class ContentPart(_Strict):
    type: Literal["text"]
    text: str


class ChatMessage(_Strict):
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[ContentPart] | None = None
    name: str | None = None

    def as_template_dict(self) -> dict[str, Any]:
        content = self.content
        if isinstance(content, list):
            content = "\n".join(p.text for p in content)  # vLLM's join of a message's text parts
        d: dict[str, Any] = {"role": "system" if self.role == "developer" else self.role, "content": content or ""}
        if self.name is not None:
            d["name"] = self.name
        return d


class ChatCompletionRequest(_SamplingRequest):
    messages: list[ChatMessage] = Field(..., min_length=1)
    max_completion_tokens: int | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None
    add_generation_prompt: bool | None = None
    # tool calling is not implemented: no tools, or tool_choice "none" (the tools are then not shown to the model,
    # as vLLM does by default), is accepted; anything that could call a tool is a 400
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None

    def tool_calling(self) -> bool:
        """Whether the request lets the model call a tool (tools given, tool_choice not "none"; "auto" or none
        without tools is nothing to call)."""
        if self.tool_choice == "none":
            return False
        return bool(self.tools) or self.tool_choice not in (None, "auto")

    @field_validator("top_logprobs")
    @classmethod
    def _top_logprobs(cls, v: int | None) -> int | None:
        if v is not None and not 0 <= v <= MAX_LOGPROBS:
            raise ValueError(f"top_logprobs must be in [0, {MAX_LOGPROBS}]")
        return v

    def template_messages(self) -> list[dict[str, Any]]:
        return [m.as_template_dict() for m in self.messages]


class TokenizeRequest(_Strict):
    """vLLM's /tokenize: {model?, prompt} or {model?, messages}."""

    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: bool = True
    add_generation_prompt: bool = True


class DetokenizeRequest(_Strict):
    model: str | None = None
    tokens: list[int]
