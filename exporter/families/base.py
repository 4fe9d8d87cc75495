"""What a family declares, and the registry of families (filled by the `@register_family` decorator).

A family is a class with class attributes only: its names, the Hugging Face `model_type`s and
MindFormers class names it answers to, its fixed features, how to read its config files, and
its two weight plans. The network is the shared decoder (models/decoder.py) built from the
`DecoderConfig` the family returns.
"""
from __future__ import annotations

from typing import Dict, List, Optional, Tuple, Type

from lite_runtime.contract.errors import ConfigError, UnsupportedError
from lite_runtime.contract.families import FAMILIES as RUNTIME_FAMILIES, FamilySpec, known_families

from exporter.models.config import DecoderConfig
from exporter.weights.plan import WeightPlan

# Special token ids a family's runtime row inputs are found by (GLM v1's [MASK] / [gMASK]): declared
# in the runtime's FamilySpec.row_input_tokens, written to the manifest's model_config, not network sizes.
TOKEN_KEYS = tuple(dict.fromkeys(name for spec in RUNTIME_FAMILIES.values() for name, _ in spec.row_input_tokens))
# Yaml `model:` keys that size a model, shared by every family (the DecoderConfig field names), and the
# TOKEN_KEYS, which other families than their own refuse.
SIZE_KEYS = ("vocab_size", "hidden_size", "num_layers", "n_heads", "n_kv_heads", "intermediate_size",
             "norm_eps", "rope_theta", "max_position_embeddings", "tie_word_embeddings") + TOKEN_KEYS
# Yaml `model:` keys that choose between the shapes of one family (`Family.variants`), e.g. Baichuan2's
# `positions: alibi` (13B), InternLM's `bias: false` (20B) or Llama's `mlp_bias: true`; other families refuse them.
VARIANT_KEYS = ("positions", "bias", "mlp_bias")


class Family:
    spec: FamilySpec = None                    # the runtime contract's declaration: names, aliases, graph inputs
    name: str = ""                             # spec.name and spec.aliases, set when registered
    aliases: Tuple[str, ...] = ()
    hf_model_types: Tuple[str, ...] = ()       # config.json model_type values
    mindformers_types: Tuple[str, ...] = ()    # MindFormers arch / config class names
    mindformers_variants: Dict[str, Dict[str, object]] = {}   # MindFormers arch type -> VARIANT_KEYS values
    features: Dict[str, object] = {}           # DecoderConfig feature fields fixed by the family
    variants: Dict[str, Dict[object, Dict[str, object]]] = {}   # VARIANT_KEYS key -> value -> features
    hf_weights: WeightPlan = WeightPlan([])
    mindformers_weights: WeightPlan = WeightPlan([])
    tokenizer_special_tokens: Tuple[str, ...] = ()   # strings encoded as single ids (added after the pieces)
    tokenizer_prefix: Tuple[str, ...] = ()           # tokens before every prompt instead of BOS

    @classmethod
    def tokenizer_options(cls) -> Dict[str, List[str]]:
        """load_tokenizer() keyword arguments the runtime needs for this family (kept in the manifest)."""
        options = {"special_tokens": list(cls.tokenizer_special_tokens), "prefix_tokens": list(cls.tokenizer_prefix)}
        return {k: v for k, v in options.items() if v}

    @classmethod
    def config(cls, sizes: Dict[str, object], where: str) -> DecoderConfig:
        """A DecoderConfig from size keys (yaml `model:` section or a translated config file)."""
        values = {k: v for k, v in sizes.items() if v is not None and k not in TOKEN_KEYS}
        foreign = [k for k in TOKEN_KEYS if sizes.get(k) is not None and k not in dict(cls.spec.row_input_tokens)]
        if foreign:
            readers = ", ".join(f.name for f in FAMILIES.values() if foreign[0] in dict(f.spec.row_input_tokens))
            raise ConfigError(f"{where}: model.{foreign[0]} is not read for a {cls.name} model; families that "
                              f"read it: {readers}")
        missing = [k for k in ("vocab_size", "hidden_size", "num_layers", "n_heads") if k not in values]
        if missing:
            raise ConfigError(f"{where}: missing required key model.{missing[0]} for a {cls.name} model "
                              "(give it in the model section or point model.hf_dir at a folder with config.json)")
        values.setdefault("intermediate_size", cls.default_intermediate_size(int(values["hidden_size"])))
        features = dict(cls.features)
        for key in VARIANT_KEYS:
            if key not in values:
                continue
            choice, allowed = values.pop(key), cls.variants.get(key)
            if allowed is None:
                readers = ", ".join(f.name for f in FAMILIES.values() if key in f.variants)
                raise ConfigError(f"{where}: model.{key} is not read for a {cls.name} model (it has one shape); "
                                  f"families with a choice of model.{key}: {readers}")
            if choice not in allowed:
                raise ConfigError(f"{where}: model.{key} {choice!r} is not allowed for {cls.name}; allowed: "
                                  f"{', '.join(str(a).lower() if isinstance(a, bool) else str(a) for a in allowed)}")
            features.update(allowed[choice])
        return DecoderConfig(**dict(features, **values))

    @classmethod
    def default_intermediate_size(cls, hidden: int) -> int:
        return 4 * hidden

    hf_keys: Dict[str, str] = {}               # config.json key -> size key
    mindformers_keys: Dict[str, str] = {}      # model_config key -> size key
    mindformers_required: Dict[str, tuple] = {}   # model_config keys accepted at these values only
    mindformers_also_read: Tuple[str, ...] = ()   # model_config keys the family's from_mindformers reads itself

    @classmethod
    def from_hf(cls, hf: dict, where: str) -> Dict[str, object]:
        """Size keys from a Hugging Face config.json (already read); refuses what changes the math."""
        cls.check_hf(hf, where)
        return {ours: hf[key] for key, ours in cls.hf_keys.items() if hf.get(key) is not None}

    @classmethod
    def claims_hf(cls, hf: dict) -> bool:
        """Whether a config.json of one of hf_model_types is this family's: families sharing a model_type
        (ChatGLM-6B's `glm` and ChatGLM2/3's `glm2` both read `chatglm`) tell their folders apart here."""
        return True

    @classmethod
    def check_hf(cls, hf: dict, where: str) -> None:
        """Refuse config.json settings this family's network does not compute."""

    @classmethod
    def from_mindformers(cls, model_config: dict, where: str) -> Dict[str, object]:
        """Size keys from a MindFormers `model.model_config` section."""
        for key, allowed in cls.mindformers_required.items():
            if key in model_config and model_config[key] not in allowed:
                raise UnsupportedError(f"{where}: model.model_config.{key} {model_config[key]!r} is not supported "
                                       f"for {cls.name}; allowed: {', '.join(repr(a) for a in allowed)}")
        return {ours: model_config[key] for key, ours in cls.mindformers_keys.items()
                if model_config.get(key) is not None}


