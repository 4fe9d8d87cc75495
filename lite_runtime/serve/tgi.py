"""Text Generation Inference's routes, as MindIE Service also serves them: `POST /generate` (and `POST /`),
`POST /generate_stream`, `GET /info`. A TGI request becomes a completion request of the same engine;
its answers and errors take TGI's shapes (`generated_text`, `details`, token events; 422 with
`error_type`). Sampling follows TGI: greedy unless `do_sample`, or a temperature, top_k or top_p
that changes the distribution, is given."""
from __future__ import annotations

import json
from importlib.metadata import PackageNotFoundError, version
from typing import List, Literal, Optional, Union

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from lite_runtime.decode.engine import QueueFull
from lite_runtime.serve.protocol import CompletionRequest, not_built
from lite_runtime.serve.runs import BadRequest, start_run

# the engine's reasons; a stop string is stop_sequence, and `abort` (the server stopped first) stays as it is
FINISH = {"stop": "eos_token", "length": "length"}


class Grammar(BaseModel):
    """TGI's `grammar`: {"type": "json", "value": a JSON schema (or its text)} or {"type": "regex", "value": ...}."""
    model_config = ConfigDict(extra="forbid")
    type: Literal["json", "regex"]
    value: Union[dict, str]

    def fields(self) -> dict:
        """The completion request's fields that hold the answer to it."""
        if self.type == "regex":
            if not isinstance(self.value, str):
                raise ValueError("parameters.grammar.value: a regex grammar's value is the expression's text")
            return {"guided_regex": self.value}
        schema = self.value
        if isinstance(schema, str):
            try:
                schema = json.loads(schema)
            except ValueError as e:
                raise ValueError(f"parameters.grammar.value: not a JSON schema ({e})") from None
        if not isinstance(schema, dict):
            raise ValueError("parameters.grammar.value: a JSON schema is an object")
        return {"response_format": {"type": "json_schema", "json_schema": {"schema": schema}}}


class TgiParameters(BaseModel):
    model_config = ConfigDict(extra="forbid")          # TGI's fields only: another one is a mistake

    max_new_tokens: int = Field(20, ge=1)              # MindIE's default
    do_sample: bool = False
    temperature: Optional[float] = Field(None, gt=0.0)
    top_k: Optional[int] = Field(None, gt=0)
    top_p: Optional[float] = Field(None, gt=0.0, le=1.0)
    repetition_penalty: Optional[float] = Field(None, gt=0.0)
    frequency_penalty: Optional[float] = Field(None, ge=-2.0, le=2.0)
    seed: Optional[int] = Field(None, ge=0)
    stop: Optional[List[str]] = None
    truncate: Optional[int] = Field(None, ge=1)        # keep the prompt's last tokens
    return_full_text: Optional[bool] = False
    details: bool = False
    decoder_input_details: bool = False
    adapter_id: Optional[str] = None                   # an SLoRA adapter of the export, by name
    grammar: Optional[Grammar] = None                  # the answer held to a JSON schema or a regex
    # TGI's, not built here: refused when they would change the answer
    best_of: Optional[int] = None
    typical_p: Optional[float] = None
    watermark: bool = False
    top_n_tokens: Optional[int] = None

    _not_built = not_built("best_of", "typical_p", "top_n_tokens", "watermark")

    def sampled(self) -> bool:
        return self.do_sample or self.temperature not in (None, 1.0) or bool(self.top_k) or \
            self.top_p not in (None, 1.0)


class TgiRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    inputs: str = Field(min_length=1)
    parameters: TgiParameters = TgiParameters()
    stream: bool = False


def _error(message: str, status: int = 422, kind: str = "validation") -> JSONResponse:
    return JSONResponse({"error": message, "error_type": kind}, status_code=status)


