"""docs/trainers.md's Python blocks run as written: each with only what the page leaves to the reader defined
before it (a model, a tokenizer, the data-parallel rank), in a directory whose out/sample, out/web and out/chat are
small builds; a training loop stops after its first batch (a `break` after the loop's body), max_steps=1000 is 2 (and, as the page
says for a machine without a GPU, `use_cpu=True`: SFTConfig's bf16 default needs it)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import SAMPLE, TOKENIZER

pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[1]

TINY_LLAMA = f"""
import transformers
tokenizer = transformers.PreTrainedTokenizerFast(tokenizer_file={TOKENIZER!r}, eos_token="<|endoftext|>")
model = transformers.LlamaForCausalLM(transformers.LlamaConfig(
    vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
    num_key_value_heads=2, max_position_embeddings=512))
"""

MEGATRON_MODEL = """
import torch
from megatron.core.tokenizers.text.libraries.null_tokenizer import NullTokenizer
tokenizer, n_train, n_valid = NullTokenizer(16384), 20, 0  # 2% of a small build is no row

def model(tokens, position_ids, attention_mask, labels=None, packed_seq_params=None):
    assert packed_seq_params.qkv_format == "thd" and tokens.shape == labels.shape == position_ids.shape
    return torch.ones(labels.shape)  # a per-token loss
"""

# section heading -> (the block's first line, what the page leaves to the reader, a package it needs)
BLOCKS = {
    "HF transformers Trainer": ("from transformers import TrainingArguments", TINY_LLAMA, "transformers"),
    "TRL SFTTrainer": ("from trl import SFTConfig, SFTTrainer", TINY_LLAMA, "trl"),
    "torchtitan": ("from packer.torchtitan import", "dp_rank, dp_world_size = 0, 1\n", "torchdata"),
    "Plain PyTorch": ("import torch", "", "torch"),
    "Megatron-LM / Megatron-Core": ("from megatron.core.datasets.blended_megatron_dataset_builder import",
                                    MEGATRON_MODEL, "megatron.core"),
}
SLOW = {"HF transformers Trainer", "TRL SFTTrainer", "Megatron-LM / Megatron-Core"}  # 15-30 s each on 2 busy cores
# (importing the stack); their fast twins: test_trl.py, test_megatron_adapter.py


def doc_block(heading: str, first_line: str) -> str:
    """The Python block of docs/trainers.md's section `heading` that starts with `first_line`."""
    text = (ROOT / "docs" / "trainers.md").read_text(encoding="utf-8")
    section = text.split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]
    blocks = [b for b in re.findall(r"```python\n(.*?)```", section, re.S) if b.startswith(first_line)]
    assert len(blocks) == 1, f"{heading}: {len(blocks)} python blocks start with {first_line!r}"
    return blocks[0]


def one_step(code: str) -> str:
    """The code with its first for-loop left after one pass of its body (`...` as its body: just the break);
    code without a loop as it is."""
    lines = code.splitlines()
    start = next((i for i, line in enumerate(lines) if re.match(r"for .*:", line)), None)
    if start is None:
        return code
    end = next((i for i in range(start + 1, len(lines)) if lines[i] and not lines[i].startswith(" ")), len(lines))
    body = [line for line in lines[start + 1:end] if line.strip() != "..."]
    return "\n".join(lines[:start + 1] + body + ["    break"] + lines[end:]) + "\n"


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    """out/sample (= out/web): a text build, out/chat: a chat build with assistant-only masks, both at context 256."""
    from packer.config import BuildConfig, Job
    from packer.preprocess.pipeline import build

    root = tmp_path_factory.mktemp("trainers-doc")
    for name, source, kind, n in (("sample", "prose.jsonl", "text", 60), ("chat", "chat.jsonl", "chat", 40)):
        with open(SAMPLE / source, encoding="utf-8") as f:
            (root / source).write_text("".join(next(f) for _ in range(n)), encoding="utf-8")
        build(Job(inputs=(str(root / source),), tokenizer=TOKENIZER, output=str(root / "out" / name), workers=1,
                  config=BuildConfig(context_length=256, input_kind=kind)), progress="off")
    (root / "out" / "web").symlink_to(root / "out" / "sample")
    return root


@pytest.mark.parametrize("heading", [pytest.param(h, marks=pytest.mark.slow) if h in SLOW else h for h in BLOCKS])
def test_block_runs_as_written(workdir, heading):
    first_line, prelude, needs = BLOCKS[heading]
    pytest.importorskip(needs)
    code = one_step(doc_block(heading, first_line)).replace("max_steps=1000", "max_steps=2, use_cpu=True")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    result = subprocess.run([sys.executable, "-c", prelude + code], cwd=workdir, env=env, capture_output=True,
                            text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]


def test_one_step_stops_a_loop_after_its_body():
    code = "x = 0\nfor i in range(5):\n    x += i\n    ...\nprint(x)\n"
    assert one_step(code) == "x = 0\nfor i in range(5):\n    x += i\n    break\nprint(x)\n"
    assert one_step("x = 1\n") == "x = 1\n"
