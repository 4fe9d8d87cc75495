"""Reader and validator of MindSpore Lite / GE `config.ini` files, and dynamic-shape gears.

Sections: [ascend_context], [ge_session_options], [ge_graph_options], [graph_kernel_param].
All of them are Ascend (GE) settings: Lite on CPU ignores them. Keys are case-sensitive
(`ge.externalWeight`), lines are `key=value`, comments start with `#`, as Lite reads them.

`ge.inputShape=name:d,d;name:d` with -1 for dynamic dims and `ge.dynamicDims=g;g;...`, each gear
giving one value per -1 in order, become GearProfiles; `GeConfig.pick_gear` picks the smallest
gear that holds a (batch, length) request.

Writing inis (presets, per-export and per-rank copies) lives in `ge_config_writer.py`.
CLI (lite_runtime/cli/ge_config.py):
    python -m lite_runtime.cli.ge_config check FILE[,FILE] ... | generate --model_dir D --preset P -o OUT
"""
from __future__ import annotations

import configparser
import difflib
import logging
import os
import re
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence, Tuple, Union

from lite_runtime.contract.errors import ConfigError
from lite_runtime.ascend.rank_table import RankTable, load_rank_table

logger = logging.getLogger(__name__)

SECTIONS = ("ascend_context", "ge_session_options", "ge_graph_options", "graph_kernel_param")
# ge.exec.precision_mode values documented by CANN (force_fp32 and cube_fp16in_fp32out are synonyms,
# as are allow_mix_precision and allow_mix_precision_fp16).
PRECISION_MODES = ("force_fp16", "force_fp32", "cube_fp16in_fp32out", "allow_fp32_to_fp16",
                   "must_keep_origin_dtype", "allow_mix_precision", "allow_mix_precision_fp16",
                   "allow_mix_precision_bf16", "allow_fp32_to_bf16")
PRECISION_MODES_V2 = ("fp16", "origin", "cube_fp16in_fp32out", "mixed_float16", "mixed_bfloat16",
                      "cube_hif8", "mixed_hif8")
MAX_GEARS = 100                     # the CANN limit on dynamic-dims gears
ASCEND_CONTEXT_KEYS = ("provider", "plugin_custom_ops", "rank_table_file", "input_format", "input_shape",
                       "dynamic_dims", "precision_mode", "op_select_impl_mode", "fusion_switch_config_file_path",
                       "buffer_optimize", "insert_op_config_file_path", "device_id", "rank_id")
GRAPH_ONLY_KEYS = ("ge.inputShape", "ge.dynamicDims", "ge.dynamicNodeType")
TOKEN_INPUTS = ("input_ids", "tokens")

Shape = Tuple[int, ...]


def _choice(*allowed: str) -> Callable[[str], Optional[str]]:
    def check(value: str) -> Optional[str]:
        return None if value in allowed else ", ".join(allowed)
    return check


def _custom_ops(value: str) -> Optional[str]:
    if value in ("All", "None") or (value.lower() not in ("all", "none") and
                                    re.fullmatch(r"[A-Za-z]\w*(,[A-Za-z]\w*)*", value)):
        return None
    return "All, None, or a comma list of op names such as FlashAttention,KVCache"


# (section, key) -> check returning None when the value is fine, else the allowed values.
_ON_OFF = _choice("0", "1")
VALUE_CHECKS: Dict[Tuple[str, str], Callable[[str], Optional[str]]] = {
    ("ascend_context", "provider"): _choice("ge"),
    ("ascend_context", "plugin_custom_ops"): _custom_ops,
    ("ge_session_options", "ge.externalWeight"): _ON_OFF,
    ("ge_session_options", "ge.exec.atomicCleanPolicy"): _ON_OFF,
    ("ge_session_options", "ge.event"): _choice("notify"),
    ("ge_session_options", "ge.exec.staticMemoryPolicy"): _choice("0", "1", "2", "3", "4"),
    ("ge_session_options", "ge.exec.precision_mode"): _choice(*PRECISION_MODES),
    ("ge_session_options", "ge.exec.precision_mode_v2"): _choice(*PRECISION_MODES_V2),
    ("ge_session_options", "ge.exec.formatMode"): _ON_OFF,
    ("ge_session_options", "ge.constLifecycle"): _choice("graph", "session"),
    ("ge_session_options", "ge.featureBaseRefreshable"): _ON_OFF,
    ("ge_session_options", "ge.deterministic"): _ON_OFF,
    ("ge_graph_options", "ge.dynamicNodeType"): _ON_OFF,
    ("ge_graph_options", "ge.exec.variable_acc"): _choice("0", "1", "True", "False"),
    ("ge_graph_options", "input_format"): _choice("ND", "NCHW", "NHWC", "NCDHW", "NDHWC"),
}


