"""The local/remote fork lives only in packer/io/ (DESIGN.md: "Places are resolved once ... nothing below
re-resolves a string or branches on local vs remote"): read from the source, no module outside io/ names
RemotePath in its code (an isinstance branch, a type check, a construction), annotations aside. What such a
module needs of a place it asks io/ (fs.location, fs.for_numpy, fs.link_target, fs.not_regular, ...)."""

from __future__ import annotations

import ast

import pytest
from conftest import ROOT

PACKAGE = ROOT / "packer"


def _annotation_nodes(tree) -> set[int]:
    """ids of every node inside an annotation (a parameter's, a return's, a variable's)."""
    roots = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            args = node.args
            roots += [a.annotation for a in args.posonlyargs + args.args + args.kwonlyargs if a.annotation]
            roots += [a.annotation for a in (args.vararg, args.kwarg) if a is not None and a.annotation]
            roots += [node.returns] if node.returns else []
        elif isinstance(node, ast.AnnAssign):
            roots.append(node.annotation)
    return {id(n) for root in roots for n in ast.walk(root)}


def remote_path_uses(source: str) -> list[int]:
    """Line numbers where `source`'s code names RemotePath (fs.RemotePath or a bare RemotePath), annotations aside."""
    tree = ast.parse(source)
    skip = _annotation_nodes(tree)
    return sorted(node.lineno for node in ast.walk(tree) if id(node) not in skip and (
        (isinstance(node, ast.Name) and node.id == "RemotePath")
        or (isinstance(node, ast.Attribute) and node.attr == "RemotePath")))


def test_no_module_outside_io_branches_on_remote_paths():
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.relative_to(PACKAGE).parts[0] == "io":
            continue
        lines = remote_path_uses(path.read_text(encoding="utf-8"))
        if lines:
            found[str(path.relative_to(ROOT))] = lines
    assert found == {}, f"local/remote forks outside packer/io/ (move each behind an io/ function): {found}"


def test_the_scan_finds_a_fork_where_there_is_one():
    """So the scan above cannot pass by finding nothing: it finds io/fs.py's own forks, and each shape of one."""
    assert len(remote_path_uses((PACKAGE / "io" / "fs.py").read_text(encoding="utf-8"))) >= 5
    assert remote_path_uses("if isinstance(loc, fs.RemotePath):\n    pass\n") == [1]
    assert remote_path_uses("from packer.io.fs import RemotePath\nx = isinstance(a, (Path, RemotePath))\n") == [2]
    assert remote_path_uses("ok = type(p) is fs.RemotePath\n") == [1]
    assert remote_path_uses("def f(p: fs.RemotePath) -> RemotePath:\n    q: fs.RemotePath = p\n") == []


def test_link_target_and_not_regular_answer_for_either_kind_of_place(tmp_path):
    """What store/manifest.require_regular asks of io/ instead of lstat-ing a place itself: a local link's target,
    None for a file, a missing one and a remote object (a store has no links); not_regular names a FIFO."""
    import os

    from packer.io import fs
    from packer.store.manifest import require_regular

    (tmp_path / "real.json").write_text("{}")
    os.symlink(tmp_path / "real.json", tmp_path / "link.json")
    os.mkfifo(tmp_path / "pipe")
    assert fs.link_target(tmp_path / "link.json") == str(tmp_path / "real.json")
    assert fs.link_target(tmp_path / "real.json") is None and fs.link_target(tmp_path / "missing") is None
    assert fs.link_target("memory://bucket/a.json") is None and fs.not_regular("memory://bucket/a.json") is None
    assert fs.not_regular(tmp_path / "pipe") == "FIFO (named pipe)"
    for name, message in (("link.json", r"link.json: a symbolic link \(to .*real.json\), not a file of the dataset"),
                          ("pipe", r"pipe: a FIFO \(named pipe\), not a regular file")):
        with pytest.raises(ValueError, match=message):
            require_regular(tmp_path / name)
    require_regular(tmp_path / "real.json")
    require_regular(tmp_path / "missing")
    require_regular("memory://bucket/a.json")
