"""The export yaml, validated at the edge into typed config objects.

Each section is a dataclass; `_build` checks keys, types and required fields against the
dataclass itself, so the schema is written once. Errors name the file, the key and what is allowed.
"""
from __future__ import annotations

import dataclasses
import os
import re
import typing
from dataclasses import dataclass, field
from typing import Optional, Union

import yaml

from lite_runtime.contract.errors import ConfigError
from lite_runtime.contract.families import KV_MODES
from lite_runtime.contract.quant import EMBEDDING_SCHEMES, GROUP_SIZES, HEAD_SCHEMES, PER_CHANNEL, WEIGHT_SCHEMES
from lite_runtime.contract.segments import COLLECTIVE_FORMS
from exporter.config.mindformers import from_mindformers, is_mindformers_yaml

COMPUTE_DTYPES = ("float32", "float16")
TARGETS = ("cpu", "ascend")
ATTENTION_FORMS = ("graph", "kernel", "paged")
NOT_YAML_KEYS = ("source", "output_dir_default", "segments_by_size")   # ExportConfig fields a yaml cannot set
_FLOAT_TEXT = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?")


@dataclass
class ModelSection:
    family: Optional[str] = None            # e.g. llama, bloom, gpt2; taken from hf_dir/config.json when absent
    hf_dir: Optional[str] = None            # Hugging Face folder: config.json, *.safetensors, tokenizer files
    gguf: Optional[str] = None              # a GGUF file (llama.cpp's): sizes, tokenizer, chat template, tensors
    vocab_size: Optional[int] = None
    hidden_size: Optional[int] = None
    num_layers: Optional[int] = None
    n_heads: Optional[int] = None
    n_kv_heads: Optional[int] = None
    intermediate_size: Optional[int] = None
    norm_eps: Optional[float] = None        # RMSNorm / LayerNorm epsilon
    rms_norm_eps: Optional[float] = None    # the same, under Llama's name
    rope_theta: Optional[float] = None
    max_position_embeddings: Optional[int] = None
    tie_word_embeddings: Optional[bool] = None
    positions: Optional[str] = None         # position scheme where a family has two (baichuan2: rotary | alibi)
    bias: Optional[bool] = None             # q, k, v and o biases where a family has both shapes (internlm, llama)
    mlp_bias: Optional[bool] = None         # biases of the MLP's linears where a family has both shapes (llama)
    bos_token_id: Optional[int] = None
    eos_token_id: Optional[Union[int, list]] = None
    pad_token_id: Optional[int] = None
    mask_token_id: Optional[int] = None     # GLM v1 (glm): [MASK] and [gMASK], whose index in a prompt is the
    gmask_token_id: Optional[int] = None    # position of generated tokens (the runtime's feed builder reads them)
    tokenizer: Optional[str] = None         # tokenizer.model / tokenizer.json / *.tiktoken to ship
    adapter: Optional[str] = None           # a Hugging Face PEFT LoRA folder, merged into the weights
    pet_config: Optional[dict] = None       # MindFormers LoRA: {pet_type: lora, lora_rank, lora_alpha, ...};
                                            # SLoRA: {pet_type: slora, adapter_path: lora_adapter.json}

    def __post_init__(self):
        if self.rms_norm_eps is not None and self.norm_eps is None:
            self.norm_eps = self.rms_norm_eps


@dataclass
class ParallelSection:
    model_parallel: int = 1
    data_parallel: int = 1
    pipeline_stage: int = 1
    # graph: in each rank's graphs (MindSpore, Ascend); host: each rank's step as segments, one per
    # attention or MLP block (Lite on CPU; on one rank too: each .ms far below Lite's 2 GB limit).
    # None: chosen by the export's target (ExportConfig._choose_form; target cpu on one rank may still
    # be written as segments: the export plan, exporter/writing/export_plan.py, decides by the model's size)
    collectives: Optional[str] = None


