"""A request in flight: its choices (n per prompt of its batch) submitted to the engine, their tokens
detokenised on the event loop, and its answer in OpenAI's shapes, whole or as server-sent events. The
routes of `app` and `tgi` start runs here. A run whose client goes away is cancelled, and counted in
the metrics with the finish reason `cancelled`; one the server's stop cut short ends with the engine's
`abort` (its last chunk and `[DONE]` still sent)."""
from __future__ import annotations

import asyncio
import json
import time
import uuid
from typing import List, Optional

from lite_runtime.contract.errors import ConfigError, ToolchainError
from lite_runtime.decode.constraints import json_matcher
from lite_runtime.tokenizers.chat_format import ChatFormat
from lite_runtime.decode.engine import Engine, EngineRequest, QueueFull, TokenLogprobs, call_each
from lite_runtime.serve.metrics import Metrics
from lite_runtime.serve.protocol import Guide, SamplingFields
from lite_runtime.serve.text import RequestText, TokenText
from lite_runtime.serve import tool_calls


class ServedModel:
    """What the routes need: the engine, the tokenizer, the names it answers to."""

    def __init__(self, engine: Engine, tokenizer, name: str, metrics: Metrics):
        m = engine.session.manifest
        self.engine, self.tokenizer, self.name, self.metrics = engine, tokenizer, name, metrics
        self.adapters = {a["name"]: a["slot"] for a in m.adapters if a.get("type") == "slora"}
        self.stop_ids = frozenset(int(i) for i in m.eos_token_id)
        self.chat = ChatFormat(m.family, m.root, tokenizer)
        self.limits = engine.replicas[0].limits
        self.context = self.limits.seq_length
        self.vocab_size = m.vocab_size
        self.token_text = TokenText(tokenizer)
        template = self.chat.published.templates if self.chat.published is not None else {}
        self.tool_style = tool_calls.style_of(template.get("tool_use") or template.get("default"))
        self.loop: Optional[asyncio.AbstractEventLoop] = None     # the routes' event loop, once a run starts
        for replica in engine.replicas:
            replica.deliver = self._deliver

    def _deliver(self, calls: list) -> None:
        """The engine thread's callbacks (a step's together) run on the event loop, where the runs' queues
        live: one wake-up of the loop for them all."""
        try:
            self.loop.call_soon_threadsafe(call_each, calls)
        except RuntimeError:    # the loop has closed (the server stopped): nobody waits for these
            pass

    def constraint(self, body: SamplingFields):
        """A new matcher of what the request's answer is held to (a forced tool call, response_format,
        guided_json, guided_regex or guided_choice: one of them), or None."""
        try:
            guides = body.guides()
        except ValueError as e:
            raise BadRequest(str(e), "response_format") from None
        forced = body.forced_tools()
        if forced:
            guides.insert(0, Guide("tool_choice", f"tool_choice {body.tool_choice!r}", tool_calls.call_schema(forced)))
        if not guides:
            return None
        if len(guides) > 1:
            first, second = guides[:2]
            raise BadRequest(f"{first.what} and {second.what} both hold the answer; send one of them", second.field)
        guide = guides[0]
        if body.ignore_eos:
            raise BadRequest(f"{guide.what} ends the answer where it is complete (the model's EOS); send it without "
                             "ignore_eos", "ignore_eos")
        try:
            return json_matcher(self.tokenizer.path, self.vocab_size, self.stop_ids, guide.schema, guide.what,
                                guide.regex)
        except ConfigError as e:           # the export cannot hold an answer to a grammar (it names the field)
            raise BadRequest(str(e), guide.field) from None
        except ToolchainError as e:        # what was asked is not a grammar that can be followed
            if forced:
                raise BadRequest(f"the tools' parameters: {e}", "tools") from None
            raise BadRequest(f"{guide.what}: {e}", guide.field) from None

    def slot(self, model: str) -> int:
        if model == self.name:
            return 0
        if model in self.adapters:
            return self.adapters[model]
        known = ", ".join([self.name] + sorted(self.adapters))
        raise BadRequest(f"model {model!r} is not served here; models: {known}", "model", "model_not_found", 404)


class BadRequest(Exception):
    def __init__(self, message: str, param: Optional[str] = None, code: Optional[str] = None, status: int = 400):
        super().__init__(message)
        self.param, self.code, self.status = param, code, status

