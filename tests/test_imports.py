"""The package's imports, read from its source: no cycle, and the layers point one way.

The table is DESIGN.md's, exactly:

    io         ->  (nothing of packer)
    store      ->  io
    encode     ->  io
    stats      ->  io, store
    preprocess ->  io, store, encode, stats
    train      ->  io, store, encode
    cli        ->  anything          leaves (config, binpack, online_pack, masks, balance, _version) -> config, leaves

Every import counts, also one inside a function: a lazy import still ties two modules together.
One exception, by design (packer/config.py's docstring): config reads the names of the extension
tables (shard formats, executors, ...) from the tables, each import inside the function of
config.TABLES that reads it, importing the table alone. Those are the only arrows out of config.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from conftest import ROOT

PACKAGE = ROOT / "packer"
LEAVES = {"packer.config", "packer.binpack", "packer.online_pack", "packer.masks", "packer.balance", "packer._version"}


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _imports(path: Path, modules: dict) -> set[str]:
    """Every module (packer's, or a third-party top-level name) this file imports, anywhere in it."""
    name = _module_name(path)
    return _imports_of(path.read_text(encoding="utf-8"), name if path.name == "__init__.py" else name.rpartition(".")[0],
                       modules, package_given=True)


def _imports_of(source: str, name: str, modules: dict, package_given: bool = False) -> set[str]:
    """The imports of `source`, the module `name` (or, with package_given, a module of package `name`)."""
    found = set()
    package = name if package_given else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(source)):
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
    assert {"packer.preprocess.pipeline", "packer.store.dataset", "packer.train.data", "packer.io.fs"} <= set(graph)
    assert "packer.io.fs" in graph["packer.preprocess.pipeline"] and "torch" in graph["packer.train.data"]


def test_no_import_cycle():
    assert _cycle(_graph()) is None, " -> ".join(_cycle(_graph()))


def test_a_cycle_is_found():
    assert _cycle({"packer.a": {"packer.b"}, "packer.b": {"packer.c"}, "packer.c": {"packer.a"}}) == [
        "packer.a", "packer.b", "packer.c", "packer.a"]
    assert _cycle({"packer.a": {"packer.b", "numpy"}, "packer.b": set()}) is None


def _table_reads(source: str) -> dict[str, list[str]]:
    """{module: [names]} of every packer import in config's source, when each one is a table read:
    inside a function that config's TABLES dict names, importing one upper-case name (the table).
    Any other packer import of config raises AssertionError naming it."""
    tree = ast.parse(source)
    readers = set()
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "TABLES" for t in node.targets):
            readers = {v.id for v in node.value.values}
    reads: dict[str, list[str]] = {}
    for node in tree.body:
        inside = isinstance(node, ast.FunctionDef) and node.name in readers
        for sub in ast.walk(node):
            if isinstance(sub, ast.ImportFrom) and (sub.module or "").startswith("packer") or (
                    isinstance(sub, ast.Import) and any(a.name.startswith("packer") for a in sub.names)):
                names = [a.name for a in sub.names]
                assert inside and isinstance(sub, ast.ImportFrom) and len(names) == 1 and names[0].isupper(), (
                    f"packer/config.py line {sub.lineno}: config imports packer only to read a table's names, inside "
                    f"a function of its TABLES (found {ast.unparse(sub)})")
                reads[sub.module] = names
    return reads


CONFIG_TABLES = set(_table_reads((PACKAGE / "config.py").read_text(encoding="utf-8")))
LEAF_LAYERS = {name.split(".")[1] for name in LEAVES}
ALLOWED = {  # layer -> the other packer layers its modules may import (besides the leaves); DESIGN.md's list
    "io": set(),
    "store": {"io"},
    "encode": {"io"},
    "stats": {"io", "store"},
    "preprocess": {"io", "store", "encode", "stats"},
    "train": {"io", "store", "encode"},
}
FACES = {"packer", "packer.cli", "packer.__main__", "packer.data", "packer.attention", "packer.hf",
         "packer.megatron", "packer.torchtitan"}  # on top: anything


def test_every_module_has_a_layer():
    """A new folder or top-level module is placed in the table, or named a leaf or a face, before it lands."""
    for name in _graph():
        assert name in FACES or name in LEAVES or _layer(name) in ALLOWED, f"{name}: in no layer of DESIGN.md's table"


def _violations(graph: dict[str, set[str]]) -> list[str]:
    """Every import of a packer module that DESIGN.md's table does not allow."""
    found = []
    for name, deps in sorted(graph.items()):
        if name in FACES:
            continue
        if name in LEAVES:
            allowed_names = LEAVES if name != "packer.config" else CONFIG_TABLES
            found += [f"{name} -> {d}" for d in sorted(deps) if d.startswith("packer.") and d not in allowed_names]
            continue
        layer = _layer(name)
        allowed = {layer} | ALLOWED.get(layer, set())
        found += [f"{name} -> {d}" for d in sorted(deps)
                  if d.startswith("packer") and d not in LEAVES and _layer(d) not in allowed]
    return found


