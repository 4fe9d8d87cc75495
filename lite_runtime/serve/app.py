"""The HTTP side of the server: OpenAI routes translated into engine requests, answers streamed
back as server-sent events or returned whole, Prometheus metrics. It never blocks the engine:
the engine thread hands tokens to the event loop, which detokenises and sends them."""
from __future__ import annotations

import asyncio
import json
import time
import uuid
from typing import List, Optional

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse

from lite_runtime.contract.errors import ToolchainError
from lite_runtime.serve.chat import ChatFormat, encode_chat
from lite_runtime.serve.engine import Engine, EngineRequest, QueueFull, TokenLogprobs
from lite_runtime.serve.metrics import Metrics
from lite_runtime.serve.protocol import ChatRequest, CompletionRequest, SamplingFields, error_body
from lite_runtime.serve.text import RequestText


class ServedModel:
    """What the routes need: the engine, the tokenizer, the names it answers to."""

    def __init__(self, engine: Engine, tokenizer, name: str, metrics: Metrics):
        m = engine.session.manifest
        self.engine, self.tokenizer, self.name, self.metrics = engine, tokenizer, name, metrics
        self.adapters = {a["name"]: a["slot"] for a in m.adapters if a.get("type") == "slora"}
        self.stop_ids = frozenset(int(i) for i in m.eos_token_id)
        self.chat = ChatFormat(m.family, m.root)
        self.context = m.seq_length
        self.vocab_size = m.vocab_size

    def slot(self, model: str) -> int:
        if model == self.name:
            return 0
        if model in self.adapters:
            return self.adapters[model]
        known = ", ".join([self.name] + sorted(self.adapters))
        raise _BadRequest(f"model {model!r} is not served here; models: {known}", "model", "model_not_found", 404)


class _BadRequest(Exception):
    def __init__(self, message: str, param: Optional[str] = None, code: Optional[str] = None, status: int = 400):
        super().__init__(message)
        self.param, self.code, self.status = param, code, status


def create_app(served: ServedModel) -> FastAPI:
    app = FastAPI(title="MindSpore Lite LLM server")

    @app.exception_handler(RequestValidationError)
    async def invalid(_request, exc: RequestValidationError):
        first = exc.errors()[0]
        field = ".".join(str(p) for p in first["loc"] if p != "body")
        value = f" (got {first['input']!r})" if "input" in first and not isinstance(first["input"], dict) else ""
        return JSONResponse(error_body(f"{field}: {first['msg']}{value}", field or None), status_code=400)

    @app.exception_handler(_BadRequest)
    async def bad(_request, exc: _BadRequest):
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
                raise _BadRequest(f"prompt: token id {bad[0]} is outside the vocabulary [0, {served.vocab_size})",
                                  "prompt")
        return await _answer(served, body, prompt_ids, request, chat=False)

    @app.post("/v1/chat/completions")
    async def chat(body: ChatRequest, request: Request):
        text = served.chat.render([m.model_dump() for m in body.messages])
        prompt_ids = encode_chat(served.tokenizer, text)
        return await _answer(served, body, prompt_ids, request, chat=True)

    async def _answer(served: ServedModel, body: SamplingFields, prompt_ids: List[int], request: Request, chat: bool):
        slot = served.slot(body.model)
        room = served.context - len(prompt_ids)
        if room < 1:
            raise _BadRequest(f"the prompt has {len(prompt_ids)} tokens but this model takes at most "
                              f"{served.context - 1} (its context is {served.context} tokens)", "messages" if chat
                              else "prompt", "context_length_exceeded")
        run = _Run(served, body, prompt_ids, slot, chat)
        try:
            served.engine.submit(run.engine_request)
        except QueueFull as e:
            return JSONResponse(error_body(str(e), None, "server_busy"), status_code=429)
        except ToolchainError as e:
            raise _BadRequest(str(e), "prompt") from None
        served.metrics.prompt_tokens.inc(len(prompt_ids))
        if body.stream:
            return StreamingResponse(run.events(request), media_type="text/event-stream")
        try:
            await run.done()
        except asyncio.CancelledError:
            served.engine.cancel(run.engine_request)
            raise
        return run.whole()

    return app


