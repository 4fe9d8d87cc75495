"""OpenAI request bodies, with OpenAI's meanings and ranges, and their translation into engine
requests. A body that breaks a rule is answered 400 with OpenAI's error object naming the field."""
from __future__ import annotations

import dataclasses
from typing import Annotated, Any, Dict, List, Literal, Optional, Union

from jsonschema.exceptions import SchemaError
from jsonschema.validators import validator_for
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_serializer, model_validator

from lite_runtime.decode.sampling import SamplingParams

MAX_CHOICES = 16

# Fields of OpenAI's (and TGI's) requests that are not built here: (is the value one that changes
# nothing?, what to say). Anything else is refused: ignoring it would answer something not asked for.
NOT_BUILT = {
    "tools": (lambda v: not v, "tools are for chat: send them to /v1/chat/completions"),
    "tool_choice": (lambda v: v in (None, "none", "auto"), "tool_choice is for chat: send it to /v1/chat/completions"),
    "response_format": (lambda v: not v or v.get("type") in ("text", "json_object", "json_schema"),
                        "allowed types: text, json_object, json_schema"),
    "suffix": (lambda v: not v, "insertion after the completion is not supported; send the request without suffix"),
    "best_of": (lambda v: v in (None, 1), "only 1 is supported (each choice generated is returned)"),
    # TGI's
    "typical_p": (lambda v: v in (None, 1.0), "typical sampling is not supported by this server"),
    "top_n_tokens": (lambda v: not v, "the most likely tokens are not reported by these routes"),
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
    response_format: Optional[Dict[str, Any]] = None
    guided_regex: Optional[str] = None                    # vLLM's: the answer is text this regex matches whole

    _not_built_shared = not_built("response_format")     # its own name: a subclass's `_not_built` replaces one

    def sampling(self) -> SamplingParams:
        greedy = self.temperature == 0.0
        return SamplingParams(do_sample=not greedy, top_k=max(self.top_k, 0), top_p=self.top_p,
                              temperature=1.0 if greedy else self.temperature,
                              repetition_penalty=self.repetition_penalty, seed=self.seed,
                              presence_penalty=self.presence_penalty, frequency_penalty=self.frequency_penalty,
                              min_p=self.min_p, logit_bias=self.logit_bias, min_tokens=self.min_tokens)

    def samplings(self) -> List[SamplingParams]:
        """One per choice: with a seed, choice i samples with seed + i (reproducible, and not n copies)."""
        one = self.sampling()
        return [one if one.seed is None else dataclasses.replace(one, seed=one.seed + i) for i in range(self.n)]

    def json_schema(self):
        """(True, the schema or None for any JSON object) when the answer must be JSON, else (False, None)."""
        fmt = self.response_format or {}
        if fmt.get("type") == "json_object":
            return True, None
        if fmt.get("type") == "json_schema":
            spec = fmt.get("json_schema")
            if not isinstance(spec, dict) or not isinstance(spec.get("schema", {}), dict):
                raise ValueError("response_format.json_schema must be an object with the JSON schema under 'schema'")
            return True, spec.get("schema")
        return False, None

    def stop_strings(self) -> List[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])

    # tools are chat's (ChatRequest)
    def template_tools(self) -> Optional[List[dict]]:
        return None

    def reads_tool_calls(self) -> bool:
        return False

    def forced_tools(self) -> List[dict]:
        return []


def _token_ids(value) -> bool:
    return isinstance(value, list) and bool(value) and \
        all(isinstance(t, int) and not isinstance(t, bool) for t in value)