# Keys this project knows per section: the checked ones, the shape keys, the ascend_context keys.
KNOWN_KEYS: Dict[str, Tuple[str, ...]] = {
    "ascend_context": ASCEND_CONTEXT_KEYS,
    "ge_session_options": tuple(k for s, k in VALUE_CHECKS if s == "ge_session_options"),
    "ge_graph_options": tuple(k for s, k in VALUE_CHECKS if s == "ge_graph_options")
    + tuple(k for k in GRAPH_ONLY_KEYS if ("ge_graph_options", k) not in VALUE_CHECKS),
}


@dataclass(frozen=True)
class GearProfile:
    """One concrete set of input shapes the graph is compiled for (gear `index` of ge.dynamicDims)."""
    index: int
    shapes: Dict[str, Shape]

    def batch_length(self, token_input: str) -> Tuple[int, int]:
        shape = self.shapes[token_input]
        return shape[0], shape[1]


@dataclass
class GeConfig:
    path: str
    sections: Dict[str, Dict[str, str]]
    lines: Dict[Tuple[str, str], int] = field(default_factory=dict)
    input_shape: Optional[Dict[str, Shape]] = None    # ge.inputShape, -1 for dynamic dims
    gears: List[GearProfile] = field(default_factory=list)
    rank_table: Optional[RankTable] = None

    def get(self, section: str, key: str, default: Optional[str] = None) -> Optional[str]:
        return self.sections.get(section, {}).get(key, default)

    @property
    def provider(self) -> Optional[str]:
        return self.get("ascend_context", "provider")

    @property
    def rank_table_file(self) -> Optional[str]:
        """None when absent, "" when left as a placeholder to be filled per rank."""
        return self.get("ascend_context", "rank_table_file")

    @property
    def is_dynamic(self) -> bool:
        return any(-1 in dims for dims in (self.input_shape or {}).values())

    def ge_only_sections(self) -> List[str]:
        return [s for s in SECTIONS if s in self.sections]

    def pick_gear(self, batch: int, length: int, token_input: Optional[str] = None) -> GearProfile:
        return pick_gear(self.gears, batch, length, token_input, source=self.path)

    def check_runnable(self, world_size: int) -> None:
        """Refuse what would only fail inside Lite: a placeholder or mismatched rank table."""
        value = self.rank_table_file
        if value == "":
            raise ConfigError(f"{self._at('ascend_context', 'rank_table_file')}: rank_table_file is empty; set it "
                              "(python -m lite_runtime.cli.ge_config generate --rank_table FILE) or remove the line")
        if value and self.rank_table is None:        # read with check_files=False
            self.rank_table = _load_rank_table(self, value)
        if world_size > 1 and self.rank_table is None:
            raise ConfigError(f"{self.path}: the export has {world_size} ranks but [ascend_context] has no "
                              "rank_table_file; generate one with tools/hccl_tools.py")
        if self.rank_table is not None and len(self.rank_table.ranks) != world_size:
            raise ConfigError(f"{self._at('ascend_context', 'rank_table_file')}: rank table {value} has "
                              f"{len(self.rank_table.ranks)} rank(s) but the export has world_size {world_size}")

    def summary(self) -> str:
        parts = [f"provider {self.provider or '-'}"]
        mode = self.get("ge_session_options", "ge.exec.precision_mode") or \
            self.get("ge_session_options", "ge.exec.precision_mode_v2")
        if mode:
            parts.append(f"precision {mode}")
        if self.input_shape is not None:
            kind = f"{len(self.gears)} gear(s)" if self.is_dynamic else "static"
            parts.append(f"{len(self.input_shape)} input shape(s), {kind}")
        if self.rank_table is not None:
            parts.append(f"rank table {self.rank_table_file} ({len(self.rank_table.ranks)} ranks)")
        elif self.rank_table_file is not None:
            parts.append(f"rank table {self.rank_table_file} (not read)" if self.rank_table_file
                         else "rank_table_file unset (placeholder)")
        sections = ", ".join(self.ge_only_sections()) or "none (CPU)"
        return f"{self.path}: {'; '.join(parts)}; sections: {sections}"

    def _at(self, section: str, key: str) -> str:
        line = self.lines.get((section, key))
        return f"{self.path}: line {line}" if line else self.path


