"""OpenAI request bodies, with OpenAI's meanings and ranges, and their translation into engine
requests. A body that breaks a rule is answered 400 with OpenAI's error object naming the field."""
from __future__ import annotations

import dataclasses
from typing import Dict, List, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, model_validator

from lite_runtime.decode.sampling import SamplingParams

MAX_CHOICES = 16


class SamplingFields(BaseModel):
    """The fields completions and chat share."""
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


class ChatMessage(BaseModel):
    role: Literal["system", "user", "assistant", "tool"]
    content: str


class ChatRequest(SamplingFields):
    messages: List[ChatMessage] = Field(min_length=1)
    logprobs: bool = False
    top_logprobs: Optional[int] = Field(None, ge=0, le=20)   # with logprobs: the k most likely tokens too

    @model_validator(mode="after")
    def _top_needs_logprobs(self):
        if self.top_logprobs and not self.logprobs:
            raise ValueError("top_logprobs needs logprobs: true")
        return self


def error_body(message: str, param: Optional[str] = None, kind: str = "invalid_request_error",
               code: Optional[str] = None) -> Dict[str, object]:
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}