@dataclass
class QuantizationSection:
    """Weight-only quantization of the linear layers, run by the project's Lite kernels (target cpu), or
    by Lite's converter for GE (target ascend, int8)."""
    # none (Lite's MatMul) | float32 (the project's kernels) | int8 (groups, or per channel) | int4 (groups);
    # None: by target (ExportConfig._check_quantization)
    weights: Optional[str] = None
    group_size: int = 32         # weights per scale along the input; int8 also -1: one scale per output channel
    # float32 | int8; None: as the weights (int8 where they are int8 or int4, as llama.cpp's types quantize both;
    # float32 otherwise, and on target ascend). A tied head reads the embedding's table when both are alike.
    head: Optional[str] = None
    embedding: Optional[str] = None   # the token embedding's table, int8 as the layers' storage

    def __post_init__(self):
        if self.weights is not None and self.weights not in WEIGHT_SCHEMES:
            raise ConfigError(f"quantization.weights {self.weights!r} is not allowed; allowed: "
                              f"{', '.join(WEIGHT_SCHEMES)}")
        if self.head is not None and self.head not in HEAD_SCHEMES:
            raise ConfigError(f"quantization.head {self.head!r} is not allowed; allowed: {', '.join(HEAD_SCHEMES)}")
        if self.embedding is not None and self.embedding not in EMBEDDING_SCHEMES:
            raise ConfigError(f"quantization.embedding {self.embedding!r} is not allowed; allowed: "
                              f"{', '.join(EMBEDDING_SCHEMES)}")
        if self.weights in ("none", "float32"):
            self.follow_weights(ascend=False)
        for key in ("head", "embedding"):
            if getattr(self, key) not in (None, "float32") and self.weights not in ("int8", "int4"):
                raise ConfigError(f"quantization.{key} {getattr(self, key)} needs quantized weights "
                                  f"(quantization.weights int8 or int4, not {self.weights or 'the default'})")
        if self.group_size not in GROUP_SIZES + ((PER_CHANNEL,) if self.weights == "int8" else ()):
            raise ConfigError(f"quantization.group_size {self.group_size!r} is not allowed; allowed: "
                              f"{', '.join(map(str, GROUP_SIZES))}, or with weights int8 {PER_CHANNEL} (one scale "
                              "per output channel)")

    def follow_weights(self, ascend: bool) -> None:
        """The head's and the embedding's storage where the config leaves them out: int8 beside int8 or int4
        weights on the kernels (SmolLM2-135M: top-1 agreement with float32 the same with them int8 or float32,
        docs/quantization.md), float32 otherwise (on Ascend Lite's converter keeps them float32)."""
        default = "int8" if self.weights in ("int8", "int4") and not ascend else "float32"
        self.head = self.head or default
        self.embedding = self.embedding or default


@dataclass
class InferSection:
    """Upstream-compatible `infer:` keys."""
    prefill_model_path: Optional[str] = None     # extra copy of the rank-0 prefill graph
    increment_model_path: Optional[str] = None   # extra copy of the rank-0 increment graph
    infer_seq_length: Optional[int] = None
    ge_config_path: Optional[str] = None         # shipped in the export as config.ini
    model_type: str = "mindir"                   # upstream's graph format key; MindIR is the only one

    def __post_init__(self):
        if str(self.model_type).lower() != "mindir":
            raise ConfigError(f"infer.model_type {self.model_type!r} is not supported; allowed: mindir")


