"""The OpenAI-compatible HTTP API (FastAPI on uvicorn) over the scheduler.

Routes: POST /v1/completions and /v1/chat/completions (server-sent events with `stream: true`, `usage`
counts), GET /v1/models, GET /health, GET /metrics (Prometheus). Errors are OpenAI-shaped JSON
(`{"error": {"message", "type", "param", "code"}}`): 400 for a malformed body or a parameter out of
range (naming it), 404 for an unknown model, 429 / 503 with Retry-After when the queue is full or the
server is down. A client that goes away cancels its request: its row leaves the batch at the next step.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any, Literal

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field
from starlette.exceptions import HTTPException as StarletteHTTPException

from engine.sampling import Sampling
from engine.serve.scheduler import Params, Refused, Scheduler

MAX_STOPS = 4


class StreamOptions(BaseModel):
    include_usage: bool = False


class _Common(BaseModel):
    """Sampling and stopping parameters both endpoints take (unknown fields are ignored, as OpenAI's)."""

    model_config = ConfigDict(extra="ignore")
    model: str | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    top_k: int = Field(default=0, ge=-1)  # 0 or -1: no truncation (vLLM's -1 too)
    seed: int | None = Field(default=None, ge=0, le=2**63 - 1)
    stop: str | list[str] | None = None
    n: int = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logprobs: Any = None


class CompletionRequest(_Common):
    prompt: str | list[int] | list[str]


class ContentPart(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: Literal["text"]
    text: str


class Message(BaseModel):
    model_config = ConfigDict(extra="ignore")
    role: Literal["system", "user", "assistant", "developer", "tool"]
    content: str | list[ContentPart] | None = None

    def text(self) -> str:
        if self.content is None:
            return ""
        return self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)


class ChatRequest(_Common):
    messages: list[Message] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)


class ApiError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        param: str | None = None,
        code: str | None = None,
        retry_after: int = 0,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.retry_after = (
            status,
            message,
            param,
            code,
            retry_after,
        )


def error_response(
    status: int, message: str, param: str | None = None, code: str | None = None, retry_after: int = 0
) -> JSONResponse:
    kind = "invalid_request_error" if status < 500 else "server_error"
    if status == 429:
        kind = "rate_limit_error"
    headers = {"Retry-After": str(retry_after)} if retry_after else None
    body = {"error": {"message": message, "type": kind, "param": param, "code": code}}
    return JSONResponse(body, status_code=status, headers=headers)


class Server:
    """The model's text side (prompts, chat template, detokenizing) and the routes over a Scheduler."""

    def __init__(
        self,
        scheduler: Scheduler,
        name: str,
        default_max_tokens: int = 256,
        max_tokens_limit: int = 1 << 20,
        metrics: Any = None,
    ) -> None:
        self.scheduler = scheduler
        self.model = scheduler.engine.model
        self.tokenizer = self.model.tokenizer
        self.name = name
        self.default_max_tokens = default_max_tokens
        self.max_tokens_limit = max_tokens_limit
        self.metrics = metrics
        self.created = int(time.time())
        self.vocab = self.model.geometry.vocab_size

    # ---- prompts ----

    def chat_prompt(self, messages: list[Message]) -> list[int]:
        """The tokenizer's chat template when it has one; else the plain format (docs/serving.md): each
        message's text on its own line, and a newline after the last (the model continues from there)."""
        if getattr(self.tokenizer, "chat_template", None):
            text = self.tokenizer.apply_chat_template(
                [{"role": m.role, "content": m.text()} for m in messages],
                tokenize=False,
                add_generation_prompt=True,
            )
            return list(self.tokenizer.encode(text, add_special_tokens=False))
        return self.model.encode("\n".join(m.text() for m in messages) + "\n")

    def completion_prompt(self, prompt: str | list[int] | list[str]) -> list[int]:
        if isinstance(prompt, str):
            return self.model.encode(prompt)
        if prompt and all(isinstance(p, str) for p in prompt):
            if len(prompt) != 1:
                raise ApiError(
                    400, "one prompt per request (n=1): send a string or one list of token ids", "prompt"
                )
            return self.model.encode(str(prompt[0]))
        ids = [int(t) for t in prompt]
        if bad := [t for t in ids if not 0 <= t < self.vocab]:
            raise ApiError(
                400, f"prompt token {bad[0]} is outside the vocabulary (0..{self.vocab - 1})", "prompt"
            )
        return ids

    def params(self, body: _Common, max_tokens: int | None) -> Params:
        if body.n != 1:
            raise ApiError(400, f"n must be 1 (got {body.n}): one completion per request", "n")
        if body.presence_penalty or body.frequency_penalty:
            which = "presence_penalty" if body.presence_penalty else "frequency_penalty"
            raise ApiError(400, f"{which} is not supported (only 0)", which)
        if body.logprobs not in (None, False, 0):
            raise ApiError(400, "logprobs are not supported", "logprobs")
        max_tokens = max_tokens or self.default_max_tokens
        if max_tokens > self.max_tokens_limit:
            raise ApiError(
                400, f"max_tokens must be <= {self.max_tokens_limit} (got {max_tokens})", "max_tokens"
            )
        stops = [body.stop] if isinstance(body.stop, str) else list(body.stop or [])
        if len(stops) > MAX_STOPS:
            raise ApiError(400, f"stop takes at most {MAX_STOPS} strings (got {len(stops)})", "stop")
        sampling = None
        if body.temperature > 0:
            seed = body.seed if body.seed is not None else uuid.uuid4().int & (2**63 - 1)
            sampling = Sampling(body.temperature, max(body.top_k, 0), body.top_p, seed)
        return Params(max_tokens, sampling, tuple(s for s in stops if s))

    def text(self, ids: list[int]) -> str:
        return str(self.tokenizer.decode(ids, skip_special_tokens=True))

    # ---- running one request ----

    async def run(self, prompt: list[int], params: Params) -> tuple[Any, asyncio.Queue[Any]]:
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[Any] = asyncio.Queue()

        def emit(tokens: list[int] | None, reason: str | None) -> None:
            loop.call_soon_threadsafe(queue.put_nowait, (tokens, reason))

        try:
            req = self.scheduler.submit(prompt, params, emit)
        except Refused as exc:
            if self.metrics:
                self.metrics.refused.labels(str(exc.status)).inc()
            raise ApiError(exc.status, str(exc), exc.param, None, exc.retry_after) from None
        return req, queue

    def check_model(self, model: str | None) -> None:
        if model is not None and model != self.name:
            raise ApiError(
                404,
                f"the model {model!r} does not exist: this server serves {self.name!r}",
                "model",
                "model_not_found",
            )