def start_run(served: ServedModel, body: SamplingFields, prompts: List[List[int]], chat: bool) -> "_Run":
    """A request's choices, `body.n` for each of `prompts` (token ids), submitted to the engine, after
    the checks that need the model; raises BadRequest, or QueueFull when the engine's queue is full."""
    slot = served.slot(body.model)
    if body.max_tokens is not None and body.min_tokens > body.max_tokens:
        raise BadRequest(f"min_tokens {body.min_tokens} exceeds max_tokens {body.max_tokens}; allowed: 0 to "
                          "max_tokens", "min_tokens")
    outside = [t for t in body.logit_bias or () if not 0 <= t < served.vocab_size]
    if outside:
        raise BadRequest(f"logit_bias: token id {outside[0]} is outside the vocabulary [0, {served.vocab_size})",
                          "logit_bias")
    outside = [t for t in body.stop_token_ids or () if not 0 <= t < served.vocab_size]
    if outside:
        raise BadRequest(f"stop_token_ids: token id {outside[0]} is outside the vocabulary of {served.vocab_size} "
                         f"tokens (ids 0 to {served.vocab_size - 1})", "stop_token_ids")
    served.constraint(body)        # a schema that cannot be followed is refused before anything runs
    if body.truncate_prompt_tokens is not None:
        prompts = [prompt_ids[-body.truncate_prompt_tokens:] for prompt_ids in prompts]
    for i, prompt_ids in enumerate(prompts):
        _check_context(served, body, prompt_ids, "the prompt" if len(prompts) == 1 else f"prompt {i}", chat)
    run = _Run(served, body, prompts, slot, chat)
    submitted = []
    try:
        for choice in run.choices:
            served.engine.submit(choice.engine_request)
            submitted.append(choice.engine_request)
    except (QueueFull, ToolchainError) as e:
        for request in submitted:
            served.engine.cancel(request)
        if isinstance(e, QueueFull):
            raise
        raise BadRequest(str(e), "prompt") from None
    served.metrics.prompt_tokens.inc(sum(len(p) for p in prompts))
    return run


def chat_prompt_ids(served: ServedModel, body) -> List[int]:
    """A chat request's prompt ids, its tools rendered by the chat template."""
    try:
        return served.chat.encode([m.model_dump() for m in body.messages], body.template_tools())
    except ValueError as e:     # the template's own checks (raise_exception)
        raise BadRequest(str(e), "messages") from None


def _check_context(served: ServedModel, body: SamplingFields, prompt_ids: List[int], which: str, chat: bool):
    """The prompt and the tokens asked for fit the model's context. A max_tokens the client did not
    give (completions' default 16) is cut to what fits instead, as an omitted one on chat means all of it."""
    context, used = served.context, len(prompt_ids)
    if used >= context:
        raise BadRequest(f"{which} has {used} tokens but this model takes at most {context - 1} (its context is "
                          f"{context} tokens)", "messages" if chat else "prompt", "context_length_exceeded")
    room = served.limits.new_tokens(used)
    if body.max_tokens is None or "max_tokens" not in body.model_fields_set or body.max_tokens <= room:
        return
    field = "max_completion_tokens" if getattr(body, "max_completion_tokens", None) is not None else "max_tokens"
    raise BadRequest(f"{field} {body.max_tokens} is too large: this model's context is {context} tokens and "
                      f"{which} has {used} tokens ({used} + {body.max_tokens} > {context}); allowed: at most "
                      f"{room}", field, "context_length_exceeded")


class _Choice:
    """One of a request's `n` generations: its engine request, text and tokens."""

    def __init__(self, run: "_Run", index: int, sampling, prompt_ids: List[int], slot: int):
        served, body = run.served, run.body
        self.index = index
        self.prompt_ids = prompt_ids
        self.text = RequestText(served.tokenizer, prompt_ids, body.stop_strings())
        self.tokens: List[int] = []
        self.logprobs: List[Optional[TokenLogprobs]] = []
        self.pieces: List[str] = []
        # the engine's: stop (an EOS id), length, abort (the server stopped), error: ...; cancelled (the client left)
        self.finish_reason: Optional[str] = None
        self.stopped_by_text = False                # a stop string ended the text (its reason is "stop")
        self.last = None
        max_tokens = served.limits.new_tokens(len(prompt_ids), body.max_tokens or None)
        top = ((body.top_logprobs or 0) if body.logprobs else None) if run.chat else body.logprobs
        put = run.queue.put_nowait          # on the event loop (ServedModel._deliver)
        stop_ids = (frozenset() if body.ignore_eos else served.stop_ids) | run.stop_token_ids
        self.engine_request = EngineRequest(
            prompt_ids, max_tokens, sampling, stop_ids, slot, top, served.constraint(body),
            on_token=lambda t, lp: put((index, "token", t, lp)),
            on_finish=lambda reason: put((index, "end", reason, None)))

    def reason(self) -> str:
        return "stop" if self.stopped_by_text else self.finish_reason


