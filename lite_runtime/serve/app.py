"""The HTTP side of the server: OpenAI routes translated into engine requests, answers streamed
back as server-sent events or returned whole, Prometheus metrics; vLLM's and llama.cpp server's
/tokenize and /detokenize. It never blocks the engine: the engine thread hands tokens to the event
loop, which detokenises and sends them (`runs`)."""
from __future__ import annotations

import time
from typing import List

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse

from lite_runtime.decode.engine import QueueFull
from lite_runtime.serve.chat_protocol import ChatRequest, TokenizeRequest
from lite_runtime.serve.protocol import CompletionRequest, DetokenizeRequest, SamplingFields, error_body
from lite_runtime.serve.runs import BadRequest, ServedModel, chat_prompt_ids, start_run
from lite_runtime.serve.tgi import add_tgi_routes


def create_app(served: ServedModel) -> FastAPI:
    app = FastAPI(title="MindSpore Lite LLM server")

    started = int(time.time())

    @app.exception_handler(RequestValidationError)
    async def invalid(_request, exc: RequestValidationError):
        first = exc.errors()[0]
        if first.get("type") == "json_invalid":      # its loc is ("body", the character where it failed)
            where = first["loc"][-1] if len(first["loc"]) > 1 else "?"
            why = (first.get("ctx") or {}).get("error", first["msg"])
            return JSONResponse(error_body(f"the request body is not valid JSON: {why} (at character {where})"),
                                status_code=400)
        field = ".".join(str(p) for p in first["loc"] if p != "body")
        value = ""
        if "input" in first and not isinstance(first["input"], dict):
            got = repr(first["input"])
            value = f" (got {got[:200]}{'...' if len(got) > 200 else ''})"
        return JSONResponse(error_body(f"{field}: {first['msg']}{value}", field or None), status_code=400)

    @app.exception_handler(BadRequest)
    async def bad(_request, exc: BadRequest):
        return JSONResponse(error_body(str(exc), exc.param, code=exc.code), status_code=exc.status)

    @app.get("/health")
    async def health():
        return {"status": "ok", "running": served.engine.busy_rows(), "waiting": len(served.engine.waiting)}

    def card(name: str) -> dict:
        return {"id": name, "object": "model", "created": started, "owned_by": "lite_runtime", "root": served.name,
                "parent": None if name == served.name else served.name, "max_model_len": served.context}

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [card(n) for n in [served.name] + sorted(served.adapters)]}

    @app.get("/v1/models/{model:path}")
    async def model(model: str):
        served.slot(model)          # 404 with OpenAI's error for a model not served here
        return card(model)

    @app.post("/tokenize")
    async def tokenize(body: TokenizeRequest):
        """vLLM's answer ({tokens, count, max_model_len}); llama.cpp's ({tokens}) is part of it, except
        that with_pieces makes each token {"id", "piece"} (a piece not UTF-8 on its own: its bytes)."""
        if body.model is not None:
            served.slot(body.model)
        if body.messages is not None:
            ids = chat_prompt_ids(served, body)      # its tools too, as the chat completion's prompt
        elif body.prompt is not None:
            add = True if body.add_special_tokens is None else body.add_special_tokens
            ids = served.tokenizer.encode(body.prompt, add_special_tokens=add)
        else:
            add = bool(body.add_special if body.add_special is not None else body.add_special_tokens)
            ids = served.tokenizer.encode(body.content, add_special_tokens=add)
        tokens: list = list(ids)
        if body.with_pieces:
            tokens = [{"id": t, "piece": _piece(served, t)} for t in ids]
        return {"tokens": tokens, "count": len(ids), "max_model_len": served.context}

    @app.post("/detokenize")
    async def detokenize(body: DetokenizeRequest):
        """Special tokens are kept, as vLLM and llama.cpp do; the text under both servers' keys."""
        if body.model is not None:
            served.slot(body.model)
        outside = [t for t in body.tokens if not 0 <= t < served.vocab_size]
        if outside:
            raise BadRequest(f"tokens: token id {outside[0]} is outside the vocabulary [0, {served.vocab_size})",
                              "tokens")
        text = served.tokenizer.decode(body.tokens, skip_special_tokens=False)
        return {"prompt": text, "content": text}

    @app.get("/metrics")
    async def metrics():
        return PlainTextResponse(served.metrics.render(), media_type=served.metrics.content_type)

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request):
        prompts = body.prompts()
        batch = [served.tokenizer.encode(p, add_special_tokens=True) if isinstance(p, str) else list(p)
                 for p in prompts]
        for i, prompt_ids in enumerate(batch):
            bad = [t for t in prompt_ids if not 0 <= t < served.vocab_size]
            if bad:
                which = "prompt" if len(batch) == 1 else f"prompt {i}"
                raise BadRequest(f"{which}: token id {bad[0]} is outside the vocabulary [0, {served.vocab_size})",
                                  "prompt")
        return await _answer(served, body, batch, request, chat=False)

    @app.post("/v1/chat/completions")
    async def chat(body: ChatRequest, request: Request):
        return await _answer(served, body, [chat_prompt_ids(served, body)], request, chat=True)

    async def _answer(served: ServedModel, body: SamplingFields, prompts: List[List[int]], request: Request,
                      chat: bool):
        try:
            run = start_run(served, body, prompts, chat)
        except QueueFull as e:
            return JSONResponse(error_body(str(e), None, "server_busy"), status_code=429)
        if body.stream:
            return StreamingResponse(run.events(request), media_type="text/event-stream")
        if not await run.done_unless_gone(request):
            # nobody reads this: the client is gone (499 is nginx's "client closed request")
            return JSONResponse(error_body("the client closed the connection", None, code="cancelled"),
                                status_code=499)
        return run.whole()

    add_tgi_routes(app, served)
    return app


def _piece(served: ServedModel, token: int):
    """llama.cpp's piece: the token's text, or its bytes when they are not UTF-8 on their own."""
    raw = served.token_text.bytes(token)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return list(raw)
