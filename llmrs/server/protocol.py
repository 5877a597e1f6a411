"""Request schemas of the OpenAI API subset we serve (pydantic), their translation to SamplingParams, and the
response schemas the OpenAPI document declares.

Every request model forbids unknown fields (a parameter we do not implement is a 400 naming it, never silently
ignored) and is strict: no coercion, so `"stream": "yes"` or a `false` token id is a 400, while an integer is still a
number (`"temperature": 1`). Values are checked by `SamplingParams.validate()` (one source of truth with the
engine); the JSON schema of each field states the same bounds (`WithJsonSchema`), so the published OpenAPI document
says what the server accepts. Bounds that only the running server knows (vocabulary, context, --max-seqs-per-request)
are marked with LIMIT and filled in by `llmrs.server.openapi`.
Responses are plain dicts built in `routes.py` (cheaper per streamed token than pydantic models); the response
models here only document them.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, WithJsonSchema, field_validator

from llmrs.engine.sampling import SamplingParams

MAX_LOGPROBS = 20
INT64 = (-(2**63), 2**63 - 1)  # vLLM's range for seed
INT32_MAX = 2**31 - 1
LIMIT = "x-llmrs-limit"  # a bound llmrs.server.openapi fills in: of the running server ("token_id", "detokenize_id",
#                          "token_key", "max_tokens", "n", "prompts"), or "int64"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)


def _nullable(kind: str, **schema: Any) -> WithJsonSchema:
    """The JSON schema of an optional scalar field: `kind` or null, with its bounds."""
    return WithJsonSchema({"type": [kind, "null"], **schema})


def _no_default(schema: dict[str, Any]) -> None:
    """A field whose default (None: left out) is not one of its values: no `default` in its schema."""
    schema.pop("default", None)


def _integral(v: Any) -> Any:
    """An integer-valued float as the int it is (JSON has one number type: 34382.0 is the integer 34382, as JSON
    Schema's "integer" says); anything else as sent, for the strict int check (no bool, no string, no 1.5)."""
    return int(v) if isinstance(v, float) and v.is_integer() else v


Int = Annotated[int, BeforeValidator(_integral)]
TOKEN_ID_SCHEMA = {"type": "integer", "minimum": 0, LIMIT: "token_id"}
TokenId = Annotated[Int, WithJsonSchema(TOKEN_ID_SCHEMA)]
NonEmpty = Annotated[str, WithJsonSchema({"type": "string", "minLength": 1})]


class StreamOptions(_Strict):
    include_usage: bool = False
    continuous_usage_stats: bool = False  # vLLM's: every chunk carries usage (its choice's tokens so far)


class ResponseFormat(_Strict):
    type: Annotated[str, WithJsonSchema({"type": "string", "enum": ["text"]})]  # (a 400 names the others)
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
    max_tokens: Annotated[Int | None, _nullable("integer", minimum=1, **{LIMIT: "max_tokens"})] = None
    # the ranges of SamplingParams.validate (vLLM's, temperature as OpenAI's)
    temperature: Annotated[float | None, _nullable("number", minimum=0, maximum=2)] = None
    top_p: Annotated[float | None, _nullable("number", exclusiveMinimum=0, maximum=1)] = None
    top_k: Annotated[Int | None, _nullable("integer", minimum=-1, maximum=INT32_MAX)] = None  # -1, 0: off
    min_p: Annotated[float | None, _nullable("number", minimum=0, maximum=1)] = None
    n: Annotated[Int | None, _nullable("integer", minimum=1, **{LIMIT: "n"})] = None
    stop: Annotated[str | list[str] | None, WithJsonSchema({"anyOf": [
        {"type": "string", "minLength": 1}, {"type": "array", "items": {"type": "string", "minLength": 1}},
        {"type": "null"}]})] = None
    stop_token_ids: list[TokenId] | None = None
    # (its bounds filled in after FastAPI's OpenAPI models, which hold numbers as floats: 2**63 - 1 would round up)
    seed: Annotated[Int | None, _nullable("integer", **{LIMIT: "int64"})] = None
    presence_penalty: Annotated[float | None, _nullable("number", minimum=-2, maximum=2)] = None
    frequency_penalty: Annotated[float | None, _nullable("number", minimum=-2, maximum=2)] = None
    repetition_penalty: Annotated[float | None, _nullable("number", minimum=0.01, maximum=100)] = None
    ignore_eos: bool | None = None
    min_tokens: Annotated[Int | None, _nullable("integer", minimum=0, **{LIMIT: "max_tokens"})] = None
    skip_special_tokens: bool | None = None
    user: str | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    response_format: ResponseFormat | None = None  # {"type": "text"}: the default, accepted as a no-op
    # {"token id": bias in [-100, 100]}, JSON's string keys (decimal digits only)
    logit_bias: Annotated[dict[str, float] | None, WithJsonSchema({
        "type": ["object", "null"], "propertyNames": {"type": "string", LIMIT: "token_key"},
        "additionalProperties": {"type": "number", "minimum": -100, "maximum": 100}})] = None

    @field_validator("logit_bias")
    @classmethod
    def _logit_bias(cls, v: dict[str, float] | None) -> dict[int, float] | None:
        if v is None:
            return None
        if not all(k.isascii() and k.isdigit() for k in v):  # (int() would also take " 5", "+5", "5_0")
            raise ValueError("keys must be token ids (integers as strings, e.g. {\"50256\": -100})")
        return {int(k): b for k, b in v.items()}

    @field_validator("seed")
    @classmethod
    def _seed(cls, v: int | None) -> int | None:
        if v is not None and not INT64[0] <= v <= INT64[1]:
            raise ValueError("seed must fit in a signed 64-bit integer")
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


def _token_lists(limit: str) -> dict[str, Any]:
    return {"type": "array", "minItems": 1, LIMIT: limit,
            "items": {"type": "array", "minItems": 1, "items": TOKEN_ID_SCHEMA}}


PROMPT_SCHEMA = {"anyOf": [
    {"type": "string", "minLength": 1},
    {"type": "array", "minItems": 1, LIMIT: "prompts", "items": {"type": "string", "minLength": 1}},
    {"type": "array", "minItems": 1, "items": TOKEN_ID_SCHEMA},
    _token_lists("prompts"),
]}


class CompletionRequest(_SamplingRequest):
    # str | list[str] | list[int] | list[list[int]], checked below (one prompt, or one per engine request)
    prompt: Annotated[Any, WithJsonSchema(PROMPT_SCHEMA)] = Field(...)
    echo: bool | None = None
    logprobs: Annotated[Int | None, _nullable("integer", minimum=0, maximum=MAX_LOGPROBS)] = None

    @field_validator("prompt")
    @classmethod
    def _prompt(cls, v: Any) -> Any:
        def ids(x: Any) -> bool:
            return isinstance(x, list) and bool(x) and all(isinstance(t, int) and not isinstance(t, bool) for t in x)

        if isinstance(v, list):  # token ids sent as integer-valued floats (1.0) are those ids
            v = [[_integral(t) for t in x] if isinstance(x, list) else _integral(x) for x in v]
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
    max_completion_tokens: Annotated[Int | None, _nullable("integer", minimum=1, **{LIMIT: "max_tokens"})] = None
    logprobs: bool | None = None
    top_logprobs: Annotated[Int | None, _nullable("integer", minimum=0, maximum=MAX_LOGPROBS)] = None
    add_generation_prompt: bool | None = None
    # tool calling is not implemented: no tools, or tool_choice "none" (the tools are then not shown to the model,
    # as vLLM does by default), is accepted; anything that could call a tool is a 400
    tools: list[dict[str, Any]] | None = None
    tool_choice: Annotated[str | dict[str, Any] | None,
                           WithJsonSchema({"type": ["string", "null"], "enum": ["none", "auto", None]})] = None
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

    model_config = ConfigDict(json_schema_extra={"oneOf": [{"required": ["prompt"]}, {"required": ["messages"]}]})

    model: str | None = None
    # left out: None; an explicit null is not a value of either (a 400)
    prompt: str = Field(None, json_schema_extra=_no_default)  # type: ignore[assignment]
    messages: list[ChatMessage] = Field(None, json_schema_extra=_no_default)  # type: ignore[assignment]
    add_special_tokens: bool = True
    add_generation_prompt: bool = True


class DetokenizeRequest(_Strict):
    model: str | None = None
    tokens: list[Annotated[Int, WithJsonSchema({"type": "integer", "minimum": 0, LIMIT: "detokenize_id"})]]


# ---------------------------------------------------------------------- responses (documentation only)
class _Doc(BaseModel):
    model_config = ConfigDict(extra="allow")


class ErrorObject(_Doc):
    message: str
    type: str
    param: str | None
    code: str | None


class ErrorResponse(_Doc):
    """OpenAI's error shape: every 4xx / 5xx the server answers."""

    model_config = ConfigDict(extra="forbid")
    error: ErrorObject


class Usage(_Doc):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class CompletionLogprobs(_Doc):
    tokens: list[str]
    token_logprobs: list[float | None]
    top_logprobs: list[dict[str, float]]
    text_offset: list[int]


class CompletionChoice(_Doc):
    index: int
    text: str
    logprobs: CompletionLogprobs | None
    finish_reason: str | None


class CompletionResponse(_Doc):
    id: str
    object: Literal["text_completion"]
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage


class TopLogprob(_Doc):
    token: str
    logprob: float | None
    bytes: list[int]


class TokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob]