class Deltas:
    """Text deltas from a growing token list, detokenized incrementally (vLLM's method: decode a few tokens
    before the new ones and keep what they add, so a response costs O(tokens), not O(tokens^2)); holds
    back a partial character and what might be the start of a stop string, and cuts the text at the first
    stop string."""

    def __init__(self, server: Server, stops: tuple[str, ...]) -> None:
        self.server, self.stops = server, stops
        self.tokens: list[int] = []
        self.text = ""  # all the text decoded so far
        self.sent = ""  # what was handed out (a prefix of text, cut at a stop string)
        self.prefix_offset = self.read_offset = 0
        self.hold = max((len(s) for s in stops), default=1) - 1
        self.stopped = False

    def add(self, tokens: list[int], final: bool) -> str:
        if self.stopped:
            return ""
        self.tokens += tokens
        prefix = self.server.text(self.tokens[self.prefix_offset : self.read_offset])
        full = self.server.text(self.tokens[self.prefix_offset :])
        if len(full) > len(prefix) and (final or not full.endswith("\ufffd")):
            self.text += full[len(prefix) :]
            self.prefix_offset, self.read_offset = self.read_offset, len(self.tokens)
        text, from_ = self.text, max(len(self.sent) - self.hold, 0)
        cut = min((i for s in self.stops if (i := text.find(s, from_)) >= 0), default=-1)
        if cut >= 0:
            text, final, self.stopped = text[:cut], True, True
        if not final:
            text = text[: max(len(text) - self.hold, 0)]
        if len(text) <= len(self.sent):
            return ""
        new, self.sent = text[len(self.sent) :], text
        return new


def finish_reason(reason: str) -> str:
    return "length" if reason == "max_new_tokens" else "stop"