class CompletionRequest(SamplingFields):
    # one prompt (text or token ids) or a batch of them: n choices each, in order
    prompt: Union[str, List[int], List[str], List[List[int]]]
    max_tokens: Optional[int] = Field(16, ge=1)           # OpenAI's default for completions
    logprobs: Optional[int] = Field(None, ge=0, le=5)     # the chosen token's and the k most likely ones'

    echo: bool = False
    suffix: Optional[str] = None
    best_of: Optional[int] = None
    tools: Optional[Any] = None                  # chat's (refused here)
    tool_choice: Optional[Any] = None

    _not_built = not_built("suffix", "best_of", "tools", "tool_choice")

    @field_validator("prompt", mode="before")
    @classmethod
    def _prompt_shape(cls, prompt):
        if isinstance(prompt, str) or _token_ids(prompt):
            return prompt
        if isinstance(prompt, list) and prompt and (all(isinstance(p, str) for p in prompt) or
                                                    all(_token_ids(p) for p in prompt)):
            return prompt
        raise ValueError("expected a string, a list of token ids, a list of strings or a list of lists of token "
                         "ids (a batch: none of them empty, all of one kind)")

    def prompts(self) -> List[Union[str, List[int]]]:
        """The batch: each prompt as text or token ids."""
        one = isinstance(self.prompt, str) or (self.prompt and isinstance(self.prompt[0], int))
        return [self.prompt] if one else list(self.prompt)


class ToolCallFunction(BaseModel):
    name: str
    arguments: str              # JSON text, given to the chat template as sent (as transformers does)


class ToolCall(BaseModel):
    """A tool call of an earlier assistant answer, in OpenAI's shape."""
    id: str
    type: Literal["function"] = "function"
    function: ToolCallFunction


class ChatMessage(BaseModel):
    """A message as the chat template sees it (`model_dump`): OpenAI's `developer` is the template's
    `system`; an assistant's `tool_calls` and a tool answer's `tool_call_id` are kept when given."""
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Optional[str] = None          # null only in an assistant message with tool_calls
    name: Optional[str] = None
    tool_calls: Optional[List[ToolCall]] = None
    tool_call_id: Optional[str] = None

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

    @model_validator(mode="after")
    def _fields_of_the_role(self):
        if self.tool_calls is not None and self.role != "assistant":
            raise ValueError(f"tool_calls are given in a message of role {self.role!r}; allowed only in an "
                             "assistant message")
        if self.content is None and not (self.role == "assistant" and self.tool_calls):
            raise ValueError(f"content is missing or null in a message of role {self.role!r}; allowed only in an "
                             "assistant message with tool_calls")
        return self

    @model_serializer(mode="wrap")
    def _for_the_template(self, handler):
        message = handler(self)
        if message["role"] == "developer":
            message["role"] = "system"
        for key in ("name", "tool_calls", "tool_call_id"):     # absent unless given, as in the request
            if message.get(key) is None:
                message.pop(key, None)
        return message


class FunctionDefinition(BaseModel):
    name: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")      # OpenAI's rule for a function's name
    description: Optional[str] = None
    parameters: Optional[Dict[str, Any]] = None              # a JSON schema; none: the function takes nothing
    strict: Optional[bool] = None

    @field_validator("parameters")
    @classmethod
    def _a_json_schema(cls, parameters, info):
        """Checked whatever the tool_choice: the answer is read against it (tool_calls)."""
        if parameters is None:
            return None
        try:
            validator_for(parameters).check_schema(parameters)
        except SchemaError as e:
            name = info.data.get("name")
            where = f" (at {'.'.join(str(p) for p in e.path)})" if e.path else ""
            raise ValueError(f"the parameters of function {name!r} are not a valid JSON schema: "
                             f"{e.message}{where}") from None
        return parameters


class Tool(BaseModel):
    """An entry of a chat request's `tools`, as the chat template sees it (`model_dump`)."""
    type: Literal["function"]
    function: FunctionDefinition

    @model_serializer(mode="wrap")
    def _for_the_template(self, handler):
        tool = handler(self)
        tool["function"] = {k: v for k, v in tool["function"].items() if v is not None}
        return tool


def rendered_tools(tools: Optional[List[Tool]]) -> Optional[List[dict]]:
    """A request's tools as the chat template sees them (None: no tools)."""
    return [t.model_dump() for t in tools] if tools else None


TOOL_CHOICES = ("none", "auto", "required")


