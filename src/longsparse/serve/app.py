"""The OpenAI-compatible HTTP app (FastAPI) over an :class:`~longsparse.engine.async_engine.AsyncLLMEngine`.

Endpoints, as vLLM's server has them: ``GET /v1/models``, ``POST /v1/completions``, ``POST /v1/chat/completions``
(streamed as server-sent events ending in ``data: [DONE]`` when ``stream`` is set), ``GET /health`` and
``GET /metrics``. Errors are OpenAI error bodies — ``{"error": {"message", "type", "param", "code"}}`` — with status
400 for a request that cannot run (malformed JSON, a bad or unsupported value, a prompt over ``max_model_len``),
404 for a model this server does not serve, 503 when the queue is full or the engine has stopped. A client that goes
away before its answer is complete aborts its requests, which frees their cache slots.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse

from ..engine.api import SamplingParams
from ..engine.async_engine import AsyncLLMEngine, EngineDeadError
from ..engine.llm_engine import RequestOutput
from ..engine.scheduler import QueueFull
from .metrics import ServerMetrics
from .protocol import (
    DEFAULT_COMPLETION_TOKENS,
    ChatCompletionRequest,
    CompletionRequest,
    SamplingFields,
    message_dicts,
    unsupported,
)

FINISH_REASONS = {"eos": "stop", "stop": "stop", "length": "length", "abort": "abort"}
"""The engine's finish reasons as OpenAI's (an end-of-sequence token and a stop string are both ``"stop"``)."""
ERROR_TYPES = {400: "BadRequestError", 404: "NotFoundError", 500: "InternalServerError", 503: "ServiceUnavailableError"}
CLIENT_CLOSED = 499
"""The status logged for a request whose client went away before the answer (nobody receives it)."""


class APIError(Exception):
    """An error answered with an OpenAI error body."""

    def __init__(self, status: int, message: str, param: str | None = None):
        super().__init__(message)
        self.status, self.message, self.param = status, message, param

    def body(self) -> dict:
        kind = ERROR_TYPES.get(self.status, "BadRequestError")
        return {"error": {"message": self.message, "type": kind, "param": self.param, "code": self.status}}


@dataclass
class Choice:
    """One prompt's answer as it accumulates."""

    text: str = ""
    prompt_tokens: int = 0
    completion_tokens: int = 0
    finish_reason: str | None = None

    def add(self, out: RequestOutput) -> None:
        self.text += out.new_text
        self.prompt_tokens, self.completion_tokens = out.prompt_tokens, out.completion_tokens
        if out.finished:
            self.finish_reason = FINISH_REASONS[out.finish_reason]


def usage(choices: list[Choice]) -> dict:
    prompt = sum(c.prompt_tokens for c in choices)
    completion = sum(c.completion_tokens for c in choices)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def sse(data: dict | str) -> str:
    return f"data: {data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)}\n\n"