def create_app(server: Server) -> FastAPI:
    app = FastAPI(title="kakeya serve", docs_url=None, redoc_url=None, openapi_url=None)

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, exc: ApiError) -> JSONResponse:
        return error_response(exc.status, exc.message, exc.param, exc.code, exc.retry_after)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        err = exc.errors()[0]
        loc = [str(p) for p in err.get("loc", ()) if p != "body"]
        if err.get("type") == "json_invalid":
            return error_response(400, f"malformed JSON body: {err.get('ctx', {}).get('error', err['msg'])}")
        # the field, not the union member pydantic tried (`stop.str`): the first part and list indices
        param = ".".join([loc[0], *[p for p in loc[1:] if p.isdigit()]]) if loc else None
        message = f"{param}: {err['msg']}" if param else str(err["msg"])
        return error_response(400, message, param)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        return error_response(exc.status_code, str(exc.detail))

    @app.exception_handler(Exception)
    async def _crash(request: Request, exc: Exception) -> JSONResponse:
        return error_response(500, f"internal error: {type(exc).__name__}: {exc}")

    @app.get("/health")
    async def health() -> JSONResponse:
        if server.scheduler.failed:
            return error_response(503, f"the scheduler failed: {server.scheduler.failed}", retry_after=5)
        return JSONResponse({"status": "ok"})

    @app.get("/metrics")
    async def metrics() -> Response:
        if server.metrics is None:
            return Response(b"", media_type="text/plain")
        return Response(server.metrics.render(), media_type="text/plain; version=0.0.4")

    @app.get("/v1/models")
    async def models() -> JSONResponse:
        card = {"id": server.name, "object": "model", "created": server.created, "owned_by": "kakeya"}
        return JSONResponse({"object": "list", "data": [card]})

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request) -> Response:
        server.check_model(body.model)
        prompt = server.completion_prompt(body.prompt)
        return await respond(request, body, prompt, server.params(body, body.max_tokens), chat=False)

    @app.post("/v1/chat/completions")
    async def chat(body: ChatRequest, request: Request) -> Response:
        server.check_model(body.model)
        prompt = server.chat_prompt(body.messages)
        params = server.params(body, body.max_completion_tokens or body.max_tokens)
        return await respond(request, body, prompt, params, chat=True)

    async def respond(
        request: Request, body: _Common, prompt: list[int], params: Params, chat: bool
    ) -> Response:
        req, queue = await server.run(prompt, params)
        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
        created = int(time.time())
        deltas = Deltas(server, params.stop)
        if body.stream:
            include_usage = bool(body.stream_options and body.stream_options.include_usage)
            return StreamingResponse(
                stream(request, req, queue, deltas, rid, created, chat, len(prompt), include_usage),
                media_type="text/event-stream",
                headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
            )
        reason = None
        try:
            while reason is None:
                try:
                    tokens, reason = await asyncio.wait_for(queue.get(), timeout=0.5)
                except TimeoutError:
                    if await request.is_disconnected():
                        server.scheduler.cancel(req)
                        return Response(status_code=499)
                    continue
                if tokens:
                    deltas.add(tokens, False)
        except asyncio.CancelledError:
            server.scheduler.cancel(req)
            raise
        if reason.startswith("error"):
            raise ApiError(500, reason)
        deltas.add([], True)
        usage = usage_of(len(prompt), len(deltas.tokens))
        if chat:
            choice: dict[str, Any] = {
                "index": 0,
                "message": {"role": "assistant", "content": deltas.sent},
                "finish_reason": finish_reason(reason),
                "logprobs": None,
            }
            obj = "chat.completion"
        else:
            choice = {
                "index": 0,
                "text": deltas.sent,
                "finish_reason": finish_reason(reason),
                "logprobs": None,
            }
            obj = "text_completion"
        return JSONResponse(
            {
                "id": rid,
                "object": obj,
                "created": created,
                "model": server.name,
                "choices": [choice],
                "usage": usage,
            }
        )

    async def stream(
        request: Request,
        req: Any,
        queue: asyncio.Queue[Any],
        deltas: Deltas,
        rid: str,
        created: int,
        chat: bool,
        prompt_tokens: int,
        include_usage: bool,
    ) -> AsyncIterator[bytes]:
        obj = "chat.completion.chunk" if chat else "text_completion"

        def chunk(text: str | None, reason: str | None, first: bool = False) -> bytes:
            if chat:
                delta: dict[str, Any] = (
                    {"role": "assistant", "content": ""}
                    if first
                    else ({} if text is None else {"content": text})
                )
                choice: dict[str, Any] = {
                    "index": 0,
                    "delta": delta,
                    "finish_reason": reason,
                    "logprobs": None,
                }
            else:
                choice = {"index": 0, "text": text or "", "finish_reason": reason, "logprobs": None}
            data = {"id": rid, "object": obj, "created": created, "model": server.name, "choices": [choice]}
            if include_usage:
                data["usage"] = None
            return sse(data)

        done = False
        try:
            if chat:
                yield chunk(None, None, first=True)
            reason = None
            while reason is None:
                tokens, reason = await queue.get()
                if reason is not None and reason.startswith("error"):
                    yield sse(
                        {"error": {"message": reason, "type": "server_error", "param": None, "code": None}}
                    )
                    done = True
                    return
                if text := deltas.add(tokens or [], reason is not None):
                    yield chunk(text, None)
            done = True
            yield chunk(None, finish_reason(reason))
            if include_usage:
                yield sse(
                    {
                        "id": rid,
                        "object": obj,
                        "created": created,
                        "model": server.name,
                        "choices": [],
                        "usage": usage_of(prompt_tokens, len(deltas.tokens)),
                    }
                )
            yield b"data: [DONE]\n\n"
        finally:
            if not done:  # the client went away (or the response was cancelled): the row leaves the batch
                server.scheduler.cancel(req)

    return app


def usage_of(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def sse(data: Any) -> bytes:
    return b"data: " + json.dumps(data, separators=(",", ":")).encode() + b"\n\n"