class _Run:
    """One request in flight: its choices' engine callbacks feed one asyncio queue read by the route.
    Choice j of prompt i has index i * n + j (as OpenAI and vLLM number a batch's choices)."""

    def __init__(self, served: ServedModel, body: SamplingFields, prompts: List[List[int]], slot: int, chat: bool):
        self.served, self.body, self.chat = served, body, chat
        self.id = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
        self.created = int(time.time())
        served.loop = asyncio.get_running_loop()
        self.queue: asyncio.Queue = asyncio.Queue()
        self.prompts = prompts
        self.start = time.perf_counter()
        self.counted = False        # in the metrics' finished requests
        self.reads_tools = chat and body.reads_tool_calls()
        # a forced call is the constrained JSON object itself, whatever the template's style
        self.tool_style = "json" if self.reads_tools and body.forced_tools() else served.tool_style
        self.tools = body.template_tools() if self.reads_tools else None
        self.stop_token_ids = frozenset(body.stop_token_ids or ())
        self.choices = [_Choice(self, k, sampling, prompts[k // body.n], slot)
                        for k, sampling in enumerate(body.samplings(len(prompts)))]

    def cancel(self) -> None:
        """The client went away: every choice ends at the engine's next step, and the request is counted
        as cancelled (unless it was counted as finished already)."""
        now = time.perf_counter()
        for choice in self.choices:
            self.served.engine.cancel(choice.engine_request)
            if choice.finish_reason is None:    # nobody reads its end: its latency ends now
                choice.finish_reason = "cancelled"
                self.served.metrics.choice_finished(self.start, now)
        self._count("cancelled")

    def _count(self, reason: str) -> None:
        if not self.counted:
            self.counted = True
            self.served.metrics.request_finished(reason)

    async def items(self):
        """(choice, text piece, token, logprob) per token, until every choice has its finish reason."""
        metrics, running = self.served.metrics, len(self.choices)
        while running:
            index, kind, value, logprob = await self.queue.get()
            choice, now = self.choices[index], time.perf_counter()
            if kind == "end":
                running -= 1
                choice.finish_reason = value
                metrics.choice_finished(self.start, now)
                tail = choice.text.finish()
                if tail:
                    yield choice, tail, None, None
                if not running:     # a request is counted once, when its last choice ends
                    self._count(self.choices[0].reason())
                continue
            metrics.token(self.start, choice.last, now)
            choice.last = now
            if choice.text.stopped:
                continue
            # a stop id ends the answer and is counted, but is no part of its text (as EOS, and as in vLLM)
            piece, stopped = ("", False) if value in self.stop_token_ids else choice.text.add(value)
            choice.tokens.append(value)
            choice.logprobs.append(logprob)
            if stopped:
                self.served.engine.cancel(choice.engine_request)
                choice.stopped_by_text = True
            yield choice, piece, value, logprob

    async def done(self) -> None:
        async for choice, piece, token, logprob in self.items():
            choice.pieces.append(piece)

    async def done_unless_gone(self, request) -> bool:
        """`done()`, unless the client closes its connection first (uvicorn does not cancel a route whose
        client went away): then the run is cancelled and False returned."""
        done = asyncio.ensure_future(self.done())
        gone = asyncio.ensure_future(_disconnect(request))
        finished = False
        try:
            await asyncio.wait((done, gone), return_when=asyncio.FIRST_COMPLETED)
            finished = done.done()
        finally:
            gone.cancel()
            if not finished:
                done.cancel()
                self.cancel()
        if finished:
            done.result()
        return finished

    def usage(self) -> dict:
        prompt = sum(len(p) for p in self.prompts)        # each prompt once, whatever n
        completion = sum(len(c.tokens) for c in self.choices)
        cached = sum(c.engine_request.cached_tokens for c in self.choices if c.index % self.body.n == 0)
        return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
                "prompt_tokens_details": {"cached_tokens": cached}}

    def _logprobs(self, tokens: List[int], logprobs: List[Optional[TokenLogprobs]]):
        """Tokens as their text (" Paris", not the vocabulary's piece), chat's with their UTF-8 bytes."""
        text = self.served.token_text.text
        if self.chat:
            if not self.body.logprobs:
                return None
            as_bytes = self.served.token_text.bytes

            def entry(t: int, logprob: float) -> dict:
                return {"token": text(t), "logprob": logprob, "bytes": list(as_bytes(t))}
            return {"content": [dict(entry(t, lp.logprob), top_logprobs=[entry(i, v) for i, v in lp.top])
                                for t, lp in zip(tokens, logprobs)]}
        if self.body.logprobs is None:
            return None
        return {"tokens": [text(t) for t in tokens], "token_logprobs": [lp.logprob for lp in logprobs],
                "top_logprobs": [{text(i): v for i, v in lp.top} for lp in logprobs] if self.body.logprobs else None,
                "text_offset": None}

    def _message(self, choice: _Choice) -> tuple:
        """(the chat answer's message, its finish reason): with tools, the calls read from its text."""
        text = "".join(choice.pieces)
        if not self.reads_tools:
            return {"role": "assistant", "content": text}, choice.reason()
        parsed = tool_calls.parse(text, self.tool_style, self.tools)
        if not parsed.calls:
            return {"role": "assistant", "content": text}, choice.reason()
        return {"role": "assistant", "content": parsed.content, "tool_calls": parsed.calls}, "tool_calls"

    def _whole_choice(self, choice: _Choice) -> dict:
        text, logprobs = "".join(choice.pieces), self._logprobs(choice.tokens, choice.logprobs)
        if self.chat:
            message, reason = self._message(choice)
            return {"index": choice.index, "message": message, "logprobs": logprobs, "finish_reason": reason}
        if getattr(self.body, "echo", False):
            text = self.served.tokenizer.decode(choice.prompt_ids) + text
        return {"index": choice.index, "text": text, "logprobs": logprobs, "finish_reason": choice.reason()}

    def whole(self) -> dict:
        return {"id": self.id, "object": "chat.completion" if self.chat else "text_completion",
                "created": self.created, "model": self.body.model,
                "choices": [self._whole_choice(c) for c in self.choices], "usage": self.usage()}

    async def events(self, request):
        kind = "chat.completion.chunk" if self.chat else "text_completion"
        sent = False
        # With tools read, text that may be a tool call is held back until it cannot be one, so that a client
        # never sees a call's text as content; the calls go in one delta at the end (tool_calls.StreamedAnswer).
        held = {c.index: tool_calls.StreamedAnswer(self.tool_style, self.tools) for c in self.choices
                if self.reads_tools}
        reported = {c.index: 0 for c in self.choices}      # tokens whose logprobs were sent

        def new_logprobs(choice: _Choice):
            start, reported[choice.index] = reported[choice.index], len(choice.tokens)
            tokens = choice.tokens[start:]
            return self._logprobs(tokens, choice.logprobs[start:]) if tokens else None
        try:
            ready = []      # events of tokens already queued go out in one write (a slow client catches up)
            if self.chat:
                ready = [self._event(kind, {"index": c.index, "delta": {"role": "assistant", "content": ""},
                                            "logprobs": None, "finish_reason": None}) for c in self.choices]
            async for choice, piece, token, logprob in self.items():
                if self.reads_tools:
                    choice.pieces.append(piece)
                    piece = held[choice.index].add(piece)
                    if not piece:
                        continue
                text = {"delta": {"content": piece}} if self.chat else {"text": piece}
                ready.append(self._event(kind, {"index": choice.index, **text, "logprobs": new_logprobs(choice),
                                                "finish_reason": None}))
                if self.queue.empty():
                    yield "".join(ready)
                    ready = []
            reasons = {}
            for choice in self.choices:
                reasons[choice.index] = choice.reason()
                if self.reads_tools:
                    content, calls = held[choice.index].finish()
                    delta = {"content": content}
                    if calls:
                        reasons[choice.index] = "tool_calls"
                        delta["tool_calls"] = [dict(call, index=i) for i, call in enumerate(calls)]
                    logprobs = new_logprobs(choice)
                    if content or calls or logprobs:
                        ready.append(self._event(kind, {"index": choice.index, "delta": delta, "finish_reason": None,
                                                        "logprobs": logprobs}))
            for choice in self.choices:
                end = {"index": choice.index, "finish_reason": reasons[choice.index], "logprobs": None}
                end.update({"delta": {}} if self.chat else {"text": ""})
                ready.append(self._event(kind, end, usage=self.usage() if choice is self.choices[-1] else None))
            yield "".join(ready) + "data: [DONE]\n\n"
            sent = True
        finally:
            # the client went away (cancelled while waiting for tokens, or closed while waiting to send):
            # free its rows at the next step
            if not sent:
                self.cancel()

    def _event(self, kind: str, choice: dict, usage: Optional[dict] = None) -> str:
        data = {"id": self.id, "object": kind, "created": self.created, "model": self.body.model,
                "choices": [choice]}
        if usage is not None:
            data["usage"] = usage
        return f"data: {json.dumps(data, ensure_ascii=False)}\n\n"


async def _disconnect(request) -> None:
    """Returns when the client of `request` (its body read already) closes the connection."""
    while (await request.receive())["type"] != "http.disconnect":
        pass
