"""The FastAPI app: OpenAI's completion endpoints over an engine loop (the engine in a thread of this process, or
in a process of its own), plus models, health, metrics and the engine's configuration (``/dspark/engine``, which
an A/B over HTTP reads).

A handler tokenizes its prompt, checks it, submits it to the engine loop and awaits its events. Streamed
responses (server-sent events) send the text that became safe, taking every event already queued for the
request at once: one chunk per engine step while the handler keeps up, one chunk for several steps when it
lags. A client that goes away mid-stream has its request aborted (Starlette cancels the stream), and so
does a client of a plain response that disconnects while waiting. Every error is OpenAI's body,
``{"error": {"message", "type", "param", "code"}}``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import time
import uuid
from contextlib import aclosing, asynccontextmanager
from typing import AsyncIterator, Callable

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from dspark.config import ConfigError
from dspark.request import RequestOutput
from dspark.serving import prompts
from dspark.serving.config import ServerConfig
from dspark.serving.engine_loop import (Admitted, BaseEngineLoop, EngineLoop, EngineUnavailable, Failed, Finished,
                                        NewTokens, Refused, RequestHandle)
from dspark.serving.metrics import CONTENT_TYPE, ServerMetrics
from dspark.serving.protocol import (Acceptance, ApiError, AssistantMessage, ChatChoice, ChatChunkChoice,
                                     ChatCompletionChunk, ChatCompletionRequest, ChatCompletionResponse, ChatDelta,
                                     CompletionChoice, CompletionRequest, CompletionResponse, ContentChunks,
                                     GenerationRequest,
                                     ModelCard, ModelList, Usage, error_from_validation, unavailable)
from dspark.serving.prompt_workers import PromptWorkers
from dspark.serving.text_stream import StreamedText

log = logging.getLogger(__name__)


def usage_of(output: RequestOutput) -> Usage:
    prompt, completion = len(output.prompt_token_ids), len(output.token_ids)
    return Usage(prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion)


def acceptance_of(output: RequestOutput, block_size: int) -> Acceptance:
    steps = len(output.accept_lengths)
    drafts = steps if block_size else 0
    return Acceptance(num_steps=steps, accept_lengths=list(output.accept_lengths),
                      mean_accept_length=output.mean_accept_length if steps else None, num_drafts=drafts,
                      num_draft_tokens=drafts * block_size, num_accepted_tokens=sum(output.accept_lengths) - steps,
                      verify_lengths=list(output.verify_lens), per_position_accepted=list(output.pos_accepted),
                      per_position_reached=list(output.pos_reached))


def sse(payload) -> str:
    data = payload if isinstance(payload, str) else payload.model_dump_json()
    return f"data: {data}\n\n"


async def validated_body(request: Request, model: type[BaseModel]):
    """The request's JSON body as ``model``, validated by pydantic straight from the bytes; a RequestValidationError
    (the app's 400) when it is not one. The generation routes read their bodies this way rather than through
    FastAPI's body parameters, whose dependency machinery was one of the larger costs of admitting a request on the
    event loop; the OpenAPI schema names the model (``body_schema``)."""
    try:
        return model.model_validate_json(await request.body())
    except ValidationError as e:
        raise RequestValidationError([{**err, "loc": ("body", *err["loc"])} for err in e.errors(include_url=False)])


BODY_MODELS = (ChatCompletionRequest, CompletionRequest)


def body_schema(model: type[BaseModel]) -> dict:
    """``openapi_extra`` documenting a route's JSON body as ``model`` (one of BODY_MODELS, whose schemas
    ``body_components`` adds to the document)."""
    return {"requestBody": {"required": True, "content": {"application/json": {
        "schema": {"$ref": f"#/components/schemas/{model.__name__}"}}}}}


def body_components() -> dict:
    """The JSON schemas of BODY_MODELS and of the models they use, as OpenAPI components."""
    out: dict = {}
    for model in BODY_MODELS:
        schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
        out.update(schema.pop("$defs", {}))
        out[model.__name__] = schema
    return out


def failure_status(output: RequestOutput) -> ApiError:
    """The error of a request the engine ended with reason 'error' (a prompt its KV pool cannot hold)."""
    return ApiError(400, output.error or "the engine could not serve this request", code="request_failed")


async def wait_for_disconnect(request: Request) -> None:
    """Returns when the client of a plain (non-streamed) response goes away (its body is read by then)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