@dataclass
class ExportConfig:
    output_dir: str
    model: ModelSection = field(default_factory=ModelSection)
    load_checkpoint: Optional[str] = None
    src_strategy_path_or_dir: Optional[str] = None   # MindSpore strategy file(s) of rank_{i} shards: merged, re-split
    auto_trans_ckpt: bool = False                # upstream's switch for the above; a strategy alone is enough here
    seq_length: Optional[int] = None
    batch_size: int = 1
    use_past: bool = True
    target: Optional[str] = None                 # cpu | ascend: where it will run; chooses the three keys below
    kv_cache: Optional[str] = None               # io | in_graph | packed; None: by target
    compute_dtype: str = "float32"
    lite_ms: Optional[bool] = None               # also write Lite's own .ms model of each graph; None: by target
    parallel: ParallelSection = field(default_factory=ParallelSection)
    quantization: QuantizationSection = field(default_factory=QuantizationSection)
    # graph | kernel | paged: the packed step's attention as graph ops, or one Custom node of the project's Lite
    # kernels reading each token's own cache row in place (kernel: host arrays fed and returned; paged: the
    # kernels' store of blocks, allocated once, written by the node), with the layers' norms, MLP activations and
    # rotary as nodes of those kernels too (Lite on CPU only); None: for target cpu paged where the step runs on
    # Lite (one graph on one rank, or step segments), else kernel
    attention: Optional[str] = None
    infer: InferSection = field(default_factory=InferSection)
    source: str = "<dict>"                       # the yaml file, for messages; not a yaml key
    output_dir_default: bool = False             # output_dir is MindFormers' default (the run yaml sets none); not a yaml key
    segments_by_size: bool = False               # target cpu chose one rank's graph: segments if it is too large for one .ms

    def __post_init__(self):
        where = self.source
        if self.kv_cache == "dynamic":
            raise ConfigError(f"{where}: kv_cache dynamic is retired: kv_cache packed does the same for every family, "
                              f"form and runtime; allowed: {', '.join(KV_MODES)}")
        self._choose_form()
        if self.kv_cache not in KV_MODES:
            raise ConfigError(f"{where}: kv_cache {self.kv_cache!r} is not allowed; allowed: {', '.join(KV_MODES)}")
        if self.compute_dtype not in COMPUTE_DTYPES:
            raise ConfigError(f"{where}: compute_dtype {self.compute_dtype!r} is not allowed; "
                              f"allowed: {', '.join(COMPUTE_DTYPES)}")
        if not self.use_past:
            raise ConfigError(f"{where}: use_past false is not supported: the export always writes a prefill "
                              "and an increment graph with a KV cache; remove the key or set it to true")
        infer_len = self.infer.infer_seq_length
        if self.seq_length is None:
            self.seq_length = infer_len
        if self.seq_length is None:
            raise ConfigError(f"{where}: missing required key seq_length (or infer.infer_seq_length)")
        if infer_len is not None and infer_len != self.seq_length:
            raise ConfigError(f"{where}: infer.infer_seq_length {infer_len} disagrees with seq_length "
                              f"{self.seq_length}; give one of them or make them equal")
        for key, value in (("seq_length", self.seq_length), ("batch_size", self.batch_size),
                           ("parallel.model_parallel", self.parallel.model_parallel)):
            if value < 1:
                raise ConfigError(f"{where}: {key} must be at least 1, got {value}")
        for key in ("data_parallel", "pipeline_stage"):
            if getattr(self.parallel, key) != 1:
                raise ConfigError(f"{where}: parallel.{key} {getattr(self.parallel, key)} is not supported "
                                  "for inference export; allowed: 1 (use model_parallel to split a model)")
        self._check_collectives()
        if self.kv_cache == "packed" and self.parallel.model_parallel > 1 and self.parallel.collectives == "graph":
            raise ConfigError(f"{where}: kv_cache {self.kv_cache} with parallel.model_parallel "
                              f"{self.parallel.model_parallel} needs parallel.collectives: host (segments for "
                              "MindSpore Lite on CPU); or use kv_cache io")
        if self.kv_cache == "packed":
            for key in ("prefill_model_path", "increment_model_path"):
                if getattr(self.infer, key):
                    raise ConfigError(f"{where}: infer.{key} needs the two graphs of kv_cache io or in_graph; "
                                      f"kv_cache {self.kv_cache} writes one graph (mindir_step/rank_0_graph.mindir)")
        if self.lite_ms and (self.kv_cache == "in_graph" or self.parallel.collectives == "graph"
                             and self.parallel.model_parallel > 1):
            raise ConfigError(f"{where}: lite_ms: true is for MindSpore Lite on CPU, which runs kv_cache io or packed "
                              f"on one rank or as segments (parallel.collectives: host); this config has kv_cache "
                              f"{self.kv_cache} and model_parallel {self.parallel.model_parallel}")
        self._check_quantization()
        self._check_attention()
        strategy = self.src_strategy_path_or_dir
        if strategy and not os.path.exists(strategy):
            raise ConfigError(f"{where}: src_strategy_path_or_dir {strategy} does not exist (a MindSpore strategy "
                              "file, or a folder of them, written by the training run of the rank_{i} shards)")
        if self.model.hf_dir is None and self.model.gguf is None and self.model.family is None:
            raise ConfigError(f"{where}: model needs hf_dir (a Hugging Face folder), gguf (a GGUF file) or family "
                              "and the model sizes")
        if self.model.hf_dir is not None and self.model.gguf is not None:
            raise ConfigError(f"{where}: give model.hf_dir or model.gguf, not both")

    def _choose_form(self) -> None:
        """The keys not given, from `target`: on Ascend (and without a target, as upstream) the two
        graphs of kv_cache io, which the official API and GE run; on Lite CPU one step graph (one weight
        copy, prompts at their own length, each token computed once: kv_cache packed), converted to
        .ms, as segments when there are several ranks or one rank's weights exceed a .ms (decided by
        the export plan, once the sizes are known: `segments_by_size` hands the choice on).
        A yaml asking for upstream's two graph copies (infer: paths) keeps the two graphs."""
        if self.target is not None and self.target not in TARGETS:
            raise ConfigError(f"{self.source}: target {self.target!r} is not allowed; allowed: {', '.join(TARGETS)}")
        cpu = self.target == "cpu"
        two_graphs = bool(self.infer.prefill_model_path or self.infer.increment_model_path)
        if self.kv_cache is None:
            self.kv_cache = "packed" if cpu and self.compute_dtype == "float32" and not two_graphs else "io"
        if cpu and self.parallel.model_parallel > 1 and self.kv_cache != "packed":
            raise ConfigError(f"{self.source}: target cpu with parallel.model_parallel {self.parallel.model_parallel} "
                              "needs kv_cache packed and compute_dtype float32 (MindSpore Lite on CPU runs "
                              "several ranks only as step segments); this config has kv_cache "
                              f"{self.kv_cache} and compute_dtype {self.compute_dtype}")
        if self.parallel.collectives is None:
            step_on_cpu = cpu and self.kv_cache == "packed"
            self.parallel.collectives = "host" if step_on_cpu and self.parallel.model_parallel > 1 else "graph"
            self.segments_by_size = step_on_cpu and self.parallel.model_parallel == 1
        if self.lite_ms is None:
            self.lite_ms = cpu

    def _check_collectives(self) -> None:
        form, where = self.parallel.collectives, self.source
        if form not in COLLECTIVE_FORMS:
            raise ConfigError(f"{where}: parallel.collectives {form!r} is not allowed; allowed: "
                              f"{', '.join(COLLECTIVE_FORMS)}")
        if form == "host":
            needs = [f"{key} {value}" for key, value, allowed in (
                ("kv_cache", self.kv_cache, self.kv_cache == "packed"),
                ("compute_dtype", self.compute_dtype, self.compute_dtype == "float32")) if not allowed]
            if needs:
                raise ConfigError(f"{where}: parallel.collectives: host cuts each rank's step into segments "
                                  "and needs kv_cache packed and compute_dtype float32; this "
                                  f"config has {', '.join(needs)}")

    def _check_attention(self) -> None:
        """The packed step's attention on the project's kernel where the export is for Lite on CPU: each token reads
        its own row's cache in place (faster than the graph's attention: docs/measured-choices.md)."""
        if self.attention is None:
            on_lite = self.world_size == 1 or self.parallel.collectives == "host"      # not ranks' graphs
            self.attention = ("paged" if on_lite else "kernel") if self._step_on_cpu else "graph"
        if self.attention not in ATTENTION_FORMS:
            raise ConfigError(f"{self.source}: attention {self.attention!r} is not allowed; allowed: "
                              f"{', '.join(ATTENTION_FORMS)}")
        needs = [f"{key} {value}" for key, value, allowed in (
            ("target", self.target, self.target != "ascend"), ("kv_cache", self.kv_cache, self.kv_cache == "packed"),
            ("compute_dtype", self.compute_dtype, self.compute_dtype == "float32")) if not allowed]
        if self.attention_on_kernel and needs:
            raise ConfigError(f"{self.source}: attention {self.attention} is a Custom node that the project's kernels "
                              "run on MindSpore Lite on CPU, in the packed step: it needs kv_cache packed and "
                              f"compute_dtype float32, not target ascend; this config has {', '.join(needs)}")

    @property
    def attention_on_kernel(self) -> bool:
        """The packed step's attention is a node of the project's kernels: reading host arrays, or the paged store."""
        return self.attention in ("kernel", "paged")

    def _check_quantization(self) -> None:
        """Quantized linear layers are Custom nodes that only the project's kernels run (Lite on CPU); on
        Ascend, Lite's converter quantizes the float graphs' weights for GE (lite_runtime/ascend/weight_quant.py)."""
        q = self.quantization
        if q.weights is None:      # float32 products on the kernels: on CPU at least Lite's MatMul's speed (docs)
            q.weights = "float32" if self._step_on_cpu else "none"
        q.follow_weights(ascend=self.target == "ascend")
        if q.weights == "none":
            return
        if self.target == "ascend":
            needs = [f"quantization.{key} {value}" for key, value, allowed in (
                ("weights", q.weights, "int8"), ("head", q.head, "float32"), ("embedding", q.embedding, "float32"))
                if value != allowed]
            needs += [f"quantization.group_size {q.group_size}"] if q.group_size not in (32, PER_CHANNEL) else []
            if needs:
                raise ConfigError(f"{self.source}: on target ascend MindSpore Lite's converter quantizes the weights "
                                  "for GE: quantization.weights int8 (per output channel: group_size -1 or left out), "
                                  f"with the head and the embedding float32; this config has {', '.join(needs)}")
            return
        needs = [f"{key} {value}" for key, value, allowed in (
            ("target", self.target, self.target == "cpu"),
            ("compute_dtype", self.compute_dtype, self.compute_dtype == "float32")) if not allowed]
        if needs:
            raise ConfigError(f"{self.source}: quantization.weights {q.weights} runs on MindSpore Lite on CPU with "
                              "the project's kernels and needs target cpu and compute_dtype float32 (or target "
                              f"ascend, int8 only: Lite's converter quantizes for GE); this config has {', '.join(needs)}")

    @property
    def _step_on_cpu(self) -> bool:
        """The packed step for Lite on CPU: where the project's kernels run by default."""
        return self.target == "cpu" and self.kv_cache == "packed" and self.compute_dtype == "float32"

    @property
    def converter_quantizes(self) -> bool:
        """Lite's converter quantizes the weights on the Ascend server; the graphs stay float."""
        return self.target == "ascend" and self.quantization.weights != "none"

    @property
    def kernel_quantization(self) -> QuantizationSection:
        """What the project's kernels run: float32 when Lite's converter quantizes instead."""
        return QuantizationSection("none") if self.converter_quantizes else self.quantization

    @property
    def world_size(self) -> int:
        return self.parallel.model_parallel


