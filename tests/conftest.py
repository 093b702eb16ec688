"""Shared fixtures: the bundled sample corpus, its tokenizer, and one built dataset per session."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "sample_data"
SAMPLE_INPUTS = (str(SAMPLE / "prose.jsonl"), str(SAMPLE / "code.jsonl"))
TOKENIZER = str(SAMPLE / "tokenizer.json")


def sample_texts() -> list[str]:
    """Every document of the sample corpus, in build order."""
    texts = []
    for path in SAMPLE_INPUTS:
        with open(path, encoding="utf-8") as f:
            texts.extend(json.loads(line)["text"] for line in f)
    return texts


def build_sample(output, *, workers=1, **config):
    from packer.config import BuildConfig, Job
    from packer.pipeline import build

    job = Job(inputs=SAMPLE_INPUTS, tokenizer=TOKENIZER, output=str(output), workers=workers,
              config=BuildConfig(**{"context_length": 1024, **config}))
    return build(job, keep_work=False)


@pytest.fixture(scope="session")
def sample_dataset(tmp_path_factory):
    """The sample corpus built once, context 1024, small shards so there are several."""
    out = tmp_path_factory.mktemp("sample") / "ds"
    build_sample(out, workers=2, shard_size=200_000)
    return out
