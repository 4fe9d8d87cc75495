"""OpenAI request bodies, with OpenAI's meanings and ranges, and their translation into engine
requests. A body that breaks a rule is answered 400 with OpenAI's error object naming the field."""
from __future__ import annotations

import dataclasses
import json
from typing import Annotated, Any, Dict, List, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, field_validator

from lite_runtime.decode.constraints import choice_regex
from lite_runtime.decode.sampling import SamplingParams, for_sequence

MAX_CHOICES = 16

# Fields of OpenAI's, vLLM's (and TGI's) requests that are not built here: (is the value one that
# changes nothing?, what to say). Anything else is refused: ignoring it would answer something not asked for.
NOT_BUILT = {
    "tools": (lambda v: not v, "tools are for chat: send them to /v1/chat/completions"),
    "tool_choice": (lambda v: v in (None, "none", "auto"), "tool_choice is for chat: send it to /v1/chat/completions"),
    "response_format": (lambda v: not v or v.get("type") in ("text", "json_object", "json_schema"),
                        "allowed types: text, json_object, json_schema"),
    "suffix": (lambda v: not v, "insertion after the completion is not supported; send the request without suffix"),
    # vLLM's, on both routes
    "use_beam_search": (lambda v: not v, "beam search is not supported; each choice is generated on its own"),
    "length_penalty": (lambda v: v in (None, 1, 1.0), "it weighs beam search's candidates, and beam search is not "
                                                      "supported; allowed: 1.0"),
    "logits_processors": (lambda v: not v, "custom logits processors are not supported by this server"),
    "allowed_token_ids": (lambda v: not v, "restricting the vocabulary is not supported; guided_choice, "
                                           "guided_regex or logit_bias hold the answer instead"),
    "bad_words": (lambda v: not v, "banned words are not supported; logit_bias -100 on their tokens comes close"),
    "include_stop_str_in_output": (lambda v: not v, "stop strings and stop tokens are never part of the text here"),
    "skip_special_tokens": (lambda v: v in (None, True), "special tokens are always left out of the text here"),
    "prompt_logprobs": (lambda v: v is None, "the prompt's logprobs are not reported by these routes"),
    "return_tokens_as_token_ids": (lambda v: not v, "logprob tokens are reported as their text here"),
    "return_token_ids": (lambda v: not v, "token ids are not reported by these routes"),
    "guided_grammar": (lambda v: v is None, "grammars are not supported; guided_json, guided_regex and "
                                            "guided_choice are"),
    "guided_whitespace_pattern": (lambda v: v is None, "JSON answers have no free whitespace here (as json.dumps "
                                                       "writes them)"),
    "structural_tag": (lambda v: v is None, "structural tags are not supported; guided_json, guided_regex and "
                                            "guided_choice are"),
    "structured_outputs": (lambda v: v is None, "vLLM's newer form is not supported; send guided_json, "
                                                "guided_regex, guided_choice or response_format"),
    # vLLM's, on chat
    "echo": (lambda v: not v, "prepending the last message to a chat answer is not supported"),
    "add_generation_prompt": (lambda v: v in (None, True), "the prompt always ends with the template's "
                                                           "generation prompt"),
    "continue_final_message": (lambda v: not v, "continuing the last message is not supported; the answer is a new "
                                                "message"),
    "chat_template": (lambda v: not v, "the export's own chat template renders the prompt"),
    "chat_template_kwargs": (lambda v: not v, "the export's chat template is rendered with its usual variables only"),
    "documents": (lambda v: not v, "documents are not rendered into the prompt by this server"),
    # OpenAI's, on chat
    "functions": (lambda v: not v, "OpenAI's deprecated functions are not supported; send tools"),
    "function_call": (lambda v: not v, "OpenAI's deprecated function_call is not supported; send tool_choice"),
    "modalities": (lambda v: v in (None, ["text"]), "answers are text only"),
    "audio": (lambda v: not v, "answers are text only"),
    "reasoning_effort": (lambda v: v is None, "not supported for these models"),
    "verbosity": (lambda v: v is None, "not supported for these models"),
    "web_search_options": (lambda v: v is None, "web search is not supported by this server"),
    # vLLM's, on completions
    "prompt_embeds": (lambda v: v is None, "prompts are text or token ids here"),
    # TGI's
    "best_of": (lambda v: v in (None, 1), "only 1 is supported (each choice generated is returned)"),
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


@dataclasses.dataclass(frozen=True)
class Guide:
    """A field of a request that holds its answer: to a JSON schema (`schema`, None for any JSON object)
    or, when `regex` is given, to text the regular expression matches whole."""
    field: str              # the field, as errors name it
    what: str               # how messages name it
    schema: Optional[dict] = None
    regex: Optional[str] = None


class SamplingFields(BaseModel):
    """The fields completions and chat share. Unknown fields are ignored (clients send `user`,
    `metadata`, ...), but those that would change the answer and are not built here are refused
    (NOT_BUILT; docs/serve.md lists both kinds)."""
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
    guided_json: Optional[Dict[str, Any]] = None          # vLLM's: a JSON schema (or JSON text of one)
    guided_choice: Optional[List[str]] = None             # vLLM's: the answer is one of these strings
    stop_token_ids: Optional[List[int]] = None            # vLLM's: these ids end the answer too, as EOS does
    truncate_prompt_tokens: Optional[int] = Field(None, ge=1)   # vLLM's: only the prompt's last k tokens are read
    best_of: Optional[int] = None                         # equal to n (each choice generated is returned)
    # vLLM's and OpenAI's, not built: refused when they would change the answer
    use_beam_search: Any = None
    length_penalty: Any = None
    logits_processors: Any = None
    allowed_token_ids: Any = None
    bad_words: Any = None
    include_stop_str_in_output: Any = None
    skip_special_tokens: Any = None
    prompt_logprobs: Any = None
    return_tokens_as_token_ids: Any = None
    return_token_ids: Any = None
    guided_grammar: Any = None
    guided_whitespace_pattern: Any = None
    structural_tag: Any = None
    structured_outputs: Any = None

    # its own name: a subclass's `_not_built` replaces one
    _not_built_shared = not_built("response_format", "use_beam_search", "length_penalty", "logits_processors",
                                  "allowed_token_ids", "bad_words", "include_stop_str_in_output",
                                  "skip_special_tokens", "prompt_logprobs", "return_tokens_as_token_ids",
                                  "return_token_ids", "guided_grammar", "guided_whitespace_pattern", "structural_tag",
                                  "structured_outputs")

    @field_validator("best_of")
    @classmethod
    def _best_of_n(cls, best_of, info):
        n = info.data.get("n", 1)
        if best_of is not None and best_of != n:
            raise ValueError(f"{best_of} differs from n ({n}): generating best_of choices and returning the n best "
                             "is not supported; send best_of equal to n, or leave it out")
        return best_of

    @field_validator("guided_json", mode="before")
    @classmethod
    def _a_schema(cls, schema):
        if isinstance(schema, str):
            try:
                schema = json.loads(schema)
            except ValueError as e:
                raise ValueError(f"the text is not JSON ({e}); send a JSON schema, an object or JSON text of "
                                 "one") from None
        if schema is not None and not isinstance(schema, dict):
            raise ValueError(f"a JSON schema is an object (or JSON text of one), not {type(schema).__name__}")
        return schema

    @field_validator("guided_choice", mode="before")
    @classmethod
    def _strings(cls, choices):
        if choices is None:
            return None
        if not isinstance(choices, list) or not choices:
            raise ValueError("expected a list of one or more strings, the answers allowed")
        for i, choice in enumerate(choices):
            if not isinstance(choice, str):
                raise ValueError(f"entry {i} is {choice!r}, not a string; each choice is an answer's whole text")
        return choices

    @field_validator("stop_token_ids", mode="before")
    @classmethod
    def _ids(cls, ids):
        if ids is not None and not (isinstance(ids, list) and
                                    all(isinstance(t, int) and not isinstance(t, bool) for t in ids)):
            raise ValueError("expected a list of token ids (integers)")
        return ids

    def sampling(self) -> SamplingParams:
        greedy = self.temperature == 0.0
        return SamplingParams.of(self, do_sample=not greedy, top_k=max(self.top_k, 0),
                                 temperature=1.0 if greedy else self.temperature)

    def samplings(self, prompts: int) -> List[SamplingParams]:
        """One per choice of `prompts` prompts, in the answer's order (choice j of prompt i is i·n + j): with a seed,
        choice k samples with seed + k (sampling.for_sequence)."""
        one = self.sampling()
        return [for_sequence(one, k) for k in range(prompts * self.n)]

    def guides(self) -> List[Guide]:
        """The fields given that hold the answer (a request may give one of them); ValueError for a
        response_format whose json_schema is not an object."""
        found = []
        wanted, schema = self.json_schema()
        if wanted:
            found.append(Guide("response_format", f"response_format {self.response_format.get('type')!r}", schema))
        if self.guided_json is not None:
            found.append(Guide("guided_json", "guided_json", self.guided_json))
        if self.guided_regex is not None:
            found.append(Guide("guided_regex", "guided_regex", regex=self.guided_regex))
        if self.guided_choice is not None:
            found.append(Guide("guided_choice", "guided_choice", regex=choice_regex(self.guided_choice)))
        return found

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
    tools: Optional[Any] = None                  # chat's (refused here)
    tool_choice: Optional[Any] = None
    add_special_tokens: Any = None               # vLLM's: true by default here (BOS before a text prompt)
    prompt_embeds: Any = None

    _not_built = not_built("suffix", "tools", "tool_choice", "prompt_embeds")

    @field_validator("add_special_tokens")
    @classmethod
    def _special_tokens_added(cls, add):
        if add not in (None, True):
            raise ValueError("a text prompt is always encoded with the tokenizer's special tokens (BOS) here; send "
                             "token ids for a prompt without them")
        return add

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


class DetokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")
    model: Optional[str] = None
    tokens: List[int]


def error_body(message: str, param: Optional[str] = None, kind: str = "invalid_request_error",
               code: Optional[str] = None) -> Dict[str, object]:
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}