def load_config(path: str) -> ExportConfig:
    """Read and validate an export yaml.

    Relative input paths (hf_dir, load_checkpoint, tokenizer, ge_config_path) are taken from the
    yaml's folder, so a model folder is self-contained; output paths from the working directory.
    """
    if not os.path.isfile(path):
        raise ConfigError(f"config file {path} does not exist")
    try:
        with open(path, encoding="utf-8") as f:
            data = yaml.safe_load(f)
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid yaml: {_yaml_problem(e)}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of keys at the top level, got {type(data).__name__}")
    output_dir_default = False
    if is_mindformers_yaml(data):
        output_dir_default = not data.get("output_dir")
        data = from_mindformers(data, path)
    config = config_from_dict(data, source=path)
    config.output_dir_default = output_dir_default
    _resolve_paths(config, os.path.dirname(os.path.abspath(path)))
    return config


def _yaml_problem(error: yaml.YAMLError) -> str:
    """One line for a yaml syntax error: where it is and what is wrong (PyYAML's text spans lines)."""
    mark = getattr(error, "problem_mark", None)
    problem = getattr(error, "problem", None) or str(error)
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
    return where + " ".join(str(problem).split())


def config_from_dict(data: dict, source: str = "<dict>") -> ExportConfig:
    return _build(ExportConfig, dict(data), source, "", extra={"source": source})