def add_tgi_routes(app: FastAPI, served) -> None:
    specials = set(served.tokenizer.all_special_ids)

    def token(choice, index: int, piece: str) -> dict:
        t = choice.tokens[index]
        return {"id": t, "text": piece, "logprob": choice.logprobs[index].logprob, "special": t in specials}

    async def answer(request: Request, stream: Optional[bool]):
        try:
            tgi = TgiRequest.model_validate(await request.json())
        except ValidationError as e:
            first = e.errors()[0]
            where = ".".join(str(p) for p in first["loc"])
            return _error(f"{where}: {first['msg']}")
        except ValueError:
            return _error("the body is not JSON")
        p = tgi.parameters
        prompt_ids = served.tokenizer.encode(tgi.inputs, add_special_tokens=True)
        if p.truncate:
            prompt_ids = prompt_ids[-p.truncate:]
        sampled = p.sampled()
        given = {"max_tokens"} if "max_new_tokens" in p.model_fields_set else set()   # else cut to what fits
        try:
            grammar = p.grammar.fields() if p.grammar else {}
        except ValueError as e:
            return _error(str(e))
        body = CompletionRequest.model_construct(
            given, model=p.adapter_id or served.name, prompt=tgi.inputs, max_tokens=p.max_new_tokens,
            temperature=(p.temperature or 1.0) if sampled else 0.0, top_p=p.top_p or 1.0, top_k=p.top_k or -1,
            repetition_penalty=p.repetition_penalty or 1.0, frequency_penalty=p.frequency_penalty or 0.0,
            seed=p.seed, stop=p.stop or [], logprobs=0, **grammar)
        try:
            run = start_run(served, body, [prompt_ids], chat=False)
        except BadRequest as e:
            field = {"model": "parameters.adapter_id", "max_tokens": "parameters.max_new_tokens",
                     "response_format": "parameters.grammar",
                     "guided_regex": "parameters.grammar"}.get(e.param, "inputs")
            return _error(f"{field}: {str(e).replace('max_tokens', 'max_new_tokens')}")
        except QueueFull as e:
            return _error(str(e), 429, "overloaded")
        choice = run.choices[0]
        prefix = tgi.inputs if p.return_full_text else ""

        def details(whole: bool) -> Optional[dict]:
            if not (p.details or p.decoder_input_details):
                return None
            reason = "stop_sequence" if choice.stopped_by_text else FINISH.get(choice.finish_reason,
                                                                                  choice.finish_reason)
            out = {"finish_reason": reason, "generated_tokens": len(choice.tokens), "seed": p.seed}
            if not whole:
                return dict(out, input_length=len(prompt_ids))
            prefill = [{"id": t, "text": served.token_text.text(t), "logprob": None} for t in prompt_ids] \
                if p.decoder_input_details else []
            pieces = choice.pieces[:len(choice.tokens)]
            return dict(out, prefill=prefill, tokens=[token(choice, i, s) for i, s in enumerate(pieces)])

        if not (tgi.stream if stream is None else stream):
            if not await run.done_unless_gone(request):
                return _error("the client closed the connection", 499, "cancelled")
            return {"generated_text": prefix + "".join(choice.pieces), "details": details(True)}

        async def events():
            held, text = None, []        # each token's event waits for the next: the last one carries the end
            try:
                async for _, piece, t, _ in run.items():
                    text.append(piece)
                    if t is None:         # the text held back for stop strings, at the end
                        continue
                    if held is not None:
                        yield f"data:{json.dumps(held)}\n\n"
                    held = {"index": len(choice.tokens), "token": token(choice, len(choice.tokens) - 1, piece),
                            "generated_text": None, "details": None}
                if held is not None:
                    held.update(generated_text=prefix + "".join(text), details=details(False))
                    yield f"data:{json.dumps(held)}\n\n"
                else:       # no token to carry the end (the server stopped first, or a step failed): TGI's error
                    yield "data:" + json.dumps({"error": f"the answer ended before its first token "
                                                         f"({choice.finish_reason})",
                                                "error_type": "incomplete_generation"}) + "\n\n"
            except BaseException:
                run.cancel()
                raise
        return StreamingResponse(events(), media_type="text/event-stream")

    @app.post("/generate")
    async def generate(request: Request):
        return await answer(request, False)

    @app.post("/generate_stream")
    async def generate_stream(request: Request):
        return await answer(request, True)

    @app.post("/")
    async def root(request: Request):
        return await answer(request, None)

    @app.get("/info")
    async def info():
        try:
            ours = version("llm-lite-export")
        except PackageNotFoundError:
            ours = None
        return {"model_id": served.name, "max_input_length": served.context - 1, "max_total_tokens": served.context,
                "max_best_of": 1, "version": ours}
