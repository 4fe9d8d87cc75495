"""Resolve the `model:` section (and an optional Hugging Face folder) into what the export needs:
the family, its DecoderConfig, special token ids, tokenizer files and the checkpoint to read."""
from __future__ import annotations

import atexit
import json
import logging
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Type

from lite_runtime.contract.errors import ConfigError
from exporter.config.schema import ExportConfig
from exporter.families import Family, family_by_hf_type, family_by_name
from exporter.families.base import SIZE_KEYS, VARIANT_KEYS
from exporter.models.config import DecoderConfig

log = logging.getLogger("exporter")
_SPECIAL = ("bos_token_id", "eos_token_id", "pad_token_id")
# Tokenizer files looked for in a Hugging Face folder, in order of preference, and their side files
# (the chat template in each place transformers has kept it: its own file, a processor's json, or
# tokenizer_config.json).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "ice_text.model")   # the last: ChatGLM-6B's
TOKENIZER_SIDE_FILES = ("tokenizer_config.json", "special_tokens_map.json", "generation_config.json",
                        "chat_template.jinja", "chat_template.json")


@dataclass
class ModelSource:
    family: Type[Family]
    config: DecoderConfig
    bos_token_id: Optional[int]
    eos_token_id: List[int]
    pad_token_id: int
    tokenizer: Optional[str]             # main tokenizer file (tokenizer.model, tokenizer.json, *.tiktoken)
    checkpoint: str                      # .ckpt file, folder of rank_{i}/ shards, or safetensors folder
    tokenizer_side_files: List[str] = field(default_factory=list)
    adapter: Optional[str] = None        # Hugging Face PEFT LoRA folder
    pet_config: Optional[dict] = None    # MindFormers LoRA settings (the checkpoint holds the LoRA tensors)
    strategy: Optional[str] = None       # MindSpore strategy file(s) describing how rank_{i} shards were cut
    slora: Optional[object] = None       # weights.slora.SLoraSet: adapters served side by side
    token_ids: Dict[str, int] = field(default_factory=dict)   # the runtime's row-input tokens (GLM v1's mask ids)


def resolve_model(config: ExportConfig) -> ModelSource:
    section = config.model
    sizes, special = {}, {}
    hf_dir, gguf = section.hf_dir, None
    if section.gguf:
        gguf, hf_dir = _gguf_folder(section.gguf, write_tokenizer=section.tokenizer is None)
    if hf_dir:
        where = section.gguf or os.path.join(hf_dir, "config.json")
        hf = _read_hf_config(hf_dir)
        family = family_by_hf_type(hf.get("model_type"), where, hf)
        if section.family is not None and family_by_name(section.family, f"{config.source}: model.family") is not family:
            raise ConfigError(f"{config.source}: model.family {section.family!r} disagrees with {where} "
                              f"(model_type {hf.get('model_type')!r}, family {family.name!r}); remove model.family")
        sizes.update(family.from_hf(hf, where))
        special.update({k: hf[k] for k in _SPECIAL if hf.get(k) is not None})
        special["eos_token_id"] = _with_generation_eos(hf_dir, special.get("eos_token_id"))
    else:
        family = family_by_name(section.family, f"{config.source}: model.family")
    sizes.update({k: getattr(section, k) for k in SIZE_KEYS + VARIANT_KEYS if getattr(section, k) is not None})
    special.update({k: getattr(section, k) for k in _SPECIAL if getattr(section, k) is not None})
    try:
        model = family.config(sizes, config.source)
    except ConfigError as e:
        raise ConfigError(str(e) if str(e).startswith(config.source) else f"{config.source}: {e}") from None
    tokenizer = section.tokenizer or _tokenizer_in(hf_dir)
    if tokenizer is not None and not os.path.isfile(tokenizer):
        raise ConfigError(f"{config.source}: model.tokenizer {tokenizer} does not exist")
    side = [os.path.join(os.path.dirname(tokenizer), n) for n in TOKENIZER_SIDE_FILES
            if os.path.isfile(os.path.join(os.path.dirname(tokenizer), n))] if tokenizer else []
    if tokenizer:
        _warn_without_chat_template(tokenizer, side, gguf or hf_dir)
    checkpoint = config.load_checkpoint or gguf or hf_dir
    if checkpoint is None:
        raise ConfigError(f"{config.source}: missing required key load_checkpoint (a .ckpt file, a folder of "
                          "rank_{i}/*.ckpt shards, or a Hugging Face safetensors folder)")
    if not os.path.exists(checkpoint):
        raise ConfigError(f"{config.source}: load_checkpoint {checkpoint} does not exist")
    eos = special.get("eos_token_id")
    eos_ids = [] if eos is None else ([int(e) for e in eos] if isinstance(eos, list) else [int(eos)])
    pad = special.get("pad_token_id")
    if section.adapter is not None and not os.path.isdir(section.adapter):
        raise ConfigError(f"{config.source}: model.adapter {section.adapter} is not a folder (a PEFT LoRA folder "
                          "with adapter_config.json and adapter_model.safetensors)")
    if section.adapter and section.pet_config:
        raise ConfigError(f"{config.source}: give model.adapter (a PEFT folder) or pet_config (LoRA tensors in the "
                          "checkpoint), not both")
    pet, slora = section.pet_config, None
    if isinstance(pet, dict) and pet.get("pet_type") == "slora":
        from exporter.weights.slora import read_slora
        pet, slora = None, read_slora(section.pet_config, family, f"{config.source}: model.pet_config")
    return ModelSource(family, model, special.get("bos_token_id"), eos_ids, 0 if pad is None else int(pad),
                       tokenizer, checkpoint, side, section.adapter, pet, config.src_strategy_path_or_dir, slora,
                       family.spec.token_ids(sizes))