FAMILIES: Dict[str, Type[Family]] = {}


def register_family(cls: Type[Family]) -> Type[Family]:
    """Register a family under the names of its runtime spec (the one place they are written)."""
    if not isinstance(cls.__dict__.get("spec"), FamilySpec):
        raise TypeError(f"family class {cls.__name__} has no spec of its own (its FamilySpec in lite_runtime/contract/families.py)")
    if cls.spec.name in FAMILIES:
        raise ValueError(f"family {cls.spec.name!r} registered twice")
    cls.name, cls.aliases = cls.spec.name, cls.spec.aliases
    FAMILIES[cls.name] = cls
    return cls


def _lookup(field: str, value: str) -> Optional[Type[Family]]:
    return next((f for f in FAMILIES.values() if value in getattr(f, field)), None)


def family_by_name(name: str, where: str) -> Type[Family]:
    found = FAMILIES.get(name) or _lookup("aliases", name)
    if found is None:
        raise UnsupportedError(f"{where}: unknown model family {name!r}; known families: {describe_families()}")
    return found


def family_by_hf_type(model_type, where: str, hf: Optional[dict] = None) -> Type[Family]:
    """The family of a config.json's model_type; `hf` (the config, else none of its keys) picks among
    families sharing it."""
    found = next((f for f in FAMILIES.values() if model_type in f.hf_model_types and f.claims_hf(hf or {})), None)
    if found is None:
        known = ", ".join(dict.fromkeys(t for f in FAMILIES.values() for t in f.hf_model_types))   # glm, glm2 share one
        raise UnsupportedError(f"{where}: model_type {model_type!r} is not supported; supported: {known}")
    return found


def family_by_mindformers_type(arch, where: str) -> Type[Family]:
    found = _lookup("mindformers_types", arch)
    if found is None:
        known = ", ".join(t for f in FAMILIES.values() for t in f.mindformers_types)
        raise UnsupportedError(f"{where}: MindFormers model type {arch!r} is not supported; supported: {known}")
    return found


def describe_families() -> str:
    return known_families()


def family_table() -> List[Tuple[str, str, str, str]]:
    """(name, aliases, HF model_types, MindFormers types) per family, for `--list_families`."""
    return [(f.name, ", ".join(f.aliases), ", ".join(f.hf_model_types), ", ".join(f.mindformers_types))
            for f in sorted(FAMILIES.values(), key=lambda f: f.name)]


def refuse_true(hf: dict, keys, where: str, family: str) -> None:
    for key in keys:
        if hf.get(key):
            raise UnsupportedError(f"{where}: {key} {hf[key]!r} is not supported by the {family} family; allowed: false")
