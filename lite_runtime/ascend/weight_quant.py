"""int8 weights on Ascend: MindSpore Lite's own weight quantization for GE, applied by its converter.

An export with `target: ascend` and `quantization.weights: int8` keeps float graphs (the project's CPU
kernels do not run on Ascend) and ships the converter's configuration, `ascend_quant.ini`: weight
quantization at 8 bits per output channel, dequantized on the fly by GE (`dequant_strategy=ON_THE_FLY`),
every MatMul with a constant weight except the output head's (`skip_quant_node`: the nodes that read the
head's or the embedding's table, as the graphs name them; both stay float32, and a tied head shares the
embedding's table).

Lite applies those settings only when its converter runs offline (`converter_lite --optimize=ascend_oriented
--configFile=...`): the online conversion of a MindIR at Build reads only `[ascend_context]` from the
config.ini handed to Build. So `quantize_export` runs the converter on the Ascend server, once, writing
`<graph>_ascend_int8.mindir` beside each graph, and the runtime builds those (`graph_to_build`).
"""
from __future__ import annotations

import os
import subprocess
from typing import Dict, List

from lite_runtime.contract.errors import ArtifactError, ToolchainError
from lite_runtime.contract.manifest import Manifest

CONFIG_NAME = "ascend_quant.ini"
CONVERTED_SUFFIX = "_ascend_int8"
QUANTIZER = "lite_converter"        # the manifest's quantization.by for this scheme
QUANTIZE_COMMAND = "python -m lite_runtime.cli.ge_config quantize --model_dir"


def record() -> Dict[str, object]:
    """The manifest's `quantization` of such an export."""
    return {"weights": "int8", "by": QUANTIZER, "dequant": "on_the_fly", "converter_config": CONFIG_NAME,
            "head": "float32", "embedding": "float32"}


def by_converter(manifest: Manifest) -> bool:
    return (manifest.quantization or {}).get("by") == QUANTIZER


def config_text(skip_nodes: List[str]) -> str:
    """The converter's configuration: [common_quant_param], [weight_quant_param], [ascend_context]."""
    if not skip_nodes:
        raise ArtifactError("found no node reading the output head's weight in the exported graphs: the "
                            "converter would quantize the head too; report this with the export's yaml")
    return "\n".join([
        "# MindSpore Lite's weight quantization for GE, written by the exporter (quantization.weights: int8,",
        "# target: ascend). Applied by the converter on the Ascend server, once per export:",
        f"#   {QUANTIZE_COMMAND} <this folder>",
        "[common_quant_param]",
        "quant_type=WEIGHT_QUANT",
        "bit_num=8",
        "min_quant_weight_size=0",
        "min_quant_weight_channel=16",
        "# the nodes reading the output head's and the embedding's tables: they stay float32",
        "skip_quant_node=" + ",".join(skip_nodes),
        "",
        "[weight_quant_param]",
        "dequant_strategy=ON_THE_FLY",
        "",
        "[ascend_context]",
        "provider=ge",
        ""])


def converted_rel(graph_rel: str) -> str:
    base = graph_rel[: -len(".mindir")] if graph_rel.endswith(".mindir") else graph_rel
    return base + CONVERTED_SUFFIX + ".mindir"


def graph_to_build(manifest: Manifest, kind: str, rank: int, target: str) -> str:
    """The graph file Lite builds: on Ascend, the converter's int8 output when the export asks for it."""
    path = manifest.graph_path(kind, rank)
    if target != "ascend" or not by_converter(manifest):
        return path
    converted = os.path.join(manifest.root, converted_rel(manifest.graphs[kind].files[rank]))
    if not os.path.isfile(converted):
        raise ArtifactError(f"{manifest.root}: this export quantizes its weights to int8 with MindSpore Lite's "
                            f"converter on Ascend, and {converted} does not exist yet: run "
                            f"`{QUANTIZE_COMMAND} {manifest.root}` on this server first (it needs converter_lite)")
    return converted


def converter_args(converter: str, graph: str, config: str) -> List[str]:
    out_base = converted_rel(graph)[: -len(".mindir")]
    return [converter, "--fmk=MINDIR", f"--modelFile={graph}", f"--outputFile={out_base}",
            "--optimize=ascend_oriented", f"--configFile={config}"]


def quantize_export(manifest: Manifest, converter: str = "converter_lite") -> List[str]:
    """Run Lite's converter on every graph of every rank; returns the files written."""
    if not by_converter(manifest):
        raise ArtifactError(f"{manifest.root}: this export does not ask for Lite's weight quantization on Ascend "
                            "(quantization.weights: int8 with target: ascend in its yaml); nothing to convert")
    config = os.path.join(manifest.root, CONFIG_NAME)
    if not os.path.isfile(config):
        raise ArtifactError(f"{config} listed in {manifest.file or manifest.root} does not exist; export again")
    written = []
    for kind, entry in manifest.graphs.items():
        for rank in range(len(entry.files)):
            graph = manifest.graph_path(kind, rank)
            args = converter_args(converter, graph, config)
            try:
                result = subprocess.run(args, capture_output=True, text=True)
            except OSError as e:
                raise ToolchainError(f"cannot run MindSpore Lite's converter {converter!r}: {e.strerror}; give "
                                     "--converter with the path of converter_lite (Lite for Ascend)") from None
            out = converted_rel(graph)
            if result.returncode != 0 or not os.path.isfile(out):
                detail = (result.stderr or result.stdout).strip().splitlines()
                raise ToolchainError(f"{converter} failed on {graph}" + (f": {detail[-1]}" if detail else
                                                                         f" with exit code {result.returncode}"))
            written.append(out)
    return written