class ChatLogprobs(_Doc):
    content: list[TokenLogprob]


class AssistantMessage(_Doc):
    role: Literal["assistant"]
    content: str


class ChatChoice(_Doc):
    index: int
    message: AssistantMessage
    logprobs: ChatLogprobs | None
    finish_reason: str | None


class ChatCompletionResponse(_Doc):
    id: str
    object: Literal["chat.completion"]
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage


class CompletionChunkChoice(_Doc):
    index: int
    text: str
    logprobs: CompletionLogprobs | None
    finish_reason: str | None


class CompletionChunk(_Doc):
    """One streamed event's JSON (`data: {...}`) of /v1/completions; with stream_options.include_usage, `usage`
    (null but in the last event, whose `choices` is empty; continuous_usage_stats: in every event)."""

    id: str
    object: Literal["text_completion"]
    created: int
    model: str
    choices: list[CompletionChunkChoice]
    usage: Usage | None = None


class Delta(_Doc):
    role: Literal["assistant"] = None  # type: ignore[assignment]  # (the first event of each choice)
    content: str = None  # type: ignore[assignment]


class ChatChunkChoice(_Doc):
    index: int
    delta: Delta
    logprobs: ChatLogprobs | None
    finish_reason: str | None


class ChatCompletionChunk(_Doc):
    """One streamed event's JSON (`data: {...}`) of /v1/chat/completions; `usage` as in CompletionChunk."""

    id: str
    object: Literal["chat.completion.chunk"]
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: Usage | None = None


STREAM_MODELS = (CompletionChunk, ChatCompletionChunk, ErrorResponse)  # in the document's components


class ModelCard(_Doc):
    id: str
    object: Literal["model"]
    created: int
    owned_by: str
    root: str
    parent: str | None
    max_model_len: int


class ModelList(_Doc):
    object: Literal["list"]
    data: list[ModelCard]


class VersionResponse(_Doc):
    version: str


class HealthResponse(_Doc):
    status: Literal["ok"]


class TokenizeResponse(_Doc):
    count: int
    max_model_len: int
    tokens: list[int]


class DetokenizeResponse(_Doc):
    prompt: str