class _Run:
    """One request in flight: the engine's callbacks feed an asyncio queue read by the route."""

    def __init__(self, served: ServedModel, body: SamplingFields, prompt_ids: List[int], slot: int, chat: bool):
        self.served, self.body, self.chat = served, body, chat
        self.id = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
        self.created = int(time.time())
        self.loop = asyncio.get_running_loop()
        self.queue: asyncio.Queue = asyncio.Queue()
        self.text = RequestText(served.tokenizer, prompt_ids, body.stop_strings())
        self.prompt_ids = prompt_ids
        self.tokens: List[int] = []
        self.logprobs: List[Optional[TokenLogprobs]] = []
        self.pieces: List[str] = []
        self.finish_reason: Optional[str] = None   # the engine's: stop (an EOS id), length, cancelled, error: ...
        self.stopped_by_text = False                # a stop string ended the text (its reason is "stop")
        self.start = time.perf_counter()
        self.last = None
        max_tokens = body.max_tokens or served.context - len(prompt_ids)
        self.engine_request = EngineRequest(
            prompt_ids, max_tokens, body.sampling(), served.stop_ids, slot, body.presence_penalty,
            body.frequency_penalty, body.min_p, ((body.top_logprobs or 0) if body.logprobs else None) if chat else body.logprobs,
            on_token=lambda t, lp: self.loop.call_soon_threadsafe(self.queue.put_nowait, ("token", t, lp)),
            on_finish=lambda reason: self.loop.call_soon_threadsafe(self.queue.put_nowait, ("end", reason, None)))

    async def _items(self):
        """(text piece, token, logprob) per token; ends with the finish reason set."""
        metrics = self.served.metrics
        while True:
            kind, value, logprob = await self.queue.get()
            now = time.perf_counter()
            if kind == "end":
                self.finish_reason = value
                tail = self.text.finish()
                if tail:
                    yield tail, None, None
                metrics.finished(self.start, now, value, len(self.tokens))
                return
            metrics.token(self.start, self.last, now)
            self.last = now
            if self.text.stopped:
                continue
            piece, stopped = self.text.add(value)
            self.tokens.append(value)
            self.logprobs.append(logprob)
            if stopped:
                self.served.engine.cancel(self.engine_request)
                self.stopped_by_text = True
            yield piece, value, logprob

    async def done(self) -> None:
        async for piece, token, logprob in self._items():
            self.pieces.append(piece)

    def _reason(self) -> str:
        return "stop" if self.stopped_by_text else self.finish_reason

    def usage(self) -> dict:
        return {"prompt_tokens": len(self.prompt_ids), "completion_tokens": len(self.tokens),
                "total_tokens": len(self.prompt_ids) + len(self.tokens)}

    def _logprobs(self, tokens: List[int], logprobs: List[Optional[TokenLogprobs]]):
        piece = self.served.tokenizer.id_to_piece
        if self.chat:
            if not self.body.logprobs:
                return None
            return {"content": [{"token": piece(t), "logprob": lp.logprob, "bytes": None,
                                 "top_logprobs": [{"token": piece(i), "logprob": v, "bytes": None} for i, v in lp.top]}
                                for t, lp in zip(tokens, logprobs)]}
        if self.body.logprobs is None:
            return None
        return {"tokens": [piece(t) for t in tokens], "token_logprobs": [lp.logprob for lp in logprobs],
                "top_logprobs": [{piece(i): v for i, v in lp.top} for lp in logprobs] if self.body.logprobs else None,
                "text_offset": None}

    def whole(self) -> dict:
        text = "".join(self.pieces)
        if self.chat:
            choice = {"index": 0, "message": {"role": "assistant", "content": text},
                      "logprobs": self._logprobs(self.tokens, self.logprobs), "finish_reason": self._reason()}
            kind = "chat.completion"
        else:
            if getattr(self.body, "echo", False):
                text = self.served.tokenizer.decode(self.prompt_ids) + text
            choice = {"index": 0, "text": text, "logprobs": self._logprobs(self.tokens, self.logprobs),
                      "finish_reason": self._reason()}
            kind = "text_completion"
        return {"id": self.id, "object": kind, "created": self.created, "model": self.body.model,
                "choices": [choice], "usage": self.usage()}

    async def events(self, request):
        kind = "chat.completion.chunk" if self.chat else "text_completion"
        try:
            if self.chat:
                yield self._event(kind, {"index": 0, "delta": {"role": "assistant", "content": ""},
                                         "logprobs": None, "finish_reason": None})
            ready = []      # events of tokens already queued go out in one write (a slow client catches up)
            async for piece, token, logprob in self._items():
                lp = self._logprobs([token], [logprob]) if token is not None else None
                if self.chat:
                    choice = {"index": 0, "delta": {"content": piece}, "logprobs": lp, "finish_reason": None}
                else:
                    choice = {"index": 0, "text": piece, "logprobs": lp, "finish_reason": None}
                ready.append(self._event(kind, choice))
                if self.queue.empty():
                    yield "".join(ready)
                    ready = []
            end = {"index": 0, "finish_reason": self._reason(), "logprobs": None}
            end.update({"delta": {}} if self.chat else {"text": ""})
            yield "".join(ready) + self._event(kind, end, usage=self.usage()) + "data: [DONE]\n\n"
        except asyncio.CancelledError:      # the client went away: free its row at the next step
            self.served.engine.cancel(self.engine_request)
            raise

    def _event(self, kind: str, choice: dict, usage: Optional[dict] = None) -> str:
        data = {"id": self.id, "object": kind, "created": self.created, "model": self.body.model,
                "choices": [choice]}
        if usage is not None:
            data["usage"] = usage
        return f"data: {json.dumps(data, ensure_ascii=False)}\n\n"