async def merged(streams: list[AsyncIterator[RequestOutput]]) -> AsyncIterator[tuple[int, RequestOutput]]:
    """``(index, output)`` of several requests' outputs as they come; closing it closes (aborts) every stream."""
    if len(streams) == 1:
        async with contextlib.aclosing(streams[0]) as stream:
            async for out in stream:
                yield 0, out
        return
    items: asyncio.Queue[tuple[int, RequestOutput | BaseException | None]] = asyncio.Queue()

    async def pump(index: int, stream: AsyncIterator[RequestOutput]) -> None:
        try:
            async with contextlib.aclosing(stream):
                async for out in stream:
                    items.put_nowait((index, out))
        except Exception as exc:  # noqa: BLE001 - re-raised by the consumer
            items.put_nowait((index, exc))
        finally:
            items.put_nowait((index, None))

    tasks = [asyncio.ensure_future(pump(i, s)) for i, s in enumerate(streams)]
    try:
        remaining = len(tasks)
        while remaining:
            index, item = await items.get()
            if item is None:
                remaining -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield index, item
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def _disconnected(request: Request) -> None:
    """Returns once the client has closed the connection."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


class OpenAIServer:
    """The app's handlers over ``engine``, serving it as ``model_name``."""

    def __init__(self, engine: AsyncLLMEngine, model_name: str):
        self.engine = engine
        self.model_name = model_name
        self.llm = engine.engine.llm
        self.max_model_len = engine.engine.config.max_model_len
        self.metrics = ServerMetrics(engine)
        self.created = int(time.time())

    def check_model(self, model: str | None) -> None:
        if model is not None and model != self.model_name:
            raise APIError(404, f"The model `{model}` does not exist: this server serves `{self.model_name}`", "model")

    def sampling_params(self, body: SamplingFields, max_tokens: int) -> SamplingParams:
        if max_tokens < 1:
            raise APIError(400, f"max_tokens must be at least 1, got {max_tokens}", "max_tokens")
        stops = (body.stop,) if isinstance(body.stop, str) else tuple(body.stop or ())
        temperature = 1.0 if body.temperature is None else body.temperature
        top_p = 1.0 if body.top_p is None else body.top_p
        try:
            return SamplingParams(max_tokens, float(temperature), float(top_p), stops, body.seed)
        except ValueError as exc:
            raise APIError(400, str(exc)) from None

    def encode(self, prompt: str | list[int], param: str) -> list[int]:
        try:
            return self.llm.encode(prompt)
        except ValueError as exc:
            raise APIError(400, str(exc), param) from None

    def start(self, prompts: list[list[int]], params: SamplingParams, base_id: str, ignore_eos: bool):
        """The requests' output streams (after checking that each can run now)."""
        for ids in prompts:
            try:
                self.engine.check(ids, params)
            except QueueFull as exc:
                raise APIError(503, str(exc)) from None
            except ValueError as exc:
                raise APIError(400, str(exc), "prompt") from None
        return [
            self.engine.generate(ids, params, f"{base_id}-{i}", ignore_eos=ignore_eos) for i, ids in enumerate(prompts)
        ]

    def check(self, body: SamplingFields) -> None:
        self.check_model(body.model)
        if problem := unsupported(body):
            raise APIError(400, problem[1], problem[0])
        if not self.engine.alive:
            raise APIError(503, f"the engine has stopped: {self.engine.error!r}")

    async def completions(self, body: CompletionRequest, raw: Request) -> Response:
        self.check(body)
        prompt = body.prompt
        batch = prompt if isinstance(prompt, list) and prompt and not isinstance(prompt[0], int) else [prompt]
        if not batch:
            raise APIError(400, "prompt must not be empty", "prompt")
        prompts = [self.encode(p, "prompt") for p in batch]
        max_tokens = body.max_tokens if body.max_tokens is not None else DEFAULT_COMPLETION_TOKENS
        params = self.sampling_params(body, max_tokens)
        request_id = f"cmpl-{uuid.uuid4().hex}"
        streams = self.start(prompts, params, request_id, body.ignore_eos)
        head = {"id": request_id, "object": "text_completion", "created": int(time.time()), "model": self.model_name}

        def chunk(index: int, out: RequestOutput) -> dict:
            finish = FINISH_REASONS[out.finish_reason] if out.finished else None
            choice = {"index": index, "text": out.new_text, "logprobs": None, "finish_reason": finish}
            return {**head, "choices": [choice]}

        if body.stream:
            include_usage = body.stream_options is not None and body.stream_options.include_usage
            return self.stream(streams, len(prompts), chunk, head, include_usage)
        choices = await self.collect(streams, len(prompts), raw)
        if choices is None:
            return Response(status_code=CLIENT_CLOSED)
        return JSONResponse({
            **head,
            "choices": [
                {"index": i, "text": c.text, "logprobs": None, "finish_reason": c.finish_reason}
                for i, c in enumerate(choices)
            ],
            "usage": usage(choices),
        })  # fmt: skip

    async def chat_completions(self, body: ChatCompletionRequest, raw: Request) -> Response:
        self.check(body)
        if self.llm.tokenizer is None:
            raise APIError(400, "this model has no tokenizer, so no chat template: use /v1/completions", "messages")
        try:
            ids = self.llm.tokenizer.chat_ids(message_dicts(body))
        except Exception as exc:  # noqa: BLE001 - a template error is the request's (e.g. roles it does not take)
            raise APIError(400, f"the chat template cannot render these messages: {exc}", "messages") from None
        max_tokens = body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
        if max_tokens is None:
            max_tokens = max(1, self.max_model_len - len(ids))
        params = self.sampling_params(body, max_tokens)
        request_id = f"chatcmpl-{uuid.uuid4().hex}"
        streams = self.start([self.encode(ids, "messages")], params, request_id, body.ignore_eos)
        head = {"id": request_id, "object": "chat.completion.chunk", "created": int(time.time()),
                "model": self.model_name}  # fmt: skip
        opened = False

        def chunk(index: int, out: RequestOutput) -> dict:
            nonlocal opened
            delta = {"content": out.new_text}
            if not opened:
                delta = {"role": "assistant", **delta}
                opened = True
            finish = FINISH_REASONS[out.finish_reason] if out.finished else None
            return {**head, "choices": [{"index": index, "delta": delta, "logprobs": None, "finish_reason": finish}]}

        if body.stream:
            include_usage = body.stream_options is not None and body.stream_options.include_usage
            return self.stream(streams, 1, chunk, head, include_usage)
        choices = await self.collect(streams, 1, raw)
        if choices is None:
            return Response(status_code=CLIENT_CLOSED)
        c = choices[0]
        message = {"role": "assistant", "content": c.text}
        return JSONResponse({
            **head, "object": "chat.completion",
            "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": c.finish_reason}],
            "usage": usage(choices),
        })  # fmt: skip

    async def collect(self, streams, count: int, raw: Request) -> list[Choice] | None:
        """Every request's whole answer; None if the client went away first (the requests are then aborted)."""
        arrival = time.monotonic()
        choices = [Choice() for _ in range(count)]

        async def run() -> None:
            first = True
            async for index, out in merged(streams):
                if first:
                    self.metrics.ttft.observe(time.monotonic() - arrival)
                    first = False
                choices[index].add(out)

        work = asyncio.ensure_future(run())
        watcher = asyncio.ensure_future(_disconnected(raw))
        try:
            await asyncio.wait({work, watcher}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (work, watcher):
                if not task.done():
                    task.cancel()
            await asyncio.gather(work, watcher, return_exceptions=True)
        if not work.done() or work.cancelled():
            return None
        if (error := work.exception()) is not None:
            raise error
        self.metrics.e2e.observe(time.monotonic() - arrival)
        return choices

    def stream(self, streams, count: int, chunk, head: dict, include_usage: bool) -> StreamingResponse:
        """Server-sent events: a chunk per output with text or a finish reason, the usage chunk if asked, then
        ``data: [DONE]``; an error after the stream began is sent as an error event before ``[DONE]``."""
        arrival = time.monotonic()

        async def events() -> AsyncIterator[str]:
            choices = [Choice() for _ in range(count)]
            first = True
            try:
                async for index, out in merged(streams):
                    if first:
                        self.metrics.ttft.observe(time.monotonic() - arrival)
                        first = False
                    choices[index].add(out)
                    if out.new_text or out.finished:
                        yield sse(chunk(index, out))
                self.metrics.e2e.observe(time.monotonic() - arrival)
                if include_usage:
                    yield sse({**head, "choices": [], "usage": usage(choices)})
            except Exception as exc:  # noqa: BLE001 - the status line has gone: the error travels as an event
                error = as_api_error(exc)
                self.metrics.errors.labels(str(error.status)).inc()
                yield sse(error.body())
            yield sse("[DONE]")

        return StreamingResponse(events(), media_type="text/event-stream")

    def models(self) -> dict:
        card = {
            "id": self.model_name,
            "object": "model",
            "created": self.created,
            "owned_by": "longsparse",
            "root": str(self.llm.source),
            "max_model_len": self.max_model_len,
        }
        return {"object": "list", "data": [card]}


def as_api_error(exc: BaseException) -> APIError:
    if isinstance(exc, APIError):
        return exc
    if isinstance(exc, QueueFull | EngineDeadError):
        return APIError(503, str(exc))
    if isinstance(exc, ValueError):
        return APIError(400, str(exc))
    return APIError(500, f"{type(exc).__name__}: {exc}")


def build_app(engine: AsyncLLMEngine, model_name: str) -> FastAPI:
    """The FastAPI app serving ``engine`` as ``model_name``; the engine thread starts with the app and stops with
    it."""

    @contextlib.asynccontextmanager
    async def lifespan(_app: FastAPI):
        engine.start()
        yield
        engine.shutdown()

    app = FastAPI(title="longsparse", lifespan=lifespan)
    server = OpenAIServer(engine, model_name)
    app.state.server = server

    def error_response(error: APIError) -> JSONResponse:
        server.metrics.errors.labels(str(error.status)).inc()
        return JSONResponse(error.body(), status_code=error.status)

    @app.exception_handler(APIError)
    async def api_error(_request: Request, exc: APIError) -> JSONResponse:
        return error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def invalid_request(_request: Request, exc: RequestValidationError) -> JSONResponse:
        problems = exc.errors()
        if any(p.get("type") == "json_invalid" for p in problems):
            detail = next(p for p in problems if p.get("type") == "json_invalid").get("ctx", {}).get("error", "")
            return error_response(APIError(400, f"the request body is not valid JSON: {detail}"))
        first = problems[0] if problems else {}
        where = ".".join(str(p) for p in first.get("loc", ()) if p != "body") or None
        message = "; ".join(f"{'.'.join(str(p) for p in e.get('loc', ()))}: {e.get('msg')}" for e in problems)
        return error_response(APIError(400, message or "invalid request", where))

    @app.exception_handler(Exception)
    async def internal_error(_request: Request, exc: Exception) -> JSONResponse:
        return error_response(as_api_error(exc))

    @app.get("/health")
    async def health() -> Response:
        return Response(status_code=200 if engine.alive else 503)

    @app.get("/metrics")
    async def metrics() -> Response:
        text, content_type = server.metrics.render()
        return Response(text, media_type=content_type)

    @app.get("/v1/models")
    async def models() -> dict:
        return server.models()

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, raw: Request) -> Response:
        return await server.completions(body, raw)

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionRequest, raw: Request) -> Response:
        return await server.chat_completions(body, raw)

    return app