def find_model_dir_config(model_dir: str) -> str:
    """`--model_dir`: a folder holding exactly one yaml."""
    if not os.path.isdir(model_dir):
        raise ConfigError(f"--model_dir {model_dir} is not a folder")
    yamls = sorted(n for n in os.listdir(model_dir) if n.endswith((".yaml", ".yml")))
    if len(yamls) != 1:
        raise ConfigError(f"--model_dir {model_dir} must hold exactly one .yaml file, found "
                          f"{len(yamls)}: {', '.join(yamls) or 'none'}")
    return os.path.join(model_dir, yamls[0])


def _build(cls, data: dict, source: str, prefix: str, extra: Optional[dict] = None):
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.name not in NOT_YAML_KEYS}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise ConfigError(f"{source}: unknown key {prefix}{unknown[0]}; allowed keys"
                          f"{' in ' + prefix.rstrip('.') if prefix else ''}: {', '.join(fields)}")
    kwargs = dict(extra or {})
    for name, f in fields.items():
        key = prefix + name
        if name not in data:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise ConfigError(f"{source}: missing required key {key}")
            continue
        value, hint = data[name], hints[name]
        if dataclasses.is_dataclass(hint):
            if not isinstance(value, dict):
                raise ConfigError(f"{source}: {key} must be a mapping of keys, got {value!r}")
            kwargs[name] = _build(hint, value, source, key + ".")
        else:
            kwargs[name] = _check_type(value, hint, source, key)
    try:
        return cls(**kwargs)
    except ConfigError as e:
        raise ConfigError(str(e) if str(e).startswith(source) else f"{source}: {e}") from None


