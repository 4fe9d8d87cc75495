"""The package layout's rules: the runtime never imports the exporter, importing a light module
loads nothing else, public names resolve lazily, and the project's modules import one another
without cycles (of any length, lazy imports inside functions included)."""
import ast
import os
import re
import subprocess
import sys
from collections import defaultdict

import pytest

from support.tiny_models import REPO

pytestmark = pytest.mark.fast      # no export, no graph, no Lite, no model process: `make test-fast`

PACKAGES = ("lite_runtime", "exporter")


def project_files():
    """(module name, path) of every module of the packages."""
    for package in PACKAGES:
        for folder, _, files in os.walk(os.path.join(REPO, package)):
            for name in sorted(f for f in files if f.endswith(".py")):
                path = os.path.join(folder, name)
                yield os.path.relpath(path, REPO)[:-3].replace(os.sep, ".").removesuffix(".__init__"), path


def module_imports():
    """module -> the project modules it imports (any import statement, top level or not)."""
    graph = defaultdict(set)
    for module, path in project_files():
        graph[module]
        for node in ast.walk(ast.parse(open(path, encoding="utf-8").read())):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                continue
            graph[module].update(t for t in targets if t.split(".")[0] in PACKAGES)
    return graph


def import_cycles(graph):
    """The strongly connected components of more than one module (Tarjan)."""
    modules = set(graph)
    edges = {m: sorted(t for t in ts if t in modules and t != m) for m, ts in graph.items()}
    index, low, stack, on_stack, cycles = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for module in sorted(edges):
        if module not in index:
            visit(module)
    return cycles


def test_the_runtime_never_imports_the_exporter():
    offenders = {m: sorted(t for t in ts if t.startswith("exporter"))
                 for m, ts in module_imports().items() if m.startswith("lite_runtime")}
    assert not {m: t for m, t in offenders.items() if t}
    dynamic = re.compile(r"""(import_module|__import__)\(\s*["']exporter""")
    assert not [path for module, path in project_files()
                if module.startswith("lite_runtime") and dynamic.search(open(path, encoding="utf-8").read())]


def test_no_relative_imports_so_the_graph_above_is_complete():
    for _, path in project_files():
        tree = ast.parse(open(path, encoding="utf-8").read())
        assert not [n for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.level], path


def test_the_cycle_finder_finds_cycles():
    assert import_cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert import_cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycles():
    assert not import_cycles(module_imports())


CONTRACT = {"lite_runtime", "lite_runtime.contract", "lite_runtime.contract.errors"}


@pytest.mark.parametrize("module, allowed", [
    ("lite_runtime.contract.errors", CONTRACT),
    ("lite_runtime.contract.families", CONTRACT | {"lite_runtime.contract.families"}),
    ("lite_runtime.contract.manifest", CONTRACT | {"lite_runtime.contract.families", "lite_runtime.contract.hashes",
                                                      "lite_runtime.contract.manifest"}),
    ("lite_runtime.contract.mindir", CONTRACT | {"lite_runtime.contract.families", "lite_runtime.contract.mindir"}),
])
def test_a_light_module_loads_nothing_else_of_the_runtime(module, allowed):
    code = (f"import sys, {module}; "
            "print(sorted(m for m in sys.modules if m.startswith(('lite_runtime', 'mindspore', 'exporter'))))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True).stdout
    loaded = eval(out)
    assert set(loaded) <= allowed, loaded


def test_public_names_resolve_lazily():
    code = ("import inspect, sys, lite_runtime; "
            "assert not [m for m in sys.modules if m.startswith('lite_runtime.')], sorted(sys.modules); "
            "from lite_runtime import pipeline, InferConfig, InferTask, InputOfInfer, BaseInputsOfInfer, "
            "CommonInputsOfInfer, LlamaInputsOfInfer, ToolchainError, TextGeneratorInfer; "
            "assert inspect.isfunction(pipeline); print(InferTask.__name__, InputOfInfer.__name__)")
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_an_unknown_public_name_is_an_attribute_error():
    import lite_runtime
    with pytest.raises(AttributeError, match="no_such_name"):
        lite_runtime.no_such_name  # noqa: B018
