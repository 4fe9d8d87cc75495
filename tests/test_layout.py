"""The package layout's rules: the runtime never imports the exporter, importing a light module
loads nothing else, public names resolve lazily, and no two modules import each other."""
import ast
import os
import subprocess
import sys
from collections import defaultdict

import pytest

from tiny_models import REPO

PACKAGES = ("lite_runtime", "exporter")


def module_imports():
    """module -> the project modules it imports (any import statement, top level or not)."""
    graph = defaultdict(set)
    for package in PACKAGES:
        for folder, _, files in os.walk(os.path.join(REPO, package)):
            for name in files:
                if not name.endswith(".py"):
                    continue
                path = os.path.join(folder, name)
                module = os.path.relpath(path, REPO)[:-3].replace(os.sep, ".").removesuffix(".__init__")
                for node in ast.walk(ast.parse(open(path, encoding="utf-8").read())):
                    if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                        targets = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
                    elif isinstance(node, ast.Import):
                        targets = [a.name for a in node.names]
                    else:
                        continue
                    graph[module].update(t for t in targets if t.split(".")[0] in PACKAGES)
    return graph


def test_the_runtime_never_imports_the_exporter():
    offenders = {m: sorted(t for t in ts if t.startswith("exporter"))
                 for m, ts in module_imports().items() if m.startswith("lite_runtime")}
    assert not {m: t for m, t in offenders.items() if t}


def test_no_relative_imports_so_the_graph_above_is_complete():
    for package in PACKAGES:
        for folder, _, files in os.walk(os.path.join(REPO, package)):
            for name in (f for f in files if f.endswith(".py")):
                tree = ast.parse(open(os.path.join(folder, name), encoding="utf-8").read())
                assert not [n for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.level], name


def test_no_two_modules_import_each_other():
    graph = module_imports()
    modules = set(graph)
    edges = {m: {t for t in ts if t in modules and t != m} for m, ts in graph.items()}
    cycles = [(a, b) for a in edges for b in edges[a] if a in edges.get(b, ()) and a < b]
    assert not cycles


@pytest.mark.parametrize("module", ["lite_runtime.contract.errors", "lite_runtime.contract.manifest"])
def test_a_light_module_loads_nothing_else_of_the_runtime(module):
    code = (f"import sys, {module}; "
            "print(sorted(m for m in sys.modules if m.startswith(('lite_runtime', 'mindspore', 'exporter'))))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True).stdout
    loaded = eval(out)
    assert set(loaded) <= {"lite_runtime", "lite_runtime.contract", "lite_runtime.contract.errors",
                           "lite_runtime.contract.families", "lite_runtime.contract.manifest"}, loaded


def test_public_names_resolve_lazily():
    code = ("import inspect, lite_runtime; from lite_runtime import pipeline, InferTask, InputOfInfer; "
            "assert inspect.isfunction(pipeline); print(InferTask.__name__, InputOfInfer.__name__)")
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