def _check_type(value, hint, source: str, key: str):
    args = typing.get_args(hint)
    allowed = [a for a in args if a is not type(None)] if typing.get_origin(hint) is Union else [hint]
    if value is None and type(None) in args:
        return None
    for typ in allowed:
        if typ is float and isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if typ is float and isinstance(value, str) and _FLOAT_TEXT.fullmatch(value.strip()):
            return float(value)   # YAML 1.1 reads `1e-5` (no dot) as a string
        if typ is int and isinstance(value, bool):
            continue
        if isinstance(value, typ):
            return value
    names = " or ".join("list" if t is list else t.__name__ for t in allowed)
    raise ConfigError(f"{source}: {key} must be {names}, got {value!r} ({type(value).__name__})")


def _resolve_paths(config: ExportConfig, base: str) -> None:
    def resolve(p, folder):
        return p if p is None else os.path.normpath(os.path.join(folder, os.path.expanduser(p)))
    config.load_checkpoint = resolve(config.load_checkpoint, base)
    config.model.hf_dir = resolve(config.model.hf_dir, base)
    config.model.gguf = resolve(config.model.gguf, base)
    config.model.tokenizer = resolve(config.model.tokenizer, base)
    config.model.adapter = resolve(config.model.adapter, base)
    config.infer.ge_config_path = resolve(config.infer.ge_config_path, base)
    config.src_strategy_path_or_dir = resolve(config.src_strategy_path_or_dir, base)
    pet = config.model.pet_config
    if isinstance(pet, dict) and isinstance(pet.get("adapter_path"), str):      # SLoRA's lora_adapter.json
        config.model.pet_config = dict(pet, adapter_path=resolve(pet["adapter_path"], base))
    cwd = os.getcwd()
    config.output_dir = resolve(config.output_dir, cwd)
    config.infer.prefill_model_path = resolve(config.infer.prefill_model_path, cwd)
    config.infer.increment_model_path = resolve(config.infer.increment_model_path, cwd)