def _gguf_folder(path: str, write_tokenizer: bool):
    """(the GGUF file, a temporary folder standing for its Hugging Face folder: config.json and, unless
    the yaml gives a tokenizer, the tokenizer files and chat template read from the GGUF)."""
    from exporter.weights.gguf_io import GGUFSource
    source = GGUFSource(path)
    folder = tempfile.mkdtemp(prefix="gguf-")
    atexit.register(shutil.rmtree, folder, True)
    with open(os.path.join(folder, "config.json"), "w", encoding="utf-8") as f:
        json.dump(source.hf_config(), f, indent=2)
    if write_tokenizer:
        source.write_tokenizer(folder)
    return path, folder


def _warn_without_chat_template(tokenizer: str, side: List[str], source: Optional[str]) -> None:
    """A warning when a tokenizer looks chat-tuned but no chat template comes with it: the runtime
    would then format chats in the family's own way, which such a model was not tuned on."""
    from lite_runtime.tokenizers.chat_template import chat_tuned_sign, find_chat_template
    if find_chat_template(os.path.dirname(tokenizer), [os.path.basename(p) for p in side]) is not None:
        return
    why = chat_tuned_sign(tokenizer, os.path.basename(os.path.normpath(source or os.path.dirname(tokenizer))))
    if why:
        log.warning("the tokenizer %s looks chat-tuned (%s) but has no chat template (chat_template.jinja, or "
                    "chat_template in tokenizer_config.json): chats will be formatted in the family's own way; "
                    "add the model's template beside the tokenizer to serve chats as it was tuned", tokenizer, why)


def _read_hf_config(hf_dir: str) -> dict:
    path = os.path.join(hf_dir, "config.json")
    if not os.path.isdir(hf_dir):
        raise ConfigError(f"model.hf_dir {hf_dir} does not exist" if not os.path.exists(hf_dir) else
                          f"model.hf_dir {hf_dir} is not a folder; give a Hugging Face model folder (config.json, "
                          "*.safetensors, tokenizer)")
    if not os.path.isfile(path):
        raise ConfigError(f"model.hf_dir {hf_dir} has no config.json")
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        raise ConfigError(f"cannot read {path}: {e}") from None


def _with_generation_eos(hf_dir: str, eos):
    """config.json's eos ids, then the further ones generation_config.json stops at (as transformers'
    generate does: ChatGLM3's role tokens, Llama 3's <|eot_id|>)."""
    ids = [] if eos is None else (list(eos) if isinstance(eos, list) else [eos])
    path = os.path.join(hf_dir, "generation_config.json")
    if os.path.isfile(path):
        try:
            with open(path, encoding="utf-8") as f:
                more = json.load(f).get("eos_token_id")
        except (OSError, ValueError) as e:
            raise ConfigError(f"cannot read {path}: {e}") from None
        more = [] if more is None else (more if isinstance(more, list) else [more])
        ids += [int(i) for i in more if int(i) not in ids]
    return ids or None


def _tokenizer_in(folder: Optional[str]) -> Optional[str]:
    """The tokenizer file of a Hugging Face folder: tokenizer.json, tokenizer.model or a *.tiktoken."""
    if folder is None:
        return None
    names = list(TOKENIZER_FILES) + sorted(n for n in os.listdir(folder) if n.endswith(".tiktoken"))
    return next((os.path.join(folder, n) for n in names if os.path.isfile(os.path.join(folder, n))), None)
