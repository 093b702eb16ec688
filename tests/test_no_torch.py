"""The preprocessing side imports and builds without torch (a preprocessing box often has none)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from conftest import ROOT, SAMPLE_INPUTS, TOKENIZER

SCRIPT = """
import sys
class NoTorch:
    def find_spec(self, name, path=None, target=None):
        if name == "torch" or name.startswith("torch."):
            raise ImportError("torch is not installed here")
sys.meta_path.insert(0, NoTorch())
from packer.cli import main
main(sys.argv[1:])
"""


def test_build_and_stats_run_without_torch(tmp_path):
    out = tmp_path / "ds"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    build = [sys.executable, "-c", SCRIPT, "build", SAMPLE_INPUTS[0], "--tokenizer", TOKENIZER,
             "--context-length", "512", "--output", str(out), "--workers", "1"]
    result = subprocess.run(build, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert json.loads(Path(out / "manifest.json").read_text())["totals"]["docs_accepted"] > 0
    stats = [sys.executable, "-c", SCRIPT, "stats", str(out), "--json", str(tmp_path / "s.json")]
    result = subprocess.run(stats, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]


def test_torch_faces_say_in_one_line_how_to_install_torch(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for face in ("packer.data", "packer.attention", "packer.hf", "packer.megatron", "packer.torchtitan"):
        check = [sys.executable, "-c", SCRIPT.replace("from packer.cli import main\nmain(sys.argv[1:])", f"import {face}")]
        result = subprocess.run(check, env=env, capture_output=True, text=True, timeout=300)
        assert result.returncode != 0 and "torch is not installed here" in result.stderr  # the blocker works
        last = result.stderr.strip().splitlines()[-1]
        assert last.startswith("ModuleNotFoundError: ") and "pip install 'packer[torch]'" in last, result.stderr
        assert face.split(".")[1] in last
        assert "During handling" not in result.stderr and "direct cause" not in result.stderr  # one error, not a chain
