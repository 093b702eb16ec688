"""The README's training-loop example runs as written, against a built dataset at out/sample."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[1]


def readme_training_loop() -> str:
    """The first python block of the README section "Loading in a training loop"."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split("## Loading in a training loop", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_training_loop_example_runs(sample_dataset, tmp_path):
    code = readme_training_loop()
    assert "PackedDataset" in code and "loss.backward()" in code and "load_state_dict" in code
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "sample").symlink_to(sample_dataset)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}  # a shared CI box: no thread pool stalls
    result = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                            timeout=600)
    assert result.returncode == 0, result.stderr
    from packer.store.dataset import open_dataset

    n = len(open_dataset(sample_dataset))
    # 2 batches of 2 were taken in epoch 1 before the checkpoint
    assert re.fullmatch(rf"loss \d+\.\d+; {n - 4} of {n} sequences left in epoch 1\n", result.stdout), result.stdout