class ChatRequest(SamplingFields):
    messages: List[ChatMessage] = Field(min_length=1)
    tools: Optional[List[Tool]] = None
    # none: the model is shown the tools but its answer is text; auto: its answer is read for calls;
    # required or {"type": "function", "function": {"name": ...}}: the answer is held to one call
    tool_choice: Optional[Union[str, dict]] = None
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

    @field_validator("tools")
    @classmethod
    def _distinct_names(cls, tools):
        names = [t.function.name for t in tools or ()]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"function name {twice[0]!r} is given to more than one tool; each name once")
        return tools

    @field_validator("tool_choice")
    @classmethod
    def _choice_among_tools(cls, choice, info):
        if choice is None or choice in ("none", "auto"):
            return choice
        if isinstance(choice, str) and choice not in TOOL_CHOICES:
            raise ValueError(f"{choice!r} is not a tool choice; allowed: none, auto, required, or "
                             '{"type": "function", "function": {"name": ...}}')
        if isinstance(choice, dict):
            function = choice.get("function")
            if choice.get("type") != "function" or not isinstance(function, dict) or \
                    not isinstance(function.get("name"), str):
                raise ValueError(f"{choice!r} is not a tool choice; allowed: none, auto, required, or "
                                 '{"type": "function", "function": {"name": ...}}')
        if "tools" not in info.data:      # tools were refused already
            return choice
        names = [t.function.name for t in info.data["tools"] or ()]
        if not names:
            raise ValueError(f"{choice!r} needs tools; send the tools the model may call")
        if isinstance(choice, dict) and choice["function"]["name"] not in names:
            raise ValueError(f"function {choice['function']['name']!r} is not among the request's tools; "
                             f"tools: {', '.join(names)}")
        if (info.data.get("response_format") or {}).get("type", "text") != "text":
            raise ValueError(f"{choice!r} holds the answer to a tool call, which cannot also follow "
                             "response_format; send one of them")
        return choice

    def template_tools(self) -> Optional[List[dict]]:
        """The tools as the chat template renders them (also with tool_choice none, as OpenAI)."""
        return rendered_tools(self.tools)

    def reads_tool_calls(self) -> bool:
        """Whether the answer is read for tool calls."""
        return bool(self.tools) and self.tool_choice != "none"

    def forced_tools(self) -> List[dict]:
        """The tools one of which the answer must call (tool_choice required or named), else []."""
        if not self.tools or self.tool_choice in (None, "none", "auto"):
            return []
        tools = self.template_tools()
        if isinstance(self.tool_choice, dict):
            return [t for t in tools if t["function"]["name"] == self.tool_choice["function"]["name"]]
        return tools

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


class TokenizeRequest(BaseModel):
    """vLLM's `/tokenize` (`prompt`, or chat `messages`) and llama.cpp server's (`content`)."""
    model_config = ConfigDict(extra="ignore")
    model: Optional[str] = None
    prompt: Optional[str] = None
    messages: Optional[List[ChatMessage]] = Field(None, min_length=1)
    content: Optional[str] = None
    tools: Optional[List[Tool]] = None            # vLLM's, with messages: rendered by the chat template
    add_special_tokens: Optional[bool] = None     # vLLM's, true by default (the prefix of a chat is its template's)
    add_special: Optional[bool] = None            # llama.cpp's, false by default
    with_pieces: bool = False                     # llama.cpp's: each token as {"id", "piece"}

    @model_validator(mode="after")
    def _one_input(self):
        given = [k for k in ("prompt", "messages", "content") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(f"give one of prompt (vLLM's), messages (vLLM's chat) or content (llama.cpp's); got "
                             f"{', '.join(given) or 'none'}")
        return self

    @model_validator(mode="after")
    def _tools_need_messages(self):
        if self.tools and self.messages is None:
            raise ValueError("tools are rendered with chat messages by the chat template; send them with messages")
        return self

    def template_tools(self) -> Optional[List[dict]]:
        """As ChatRequest's: the prompt counted is the chat completion's."""
        return rendered_tools(self.tools)


class DetokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")
    model: Optional[str] = None
    tokens: List[int]


def error_body(message: str, param: Optional[str] = None, kind: str = "invalid_request_error",
               code: Optional[str] = None) -> Dict[str, object]:
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}
