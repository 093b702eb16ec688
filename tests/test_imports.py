"""The package's imports, read from its source: no cycle, and the layers point one way.

    io  <-  store  <-  build, train        stats reads store (and build's readers for raw corpora)
    config, binpack, masks: leaves          cli, the faces (data, attention): on top

Every import counts, also one inside a function: a lazy import still ties two modules together.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from conftest import ROOT

PACKAGE = ROOT / "packer"
LEAVES = {"packer.config", "packer.binpack", "packer.masks"}


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _imports(path: Path, modules: dict) -> set[str]:
    """Every module (packer's, or a third-party top-level name) this file imports, anywhere in it."""
    found = set()
    package = _module_name(path) if path.name == "__init__.py" else _module_name(path).rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
            for alias in node.names:  # `from packer.io import fs` imports the module packer.io.fs
                sub = f"{base}.{alias.name}"
                found.add(sub if sub in modules else base)
    return {name if name.startswith("packer") else name.split(".")[0] for name in found}


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: {m for m in _imports(path, modules) if m in modules or not m.startswith("packer")}
            for name, path in modules.items()}


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle among packer's modules (the root package's own lazy names excepted), or None."""
    state: dict[str, int] = {}  # 1 = on the current path, 2 = done
    path: list[str] = []

    def visit(node: str):
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if not nxt.startswith("packer.") or nxt == node:
                continue
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def _layer(name: str) -> str:
    return name.split(".")[1] if name.count(".") >= 1 else "packer"


def test_the_walk_sees_the_package():
    graph = _graph()
    assert {"packer.build.pipeline", "packer.store.dataset", "packer.train.data", "packer.io.fs"} <= set(graph)
    assert "packer.io.fs" in graph["packer.build.pipeline"] and "torch" in graph["packer.train.data"]


def test_no_import_cycle():
    assert _cycle(_graph()) is None, " -> ".join(_cycle(_graph()))


def test_a_cycle_is_found():
    assert _cycle({"packer.a": {"packer.b"}, "packer.b": {"packer.c"}, "packer.c": {"packer.a"}}) == [
        "packer.a", "packer.b", "packer.c", "packer.a"]
    assert _cycle({"packer.a": {"packer.b", "numpy"}, "packer.b": set()}) is None


LEAF_LAYERS = {"config", "binpack", "masks"}
ALLOWED = {  # layer -> the packer layers its modules may import (besides the leaves)
    "io": {"io"},
    "store": {"io", "store"},
    "build": {"io", "store", "build", "stats", "packer"},  # stats: the build writes stats.json; packer: __version__
    "stats": {"io", "store", "build", "stats", "train"},  # build: raw-corpus lengths; train: online_fill_rate
    "train": {"io", "store", "build", "train"},  # build: the one encode path (online packing)
}


@pytest.mark.parametrize("layer", sorted(ALLOWED))
def test_layers_point_one_way(layer):
    graph = _graph()
    for name, deps in graph.items():
        if _layer(name) != layer or name == f"packer.{layer}":
            continue
        allowed = ALLOWED[layer] | (LEAF_LAYERS if layer != "io" else set())
        bad = sorted(d for d in deps if d.startswith("packer") and _layer(d) not in allowed)
        assert not bad, f"{name} imports {bad}; {layer}/ may import only {sorted(allowed)}"


@pytest.mark.parametrize("layer", ["io", "store", "build", "stats"])
def test_no_torch_outside_train(layer):
    for name, deps in _graph().items():
        if _layer(name) == layer:
            assert "torch" not in deps, f"{name} imports torch; only packer/train/ may"


def test_leaves_import_no_packer_module():
    """Leaves import nothing of packer but config, the one home of the choice lists (config itself nothing)."""
    graph = _graph()
    for leaf in LEAVES:
        inner = [d for d in graph[leaf] if d.startswith("packer") and (leaf == "packer.config" or d != "packer.config")]
        assert not inner, f"{leaf} must stay a leaf, but imports {inner}"