def create_app(engine, config: ServerConfig | None = None) -> FastAPI:
    """An app serving ``engine`` (which needs a tokenizer): an Engine, which the app's engine thread
    (EngineLoop) owns from startup to shutdown (the app's lifespan; nothing else may call it meanwhile), or an
    engine loop (``engine_process.EngineProcess``: the engine in a process of its own), which the lifespan
    starts and stops."""
    config = config or ServerConfig()
    engine_loop = engine if isinstance(engine, BaseEngineLoop) else EngineLoop(engine)
    if engine_loop.tokenizer is None:
        raise ConfigError("the server needs an engine with a tokenizer (text prompts and chat messages)")
    tokenizer = engine_loop.tokenizer
    engine_cfg = engine_loop.cfg
    model_name = config.served_model_name
    max_model_len = engine_cfg.max_model_len
    block_size = engine_loop.block_size
    metrics = ServerMetrics(model_name, multiprocess=config.api_servers > 1)  # /metrics: every API server's
    engine_loop.on_finish = metrics.record_finished
    started = int(time.time())
    prompt_workers = PromptWorkers(tokenizer, config.prompt_workers)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        await prompt_workers.start()
        engine_loop.start(asyncio.get_running_loop())
        log.info("serving %s, the engine %s (max_model_len %d, max_num_seqs %d, spec %s)", model_name,
                 engine_loop.where, max_model_len, engine_cfg.max_num_seqs, engine_cfg.spec)
        try:
            yield
        finally:
            await asyncio.to_thread(engine_loop.stop, config.graceful_shutdown_s + 30.0)
            prompt_workers.close()
            final = engine_loop.last_snapshot
            if final is not None:
                log.info("engine counters at shutdown: %s", json.dumps(
                    {k: v for k, v in final.counters.items() if isinstance(v, (int, float))}, sort_keys=True))

    app = FastAPI(title="dspark-bench", summary="OpenAI-compatible server over a DSpark speculative-decoding engine",
                  lifespan=lifespan)
    app.state.engine_loop = engine_loop
    app.state.metrics = metrics
    app.state.config = config

    def openapi() -> dict:  # FastAPI's document, with the bodies the generation routes validate themselves
        if app.openapi_schema is None:
            schema = FastAPI.openapi(app)
            schema.setdefault("components", {}).setdefault("schemas", {}).update(body_components())
        return app.openapi_schema

    app.openapi = openapi

    @app.exception_handler(ApiError)
    async def api_error(request: Request, exc: ApiError):
        return JSONResponse(exc.body(), status_code=exc.status)

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError):
        error = error_from_validation(list(exc.errors()))
        return JSONResponse(error.body(), status_code=error.status)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException):
        message = f"Invalid URL ({request.method} {request.url.path})" if exc.status_code in (404, 405) \
            else str(exc.detail)
        kind = "invalid_request_error" if exc.status_code < 500 else "server_error"
        body = ApiError(exc.status_code, message, type=kind, code=None).body()
        return JSONResponse(body, status_code=exc.status_code, headers=getattr(exc, "headers", None))

    @app.exception_handler(Exception)
    async def internal_error(request: Request, exc: Exception):
        log.exception("unhandled error in %s %s", request.method, request.url.path)
        body = ApiError(500, f"The server had an error while processing your request: {type(exc).__name__}",
                        type="server_error").body()
        return JSONResponse(body, status_code=500)

    def check_model(request: GenerationRequest) -> None:
        if request.model is not None and request.model != model_name:
            raise ApiError(404, f"The model `{request.model}` does not exist. This server serves `{model_name}`.",
                           param="model", code="model_not_found")

    async def admit(prompt_ids: list[int], params, stream: bool) -> RequestHandle:
        """Submit to the engine loop and wait until the engine took the request (or refused it: a 400)."""
        try:
            handle = engine_loop.submit(prompt_ids, params, stream)
        except EngineUnavailable as e:
            raise unavailable(str(e)) from None
        try:
            event = await engine_loop.next_event(handle)
        except asyncio.CancelledError:  # the handler was cancelled (a shutdown past its grace period)
            engine_loop.abort(handle)
            raise
        if isinstance(event, Refused):  # the engine's RequestError says why
            raise ApiError(400, event.message, param=None, code=None)
        if isinstance(event, Failed):
            raise unavailable(event.message)
        assert isinstance(event, Admitted), event
        return handle

    async def final_output(handle: RequestHandle, request: Request) -> RequestOutput:
        """The request's output; the request is aborted when its client disconnects first."""
        result = asyncio.ensure_future(engine_loop.next_event(handle))
        gone = asyncio.ensure_future(wait_for_disconnect(request))
        try:
            await asyncio.wait({result, gone}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            gone.cancel()
            if not result.done():
                result.cancel()
                engine_loop.abort(handle)
        if not result.done() or result.cancelled():  # the client is gone; nobody reads this
            raise ApiError(499, "the client closed the request", code="client_closed_request")
        event = result.result()
        if isinstance(event, Failed):
            raise ApiError(event.status, event.message, type="server_error")
        output = event.output
        if output.finish_reason == "error":
            raise failure_status(output)
        return output

    async def events_of(handle: RequestHandle, stops, every_step: bool
                        ) -> AsyncIterator[tuple[str, list[int], RequestOutput | None, str | None]]:
        """(text delta, the token ids it adds, final output or None, error or None) of a streamed request, as
        steps commit tokens: when text became safe to send, or (``every_step``) whenever tokens were committed.
        The events already queued are taken together (a handler that lags behind the engine sends the tokens of
        several steps in one chunk instead of falling further behind). Leaving early (the client went away)
        aborts the request."""
        text = StreamedText(tokenizer, stops)
        received = 0  # tokens handed out before the final output
        done = False
        try:
            while True:
                events = await engine_loop.next_events(handle)
                end = events[-1] if not isinstance(events[-1], NewTokens) else None  # a request's last event
                if isinstance(end, Finished):
                    done = True
                    output = end.output  # its text and ids include those of the NewTokens taken with it
                    if output.finish_reason == "error":
                        yield "", [], None, output.error or "the engine could not serve this request"
                    else:
                        yield text.finish(output.text), list(output.token_ids[received:]), output, None
                    return
                ids = [t for event in events if isinstance(event, NewTokens) for t in event.token_ids]
                if ids:
                    delta = text.add(ids)
                    if delta or every_step:
                        received += len(ids)
                        yield delta, ids, None, None
                if isinstance(end, Failed):
                    done = True
                    yield "", [], None, end.message
                    return
        finally:
            if not done:
                engine_loop.abort(handle)

    def streaming(chunks: Callable[[], AsyncIterator[str]]) -> StreamingResponse:
        return StreamingResponse(chunks(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

    def stream_error(message: str) -> str:
        return sse(json.dumps(ApiError(500, message, type="server_error").body()))

    # ---- routes ------------------------------------------------------------------------------
    @app.post("/v1/chat/completions", openapi_extra=body_schema(ChatCompletionRequest))
    async def chat_completions(request: Request):
        body = await validated_body(request, ChatCompletionRequest)
        check_model(body)
        body.refuse_unsupported()
        prompt_ids = await prompts.chat_prompt_ids(prompt_workers, body)
        params = prompts.sampling_params(body, len(prompt_ids), max_model_len, "messages", default_max_tokens=None)
        handle = await admit(prompt_ids, params, bool(body.stream))
        rid, created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())
        with_ids = bool(body.return_token_ids)
        if not body.stream:
            output = await final_output(handle, request)
            return ChatCompletionResponse(
                id=rid, created=created, model=model_name,
                choices=[ChatChoice(message=AssistantMessage(content=output.text), finish_reason=output.finish_reason,
                                    token_ids=list(output.token_ids) if with_ids else None)],
                usage=usage_of(output), acceptance=acceptance_of(output, block_size),
                prompt_token_ids=list(prompt_ids) if with_ids else None)
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        content = ContentChunks(chat=True, id=rid, created=created, model=model_name)

        def chunk(delta: ChatDelta, finish_reason=None, token_ids=None, **extra) -> str:
            return sse(ChatCompletionChunk(id=rid, created=created, model=model_name, choices=[
                ChatChunkChoice(delta=delta, finish_reason=finish_reason, token_ids=token_ids)], **extra))

        async def chunks() -> AsyncIterator[str]:
            yield chunk(ChatDelta(role="assistant", content=""), token_ids=[] if with_ids else None,
                        prompt_token_ids=list(prompt_ids) if with_ids else None)
            async with aclosing(events_of(handle, params.stop, with_ids)) as events:
                async for delta, ids, output, error in events:
                    if error is not None:
                        yield stream_error(error)
                        break
                    step_ids = ids if with_ids else None
                    if output is not None:
                        if delta or (with_ids and ids):
                            yield sse(content.render(delta, step_ids))
                        yield chunk(ChatDelta(), finish_reason=output.finish_reason,
                                    token_ids=[] if with_ids else None, acceptance=acceptance_of(output, block_size))
                        if include_usage:
                            yield sse(ChatCompletionChunk(id=rid, created=created, model=model_name, choices=[],
                                                          usage=usage_of(output)))
                    elif delta or with_ids:
                        yield sse(content.render(delta, step_ids))
            yield sse("[DONE]")

        return streaming(chunks)

    @app.post("/v1/completions", openapi_extra=body_schema(CompletionRequest))
    async def completions(request: Request):
        body = await validated_body(request, CompletionRequest)
        check_model(body)
        body.refuse_unsupported()
        prompt_ids = await prompts.completion_prompt_ids(prompt_workers, body)
        params = prompts.sampling_params(body, len(prompt_ids), max_model_len, "prompt",
                                         default_max_tokens=prompts.COMPLETIONS_DEFAULT_MAX_TOKENS)
        handle = await admit(prompt_ids, params, bool(body.stream))
        rid, created = f"cmpl-{uuid.uuid4().hex}", int(time.time())
        with_ids = bool(body.return_token_ids)
        if not body.stream:
            output = await final_output(handle, request)
            return CompletionResponse(id=rid, created=created, model=model_name,
                                      choices=[CompletionChoice(text=output.text, finish_reason=output.finish_reason,
                                                                token_ids=list(output.token_ids) if with_ids else None)],
                                      usage=usage_of(output), acceptance=acceptance_of(output, block_size),
                                      prompt_token_ids=list(prompt_ids) if with_ids else None)
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        content = ContentChunks(chat=False, id=rid, created=created, model=model_name)

        def chunk(text: str, finish_reason=None, token_ids=None, **extra) -> str:
            return sse(CompletionResponse(id=rid, created=created, model=model_name, choices=[
                CompletionChoice(text=text, finish_reason=finish_reason, token_ids=token_ids)], **extra))

        async def chunks() -> AsyncIterator[str]:
            first = with_ids  # the first chunk carries the prompt's token ids
            async with aclosing(events_of(handle, params.stop, with_ids)) as events:
                async for delta, ids, output, error in events:
                    if error is not None:
                        yield stream_error(error)
                        break
                    extra = {"prompt_token_ids": list(prompt_ids)} if first else {}
                    first = False
                    if output is not None:
                        yield chunk(delta, finish_reason=output.finish_reason, token_ids=ids if with_ids else None,
                                    acceptance=acceptance_of(output, block_size), **extra)
                        if include_usage:
                            yield sse(CompletionResponse(id=rid, created=created, model=model_name, choices=[],
                                                         usage=usage_of(output)))
                    elif extra:
                        yield chunk(delta, token_ids=ids if with_ids else None, **extra)
                    elif delta or with_ids:
                        yield sse(content.render(delta, ids if with_ids else None))
            yield sse("[DONE]")

        return streaming(chunks)

    @app.get("/v1/models")
    async def models() -> ModelList:
        return ModelList(data=[ModelCard(id=model_name, created=started, max_model_len=max_model_len)])

    engine_description = {"served_model_name": model_name, "block_size": block_size,
                          "engine": dataclasses.asdict(engine_cfg), "models": engine_loop.models}

    @app.get("/dspark/engine")
    async def engine_configuration() -> dict:
        """The engine's configuration (dspark.config.EngineConfig), drafted block size and models (the checkpoints
        it runs, ``Engine.models()``): what an A/B over HTTP (runners.ab with an HTTP arm) needs to check that the
        arm's configured features ran, and to record what it ran."""
        return engine_description

    @app.get("/health")
    async def health():
        if not engine_loop.serving:
            raise unavailable(engine_loop.failure or "the server is shutting down")
        return Response(status_code=200)

    @app.get("/metrics")
    async def prometheus_metrics():
        snapshot = await engine_loop.snapshot()
        return Response(metrics.render(snapshot), media_type=CONTENT_TYPE)

    return app
