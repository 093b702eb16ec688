"""A dataset's files are regular files inside its directory, for every reader (issue 28): a shard
that is a FIFO is refused before it is opened (opening one blocks forever), a shard that is a
symlink to an identical copy elsewhere is refused too; one `Error:` line, never a hang."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest
from conftest import ROOT, run_packer

READERS = ("verify", "inspect", "stats")


def _damaged(sample_dataset, tmp_path, kind):
    d = tmp_path / "ds"
    shutil.copytree(sample_dataset, d)
    shard = d / "shard-00000.arrow"
    if kind == "fifo":
        shard.unlink()
        os.mkfifo(shard)
        return d, "FIFO"
    elsewhere = tmp_path / "elsewhere.arrow"
    shutil.move(shard, elsewhere)  # the identical bytes: only the link itself can refuse it
    shard.symlink_to(elsewhere)
    return d, "symbolic link"


@pytest.mark.parametrize("kind", ["fifo", "symlink"])
def test_a_shard_that_is_not_a_regular_file_is_refused_by_every_reader(sample_dataset, tmp_path, kind):
    d, said = _damaged(sample_dataset, tmp_path, kind)
    for command in READERS:
        code, output = run_packer([command, str(d)], timeout=60)  # a hang is a TimeoutExpired: a failure
        lines = output.strip().splitlines()
        assert code == 1 and len(lines) == 1 and lines[0].startswith("Error: "), (command, output)
        assert "shard-00000.arrow" in lines[0] and said in lines[0], (command, output)
    code = ("from packer.store.dataset import open_dataset\ntry:\n    open_dataset(%r)\nexcept ValueError as e:\n"
            "    print('refused:', e)\n") % str(d)
    run = subprocess.run([sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": str(ROOT)},
                         capture_output=True, text=True, timeout=60)
    assert run.stdout.startswith("refused:") and said in run.stdout, run.stdout + run.stderr
