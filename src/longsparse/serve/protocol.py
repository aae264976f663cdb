"""Request bodies of the OpenAI-compatible endpoints, and what they ask that this server cannot do.

Fields follow OpenAI's completions and chat completions APIs (and vLLM's ``ignore_eos`` extension). Fields this
server does not know are ignored, as vLLM's server does; known fields whose values it does not support (``n > 1``,
log probabilities, penalties, tools, ...) are refused by :func:`unsupported`.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

DEFAULT_COMPLETION_TOKENS = 16
"""``max_tokens`` of a completion request that gives none (OpenAI's default)."""


class OpenAIRequest(BaseModel):
    model_config = ConfigDict(extra="allow")


class StreamOptions(OpenAIRequest):
    include_usage: bool = False


class SamplingFields(OpenAIRequest):
    """What both endpoints share."""

    model: str | None = None
    temperature: float | None = None
    top_p: float | None = None
    n: int = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    seed: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    user: str | None = None
    ignore_eos: bool = False


class CompletionRequest(SamplingFields):
    prompt: str | list[str] | list[int] | list[list[int]]
    max_tokens: int | None = DEFAULT_COMPLETION_TOKENS
    echo: bool = False
    logprobs: int | None = None
    best_of: int | None = None
    suffix: str | None = None


class ContentPart(OpenAIRequest):
    type: str
    text: str | None = None


class ChatMessage(OpenAIRequest):
    role: Literal["system", "user", "assistant", "developer", "tool"]
    content: str | list[ContentPart] | None = None


class ChatCompletionRequest(SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = None
    tools: list[dict[str, Any]] | None = None
    response_format: dict[str, Any] | None = None


def unsupported(request: SamplingFields) -> tuple[str, str] | None:
    """``(parameter, message)`` for the first field whose value this server does not support, else None."""
    checks: list[tuple[str, bool, str]] = [
        ("n", request.n != 1, "only n=1 is supported"),
        ("stream_options", request.stream_options is not None and not request.stream,
         "stream_options needs stream=true"),
        ("presence_penalty", bool(request.presence_penalty), "presence_penalty is not supported (give 0 or omit it)"),
        ("frequency_penalty", bool(request.frequency_penalty),
         "frequency_penalty is not supported (give 0 or omit it)"),
        ("logit_bias", bool(request.logit_bias), "logit_bias is not supported"),
    ]  # fmt: skip
    if isinstance(request, CompletionRequest):
        checks += [
            ("echo", request.echo, "echo is not supported"),
            ("logprobs", request.logprobs is not None, "logprobs are not supported"),
            ("best_of", request.best_of not in (None, 1), "only best_of=1 is supported"),
            ("suffix", bool(request.suffix), "suffix is not supported"),
        ]
    else:
        checks += [
            ("logprobs", request.logprobs or request.top_logprobs is not None, "logprobs are not supported"),
            ("tools", bool(request.tools), "tools are not supported"),
            ("response_format", request.response_format not in (None, {"type": "text"}),
             "only response_format {'type': 'text'} is supported"),
        ]  # fmt: skip
        for i, message in enumerate(request.messages):
            parts = message.content if isinstance(message.content, list) else []
            if any(part.type != "text" or part.text is None for part in parts):
                return f"messages[{i}].content", "only text content parts are supported"
    for param, bad, message in checks:
        if bad:
            return param, message
    return None


def message_dicts(request: ChatCompletionRequest) -> list[dict[str, str]]:
    """The messages as the chat template takes them (text parts joined)."""
    out = []
    for message in request.messages:
        content = message.content
        if isinstance(content, list):
            content = "".join(part.text or "" for part in content)
        out.append({"role": message.role, "content": content or ""})
    return out
