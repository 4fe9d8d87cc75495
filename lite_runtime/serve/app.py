"""The HTTP side of the server: OpenAI routes translated into engine requests, answers streamed
back as server-sent events or returned whole, Prometheus metrics. It never blocks the engine:
the engine thread hands tokens to the event loop, which detokenises and sends them (`runs`)."""
from __future__ import annotations

import asyncio
from typing import List

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse

from lite_runtime.serve.chat import encode_chat
from lite_runtime.serve.engine import QueueFull
from lite_runtime.serve.protocol import ChatRequest, CompletionRequest, SamplingFields, error_body
from lite_runtime.serve.runs import BadRequest, ServedModel, start_run
from lite_runtime.serve.tgi import add_tgi_routes


def create_app(served: ServedModel) -> FastAPI:
    app = FastAPI(title="MindSpore Lite LLM server")

    @app.exception_handler(RequestValidationError)
    async def invalid(_request, exc: RequestValidationError):
        first = exc.errors()[0]
        field = ".".join(str(p) for p in first["loc"] if p != "body")
        value = f" (got {first['input']!r})" if "input" in first and not isinstance(first["input"], dict) else ""
        return JSONResponse(error_body(f"{field}: {first['msg']}{value}", field or None), status_code=400)

    @app.exception_handler(BadRequest)
    async def bad(_request, exc: BadRequest):
        return JSONResponse(error_body(str(exc), exc.param, code=exc.code), status_code=exc.status)

    @app.get("/health")
    async def health():
        return {"status": "ok", "running": served.engine.busy_rows(), "waiting": len(served.engine.waiting)}

    @app.get("/v1/models")
    async def models():
        names = [served.name] + sorted(served.adapters)
        return {"object": "list", "data": [{"id": n, "object": "model", "owned_by": "lite_runtime",
                                            "root": served.name} for n in names]}

    @app.get("/metrics")
    async def metrics():
        return PlainTextResponse(served.metrics.render(), media_type=served.metrics.content_type)

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request):
        if isinstance(body.prompt, str):
            prompt_ids = served.tokenizer.encode(body.prompt, add_special_tokens=True)
        else:
            prompt_ids = list(body.prompt)
            bad = [t for t in prompt_ids if not 0 <= t < served.vocab_size]
            if bad:
                raise BadRequest(f"prompt: token id {bad[0]} is outside the vocabulary [0, {served.vocab_size})",
                                  "prompt")
        return await _answer(served, body, prompt_ids, request, chat=False)

    @app.post("/v1/chat/completions")
    async def chat(body: ChatRequest, request: Request):
        text = served.chat.render([m.model_dump() for m in body.messages])
        prompt_ids = encode_chat(served.tokenizer, text)
        return await _answer(served, body, prompt_ids, request, chat=True)

    async def _answer(served: ServedModel, body: SamplingFields, prompt_ids: List[int], request: Request, chat: bool):
        try:
            run = start_run(served, body, prompt_ids, chat)
        except QueueFull as e:
            return JSONResponse(error_body(str(e), None, "server_busy"), status_code=429)
        if body.stream:
            return StreamingResponse(run.events(request), media_type="text/event-stream")
        try:
            await run.done()
        except asyncio.CancelledError:
            run.cancel()
            raise
        return run.whole()

    add_tgi_routes(app, served)
    return app