def read_ge_config(path: str, check_files: bool = True) -> GeConfig:
    """Parse and validate one ini file; every mistake is a ConfigError naming file, line and value."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except FileNotFoundError:
        raise ConfigError(f"GE config {path} does not exist") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"cannot read GE config {path}: {e}") from None
    return parse_ge_config(text, path, check_files)


def parse_ge_config(text: str, source: str = "<config.ini>", check_files: bool = True) -> GeConfig:
    sections = _parse_sections(text, source)
    config = GeConfig(source, sections, _key_lines(text))
    for section, values in sections.items():
        for key, value in values.items():
            _check_value(config, section, key, value)
    rank_table_file = config.rank_table_file
    if rank_table_file and check_files:
        config.rank_table = _load_rank_table(config, rank_table_file)
    _read_gears(config)
    return config


def _parse_sections(text: str, source: str) -> Dict[str, Dict[str, str]]:
    parser = configparser.ConfigParser(delimiters=("=",), comment_prefixes=("#",), interpolation=None,
                                       strict=True, empty_lines_in_values=False, default_section="\0")
    parser.optionxform = str                        # GE keys are case-sensitive
    try:
        parser.read_string(text, source)
    except configparser.MissingSectionHeaderError as e:
        raise ConfigError(f"{source}: line {e.lineno}: {e.line.strip()!r} comes before any [section]; "
                          f"allowed sections: {_allowed_sections()}") from None
    except configparser.ParsingError as e:
        lineno = e.errors[0][0]
        line = text.splitlines()[lineno - 1] if 0 < lineno <= len(text.splitlines()) else e.errors[0][1]
        raise ConfigError(f"{source}: line {lineno}: malformed line {line.strip()!r}; expected key=value, "
                          "a [section] header or a # comment") from None
    except configparser.DuplicateSectionError as e:
        raise ConfigError(f"{source}: line {e.lineno}: section [{e.section}] appears twice") from None
    except configparser.DuplicateOptionError as e:
        raise ConfigError(f"{source}: line {e.lineno}: key {e.option!r} appears twice in [{e.section}]") from None
    header_lines = {m.group(1): i for i, m in _numbered(text, r"\s*\[([^\]]*)\]")}
    sections: Dict[str, Dict[str, str]] = {}
    for name in parser.sections():
        if name not in SECTIONS:
            raise ConfigError(f"{source}: line {header_lines.get(name, '?')}: unknown section [{name}]; "
                              f"allowed sections: {_allowed_sections()}")
        sections[name] = dict(parser.items(name))
    return sections


def _numbered(text: str, pattern: str):
    for i, line in enumerate(text.splitlines(), 1):
        m = re.match(pattern, line)
        if m:
            yield i, m


def _key_lines(text: str) -> Dict[Tuple[str, str], int]:
    lines: Dict[Tuple[str, str], int] = {}
    section = ""
    for i, line in enumerate(text.splitlines(), 1):
        header = re.match(r"\s*\[([^\]]*)\]", line)
        if header:
            section = header.group(1)
            continue
        key = re.match(r"([^\s#=][^=]*?)\s*=", line)
        if key:
            lines.setdefault((section, key.group(1)), i)
    return lines


def _allowed_sections() -> str:
    return ", ".join(f"[{s}]" for s in SECTIONS)


def _check_value(config: GeConfig, section: str, key: str, value: str) -> None:
    where = f"{config._at(section, key)}: [{section}] {key}={value!r}"
    if "\n" in value:
        raise ConfigError(f"{where}: the value continues on an indented line; each option is one line")
    if key in GRAPH_ONLY_KEYS and section != "ge_graph_options":
        raise ConfigError(f"{where}: {key} belongs in [ge_graph_options]")
    check = VALUE_CHECKS.get((section, key))
    if check is not None:
        allowed = check(value)
        if allowed is not None:
            raise ConfigError(f"{where}: not allowed; allowed: {allowed}")
    elif section == "ascend_context" and key not in ASCEND_CONTEXT_KEYS:
        logger.warning("%s: [ascend_context] key %r is not one this project knows (%s); Lite may ignore it",
                       config._at(section, key), key, _did_you_mean(section, key) or ", ".join(ASCEND_CONTEXT_KEYS))
    elif key not in KNOWN_KEYS.get(section, ()) and _did_you_mean(section, key):
        # GE has many options this project does not list; only a near miss of a known one is worth a word.
        logger.warning("%s: [%s] key %r is not one this project knows (%s); GE may refuse or ignore it",
                       config._at(section, key), section, key, _did_you_mean(section, key))
    if section == "ge_session_options" and key == "ge.exec.precision_mode_v2" and \
            "ge.exec.precision_mode" in config.sections[section]:
        raise ConfigError(f"{where}: ge.exec.precision_mode and ge.exec.precision_mode_v2 cannot both be set")


def _did_you_mean(section: str, key: str) -> str:
    """`did you mean 'k'?` for the known key closest to a misspelt one (same section first), else ''."""
    for candidates in (KNOWN_KEYS.get(section, ()), [k for keys in KNOWN_KEYS.values() for k in keys]):
        close = difflib.get_close_matches(key, candidates, n=1, cutoff=0.8)
        if close:
            home = next(s for s, keys in KNOWN_KEYS.items() if close[0] in keys)
            return f"did you mean {close[0]!r}" + ("?" if home == section else f" in [{home}]?")
    return ""


def _load_rank_table(config: GeConfig, value: str) -> RankTable:
    where = f"{config._at('ascend_context', 'rank_table_file')}: [ascend_context] rank_table_file={value!r}"
    if not os.path.isfile(value):
        hint = "" if os.path.isabs(value) else \
            f" (relative paths are resolved against the current directory {os.getcwd()})"
        raise ConfigError(f"{where}: file does not exist{hint}; allowed: the path of a rank table "
                          "written by tools/hccl_tools.py or tools/merge_hccl.py")
    try:
        return load_rank_table(value)
    except ConfigError as e:
        raise ConfigError(f"{where}: not a valid rank table: {e}") from None


def _read_gears(config: GeConfig) -> None:
    shape_value = config.get("ge_graph_options", "ge.inputShape")
    dims_value = config.get("ge_graph_options", "ge.dynamicDims")
    if shape_value is None:
        if dims_value is not None:
            raise ConfigError(f"{config._at('ge_graph_options', 'ge.dynamicDims')}: ge.dynamicDims needs "
                              "ge.inputShape with -1 for the dims it sets")
        return
    where = f"{config._at('ge_graph_options', 'ge.inputShape')}: ge.inputShape={shape_value!r}"
    try:
        config.input_shape = parse_input_shape(shape_value)
    except ValueError as e:
        raise ConfigError(f"{where}: {e}") from None
    n_dynamic = sum(dims.count(-1) for dims in config.input_shape.values())
    if n_dynamic == 0:
        if dims_value is not None:
            raise ConfigError(f"{config._at('ge_graph_options', 'ge.dynamicDims')}: ge.dynamicDims is set but "
                              "ge.inputShape has no -1 dims; allowed: remove ge.dynamicDims or use -1 dims")
        config.gears = [GearProfile(0, dict(config.input_shape))]
        return
    if dims_value is None:
        raise ConfigError(f"{where}: has {n_dynamic} dynamic (-1) dim(s) but no ge.dynamicDims; "
                          "allowed: add ge.dynamicDims with one value per -1 for each gear")
    try:
        gears = parse_dynamic_dims(dims_value, n_dynamic)
    except ValueError as e:
        raise ConfigError(f"{config._at('ge_graph_options', 'ge.dynamicDims')}: "
                          f"ge.dynamicDims={dims_value!r}: {e}") from None
    config.gears = [GearProfile(i, _fill(config.input_shape, gear)) for i, gear in enumerate(gears)]


def parse_input_shape(value: str) -> Dict[str, Shape]:
    """`name:d,d;name:d` -> {name: dims}; raises ValueError saying what is wrong."""
    shapes: Dict[str, Shape] = {}
    for item in value.split(";"):
        if not item.strip():
            raise ValueError("empty entry; expected name:d1,d2;name:d1")
        name, sep, dims = item.strip().rpartition(":")
        if not sep or not name:
            raise ValueError(f"entry {item!r} is not name:d1,d2,...")
        if name in shapes:
            raise ValueError(f"input {name!r} appears twice")
        try:
            shape = tuple(int(d) for d in dims.split(",")) if dims.strip() else ()
        except ValueError:
            raise ValueError(f"entry {item!r}: dims must be integers (-1 for dynamic)") from None
        if any(d < 1 and d != -1 for d in shape):
            raise ValueError(f"entry {item!r}: dims must be positive or -1")
        shapes[name] = shape
    return shapes


def parse_dynamic_dims(value: str, n_dynamic: int) -> List[Shape]:
    """`g;g;...` with n_dynamic comma-separated positive values per gear."""
    gears: List[Shape] = []
    for number, item in enumerate(value.split(";"), 1):
        try:
            gear = tuple(int(v) for v in item.split(","))
        except ValueError:
            raise ValueError(f"gear {number} {item!r}: values must be positive integers") from None
        if len(gear) != n_dynamic:
            raise ValueError(f"gear {number} {item!r} has {len(gear)} value(s) but ge.inputShape has "
                             f"{n_dynamic} -1 dim(s); allowed: exactly {n_dynamic} value(s) per gear")
        if any(v < 1 for v in gear):
            raise ValueError(f"gear {number} {item!r}: values must be positive integers")
        if gear in gears:
            raise ValueError(f"gear {number} {item!r} repeats gear {gears.index(gear) + 1}")
        gears.append(gear)
    if len(gears) > MAX_GEARS:
        raise ValueError(f"{len(gears)} gears; GE allows at most {MAX_GEARS}")
    return gears


def _fill(shapes: Dict[str, Shape], gear: Shape) -> Dict[str, Shape]:
    values = iter(gear)
    return {name: tuple(next(values) if d == -1 else d for d in dims) for name, dims in shapes.items()}


def pick_gear(gears: Sequence[GearProfile], batch: int, length: int, token_input: Optional[str] = None,
              source: str = "GE config") -> GearProfile:
    """The smallest gear whose token input holds `batch` rows of `length` tokens."""
    if not gears:
        raise ConfigError(f"{source}: has no ge.inputShape, so there are no gears to choose from")
    names = list(gears[0].shapes)
    if token_input is None:
        token_input = next((n for n in TOKEN_INPUTS if n in names),
                           next((n for n in names if len(gears[0].shapes[n]) == 2), None))
    if token_input not in names or len(gears[0].shapes[token_input]) != 2:
        raise ConfigError(f"{source}: token input {token_input!r} is not a 2-D (batch, length) input of "
                          f"ge.inputShape; inputs: {', '.join(names)}")
    fits = [g for g in gears if g.batch_length(token_input)[0] >= batch and g.batch_length(token_input)[1] >= length]
    if not fits:
        have = ", ".join(f"{b}x{n}" for b, n in (g.batch_length(token_input) for g in gears))
        raise ConfigError(f"{source}: no gear holds batch {batch} x length {length} of {token_input!r}; "
                          f"gears (batch x length): {have}; add a larger gear to ge.dynamicDims or shorten the input")
    return min(fits, key=lambda g: (g.batch_length(token_input)[0] * g.batch_length(token_input)[1],
                                    g.batch_length(token_input)[1], g.index))


def ge_only_sections(config: Union[str, GeConfig]) -> List[str]:
    """Sections Lite on CPU ignores, present in an ini (path) or a parsed config."""
    if isinstance(config, str):
        config = read_ge_config(config, check_files=False)
    return config.ge_only_sections()


def split_config_paths(values: Sequence[str]) -> List[str]:
    """Accept `a.ini b.ini` as well as the upstream `a.ini,b.ini` prefill/increment pair."""
    return [p for v in values for p in v.split(",") if p]
