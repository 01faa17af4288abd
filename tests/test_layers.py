"""The layering of DESIGN.md, checked from the imports: arrows only point downward.

    topologies (pure data, link physics, units)  <  fabric (kernel)  <  traffic  <  testbed

A module may import its own package and the packages below it, never one above; and no
two modules import each other, directly or around a longer loop (imports inside
functions count: hiding one there does not remove the dependency).
"""

from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx

ROOT = Path(__file__).resolve().parent.parent
LAYERS = ["topologies", "fabric", "traffic", "testbed"]


def _modules() -> dict[str, Path]:
    found = {}
    for pkg in LAYERS:
        for path in sorted((ROOT / pkg).glob("*.py")):
            name = pkg if path.stem == "__init__" else f"{pkg}.{path.stem}"
            found[name] = path
    return found


def _imports(path: Path, name: str, known: set[str]) -> set[str]:
    """Project modules imported anywhere in the file (module level or inside functions)."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            targets = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        else:
            continue
        for t in targets:
            while t and t not in known:
                t = t.rpartition(".")[0]
            if t and t != name:
                out.add(t)
    return out


def import_graph() -> nx.DiGraph:
    mods = _modules()
    g = nx.DiGraph()
    g.add_nodes_from(mods)
    for name, path in mods.items():
        for target in _imports(path, name, set(mods)):
            if target not in LAYERS:          # `from fabric import netns` names netns
                g.add_edge(name, target)
    return g


def layer(module: str) -> int:
    return LAYERS.index(module.split(".")[0])


def test_the_import_graph_sees_every_package():
    g = import_graph()
    assert {layer(m) for m in g} == set(range(len(LAYERS)))
    assert g.has_edge("testbed.cli", "topologies.files")    # the parser finds real edges


def test_no_module_imports_from_a_layer_above_it():
    upward = [f"{a} -> {b}" for a, b in import_graph().edges if layer(b) > layer(a)]
    assert upward == []


def test_no_two_modules_import_each_other():
    cycles = [" -> ".join(c) for c in nx.simple_cycles(import_graph())]
    assert cycles == []
