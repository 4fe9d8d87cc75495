"""OpenAI's chat request bodies (messages, tools, tool_choice) and vLLM's /tokenize, on protocol.py's sampling
fields; a body that breaks a rule is answered 400 naming the field."""
from __future__ import annotations

from typing import Any, Dict, List, Literal, Optional, Union

from jsonschema.exceptions import SchemaError
from jsonschema.validators import validator_for
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_serializer, model_validator

from lite_runtime.serve.protocol import SamplingFields, not_built


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
    parallel_tool_calls: Optional[bool] = None
    add_special_tokens: Any = None               # vLLM's: false by default here (the template writes them)
    # vLLM's and OpenAI's, not built: refused when they would change the answer
    echo: Any = None
    add_generation_prompt: Any = None
    continue_final_message: Any = None
    chat_template: Any = None
    chat_template_kwargs: Any = None
    documents: Any = None
    functions: Any = None
    function_call: Any = None
    modalities: Any = None
    audio: Any = None
    reasoning_effort: Any = None
    verbosity: Any = None
    web_search_options: Any = None

    _not_built = not_built("echo", "add_generation_prompt", "continue_final_message", "chat_template",
                           "chat_template_kwargs", "documents", "functions", "function_call", "modalities", "audio",
                           "reasoning_effort", "verbosity", "web_search_options")

    @field_validator("add_special_tokens")
    @classmethod
    def _template_writes_special_tokens(cls, add):
        if add not in (None, False):
            raise ValueError("the chat template writes every special token of the prompt; adding the tokenizer's "
                             "(a second BOS) is not supported")
        return add

    @field_validator("parallel_tool_calls")
    @classmethod
    def _one_call_is_held(cls, parallel, info):
        """false (at most one call) holds where the answer is one call or none; under auto every call the
        answer writes is read."""
        if parallel is False and info.data.get("tools") and info.data.get("tool_choice") in (None, "auto"):
            raise ValueError("false (at most one call) is not supported with tool_choice auto, under which every "
                             "call the answer writes is read; send it without parallel_tool_calls, or with "
                             "tool_choice required or a named function (one call)")
        return parallel

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
