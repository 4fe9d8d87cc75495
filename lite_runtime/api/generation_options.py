"""The options of one generation request (upstream's `infer(...)` keywords), written once: their
defaults, their checks, and the form in which they reach other ranks. `pipeline(...)` keywords,
run_infer_main's options and each call's keywords all become one `GenerationOptions`."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Dict, List, Optional, Union

from lite_runtime.contract.errors import ConfigError, ValidationError
from lite_runtime.decode.sampling import SamplingParams
from lite_runtime.decode.speculation import Speculation


DEFAULT_MAX_LENGTH = 256     # prompt + new tokens when a call gives neither max_length nor max_new_tokens


@dataclass(frozen=True)
class GenerationOptions:
    do_sample: bool = False
    top_k: int = 1                       # upstream's default; with do_sample False the choice is greedy anyway
    top_p: float = 1.0
    temperature: float = 1.0
    repetition_penalty: float = 1.0
    seed: Optional[int] = None
    presence_penalty: float = 0.0        # OpenAI's penalties over the generated tokens
    frequency_penalty: float = 0.0
    min_p: float = 0.0                   # sampling keeps tokens at least min_p x the most likely one's probability
    logit_bias: Optional[Dict[int, float]] = None       # token id -> added to its logit
    min_tokens: int = 0                  # no EOS before this many new tokens
    max_length: Optional[int] = None     # prompt + new tokens (capped by the export's seq_length); None: length_limit
    max_new_tokens: Optional[int] = None
    eos_token_id: Union[int, List[int], None] = None    # None: the export's
    pad_token_id: Optional[int] = None                  # None: the export's
    add_special_tokens: Optional[bool] = None           # None: the prefix the family's prompts need
    truncate: bool = False               # cut prompts longer than the export allows instead of refusing them
    adapter_id: Union[str, List[str], None] = None      # SLoRA adapter name(s); None: the base model
    strict_adapter: bool = False         # refuse an unknown adapter_id instead of running the base model
    is_sample_acceleration: bool = False    # accepted as upstream passes it; sampling is always on the host
    json_schema: Optional[dict] = None   # each answer is JSON following this schema ({}: any JSON object)
    speculative: Optional[str] = None    # "ngram" / "ngram:K": guesses by prompt lookup, verified (same text)

    def __post_init__(self):
        self.sampling()
        if self.json_schema is not None and not isinstance(self.json_schema, dict):
            raise ValidationError(f"json_schema must be a JSON schema (a dict; {{}} for any JSON object), got "
                                  f"{self.json_schema!r}")
        if self.speculative is not None:
            Speculation.parse(self.speculative, "speculative")
        for name in ("max_length", "max_new_tokens"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
                raise ValidationError(f"{name} must be a positive integer or None, got {value!r}")

    def length_limit(self) -> Optional[int]:
        """Prompt + new tokens at most: max_length when given, else DEFAULT_MAX_LENGTH unless max_new_tokens is
        given (then a long prompt is not refused for a length nobody asked for)."""
        if self.max_length is not None or self.max_new_tokens is not None:
            return self.max_length
        return DEFAULT_MAX_LENGTH

    @classmethod
    def keywords(cls) -> List[str]:
        return [f.name for f in dataclasses.fields(cls)]

    def sampling(self) -> SamplingParams:
        return SamplingParams.of(self)

    def updated(self, where: str = "", **keywords) -> "GenerationOptions":
        """These options with `keywords` changed; an unknown keyword is refused, naming the allowed ones."""
        unknown = sorted(set(keywords) - set(self.keywords()))
        if unknown:
            raise ConfigError(f"{where}unknown keyword {unknown[0]!r}; allowed: {', '.join(self.keywords())}")
        return dataclasses.replace(self, **keywords) if keywords else self

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> "GenerationOptions":
        return cls().updated(**data)