def test_layers_point_one_way():
    assert not _violations(_graph()), "imports outside DESIGN.md's table:\n" + "\n".join(_violations(_graph()))


def test_an_arrow_outside_the_table_is_caught(tmp_path):
    """A lazy (function-level) import of train/ from stats/ is read and refused; io importing store too."""
    source = tmp_path / "x.py"
    source.write_text("def f():\n    from packer.train.online import OnlinePackedDataset\n")
    modules = _modules()
    deps = {d for d in _imports_of(source.read_text(), "packer.stats.x", modules) if d.startswith("packer")}
    assert deps == {"packer.train.online"}
    assert _violations({"packer.stats.x": deps}) == ["packer.stats.x -> packer.train.online"]
    assert _violations({"packer.io.y": {"packer.store.manifest", "packer.config"}}) == ["packer.io.y -> packer.store.manifest"]
    assert _violations({"packer.binpack": {"packer.config"}, "packer.config": {"packer.binpack"}}) == [
        "packer.config -> packer.binpack"]
    assert _violations({"packer.train.z": {"packer.encode.text", "packer.masks"}}) == []


@pytest.mark.parametrize("layer", ["io", "store", "encode", "stats", "preprocess"])
def test_no_torch_outside_train(layer):
    for name, deps in _graph().items():
        if _layer(name) == layer or (layer == "io" and name in LEAVES):
            assert "torch" not in deps, f"{name} imports torch; only packer/train/ may"


def test_leaves_import_no_packer_module():
    """Leaves import nothing of packer but config (the one home of the choice lists) and other leaves
    (online_pack packs with binpack); config itself nothing but the tables whose names it reads."""
    graph = _graph()
    for leaf in LEAVES:
        allowed = CONFIG_TABLES if leaf == "packer.config" else LEAVES
        inner = [d for d in graph[leaf] if d.startswith("packer") and d not in allowed]
        assert not inner, f"{leaf} must stay a leaf, but imports {inner}"


def test_config_reads_the_tables_and_nothing_else():
    """config's packer imports are its table reads (one table each, inside its TABLES reader): the
    shard formats and the executors today; a module-level import, or one of anything else, is refused."""
    reads = _table_reads((PACKAGE / "config.py").read_text(encoding="utf-8"))
    assert reads["packer.store.formats"] == ["FORMATS"] and reads["packer.preprocess.executors"] == ["EXECUTORS"]
    table = "def _names():\n    from packer.store.formats import FORMATS\n    return FORMATS\nTABLES = {'format': _names}\n"
    assert _table_reads(table) == {"packer.store.formats": ["FORMATS"]}
    for bad in ("from packer.store.formats import FORMATS\n" + table,  # at module level
                table.replace("import FORMATS", "import get"),  # not a table
                table.replace("TABLES = {'format': _names}", "TABLES = {}")):  # not a table reader
        with pytest.raises(AssertionError, match="config imports packer only to read a table's names"):
            _table_reads(bad)


# What a quiet build of the default (arrow) format never uses, so never imports (issue 38: a tiny build's
# start-up): another format's library, the progress bar's, the TOML reader, torch, plotting.
UNUSED_BY_A_QUIET_ARROW_BUILD = ("pyarrow.parquet", "tqdm", "tomllib", "torch", "matplotlib")


def test_a_quiet_arrow_build_leaves_out_what_it_does_not_use(tmp_path):
    """`packer build --quiet` in a fresh interpreter, then the modules it loaded: none of the list above
    (tqdm and pyarrow.parquet were imported by every build before the lazy imports of 2026-12-05)."""
    import json
    import subprocess
    import sys

    from conftest import SAMPLE, TOKENIZER

    doc = tmp_path / "three.jsonl"
    doc.write_text("".join((SAMPLE / "prose.jsonl").read_text(encoding="utf-8").splitlines(True)[:3]), encoding="utf-8")
    code = ("import json, sys\nfrom packer.cli import main\n"
            f"sys.argv = ['packer', 'build', {str(doc)!r}, '-o', {str(tmp_path / 'out')!r}, '--tokenizer', "
            f"{str(TOKENIZER)!r}, '--context-length', '128', '--quiet']\n"
            "try:\n    main(sys.argv[1:])\nexcept SystemExit as e:\n    assert not e.code, e.code\n"
            f"print(json.dumps([m for m in {UNUSED_BY_A_QUIET_ARROW_BUILD!r} if m in sys.modules]))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "out" / "manifest.json").exists()
    assert json.loads(done.stdout.splitlines()[-1]) == []
