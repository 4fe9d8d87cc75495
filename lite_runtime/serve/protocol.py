"""OpenAI request bodies, with OpenAI's meanings and ranges, and their translation into engine
requests. A body that breaks a rule is answered 400 with OpenAI's error object naming the field."""
from __future__ import annotations

import dataclasses
from typing import Annotated, Any, Dict, List, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from lite_runtime.decode.sampling import SamplingParams

MAX_CHOICES = 16

# Fields of OpenAI's (and TGI's) requests that are not built here: (is the value one that changes
# nothing?, what to say). Anything else is refused: ignoring it would answer something not asked for.
NOT_BUILT = {
    "tools": (lambda v: not v, "tool calls are not supported by this server; send the request without tools"),
    "tool_choice": (lambda v: v in (None, "none", "auto"),
                    "it needs tool calls, which this server does not support; allowed: none, auto"),
    "response_format": (lambda v: not v or v.get("type") == "text",
                        "only type text is supported (no constrained decoding)"),
    "suffix": (lambda v: not v, "insertion after the completion is not supported; send the request without suffix"),
    "best_of": (lambda v: v in (None, 1), "only 1 is supported (each choice generated is returned)"),
    # TGI's
    "typical_p": (lambda v: v in (None, 1.0), "typical sampling is not supported by this server"),
    "top_n_tokens": (lambda v: not v, "the most likely tokens are not reported by these routes"),
    "grammar": (lambda v: not v, "constrained decoding is not supported by this server"),
    "watermark": (lambda v: not v, "watermarking is not supported by this server"),
}


def not_built(*fields: str):
    """A validator of `fields` (keys of NOT_BUILT) refusing the values that would change the answer."""
    def check(cls, value, info):
        changes_nothing, why = NOT_BUILT[info.field_name]
        if not changes_nothing(value):
            raise ValueError(why)
        return value
    return field_validator(*fields)(check)


class SamplingFields(BaseModel):
    """The fields completions and chat share. Unknown fields are ignored (clients send `user`,
    `metadata`, ...), but those that would change the answer and are not built here are refused."""
    model_config = ConfigDict(extra="ignore")

    model: str
    max_tokens: Optional[int] = Field(None, ge=1)
    temperature: float = Field(1.0, ge=0.0, le=2.0)      # 0: greedy
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int = Field(-1, ge=-1)                         # -1 or 0: off
    min_p: float = Field(0.0, ge=0.0, le=1.0)
    seed: Optional[int] = Field(None, ge=0)
    stop: Optional[Union[str, List[str]]] = None
    repetition_penalty: float = Field(1.0, gt=0.0)
    presence_penalty: float = Field(0.0, ge=-2.0, le=2.0)
    frequency_penalty: float = Field(0.0, ge=-2.0, le=2.0)
    n: int = Field(1, ge=1, le=MAX_CHOICES)               # choices: each its own cache row
    stream: bool = False
    ignore_eos: bool = False                              # vLLM's: the model's EOS does not end the text
    min_tokens: int = Field(0, ge=0)                      # vLLM's: no EOS before this many new tokens
    logit_bias: Optional[Dict[int, Annotated[float, Field(ge=-100.0, le=100.0)]]] = None   # token id -> added logit
    tools: Optional[list] = None                          # refused when given (NOT_BUILT)
    tool_choice: Optional[Union[str, dict]] = None
    response_format: Optional[Dict[str, Any]] = None

    _not_built = not_built("tools", "tool_choice", "response_format")

    def sampling(self) -> SamplingParams:
        greedy = self.temperature == 0.0
        return SamplingParams(do_sample=not greedy, top_k=max(self.top_k, 0), top_p=self.top_p,
                              temperature=1.0 if greedy else self.temperature,
                              repetition_penalty=self.repetition_penalty, seed=self.seed)

    def samplings(self) -> List[SamplingParams]:
        """One per choice: with a seed, choice i samples with seed + i (reproducible, and not n copies)."""
        one = self.sampling()
        return [one if one.seed is None else dataclasses.replace(one, seed=one.seed + i) for i in range(self.n)]

    def stop_strings(self) -> List[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])


class CompletionRequest(SamplingFields):
    prompt: Union[str, List[int]]
    max_tokens: Optional[int] = Field(16, ge=1)           # OpenAI's default for completions
    logprobs: Optional[int] = Field(None, ge=0, le=5)     # the chosen token's and the k most likely ones'

    echo: bool = False
    suffix: Optional[str] = None
    best_of: Optional[int] = None

    _not_built = not_built("suffix", "best_of")


class ChatMessage(BaseModel):
    role: Literal["system", "user", "assistant", "tool"]
    content: str

    @field_validator("content", mode="before")
    @classmethod
    def _text_parts(cls, content):
        """OpenAI's list of content parts: its text parts, one per line."""
        if not isinstance(content, list):
            return content
        kinds = [part.get("type") if isinstance(part, dict) else type(part).__name__ for part in content]
        other = [k for k in kinds if k != "text"]
        if other:
            raise ValueError(f"only text parts are supported; got a part of type {other[0]!r}")
        return "\n".join(str(part.get("text", "")) for part in content)


class ChatRequest(SamplingFields):
    messages: List[ChatMessage] = Field(min_length=1)
    logprobs: bool = False
    top_logprobs: Optional[int] = Field(None, ge=0, le=20)   # with logprobs: the k most likely tokens too
    max_completion_tokens: Optional[int] = Field(None, ge=1)  # OpenAI's newer name of max_tokens

    @field_validator("max_completion_tokens")
    @classmethod
    def _one_limit(cls, limit, info):
        given = info.data.get("max_tokens")
        if limit is not None and given is not None and given != limit:
            raise ValueError(f"{limit} differs from max_tokens {given}; give one of them")
        return limit

    @model_validator(mode="after")
    def _top_needs_logprobs(self):
        if self.top_logprobs and not self.logprobs:
            raise ValueError("top_logprobs needs logprobs: true")
        return self

    @model_validator(mode="after")
    def _limit(self):
        if self.max_tokens is None:
            self.max_tokens = self.max_completion_tokens
        return self


def error_body(message: str, param: Optional[str] = None, kind: str = "invalid_request_error",
               code: Optional[str] = None) -> Dict[str, object]:
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}
