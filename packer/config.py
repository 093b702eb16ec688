"""Build configuration: one frozen dataclass that the CLI and pipeline TOML files both produce."""

from __future__ import annotations

import dataclasses
import os
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

ALGORITHMS = ("ffd", "bfd")
LONG_DOC_POLICIES = ("split", "truncate", "drop")
FORMATS = ("arrow", "memmap", "megatron")
EXECUTORS = ("local", "ray")
TEXT_SPLITS = ("file", "blank-line")
ON_FILE_ERROR = ("fail", "skip")


@dataclass(frozen=True, kw_only=True)
class BuildConfig:
    """Everything that decides the bytes of a build (workers and paths do not)."""

    context_length: int = 2048
    algorithm: str = "ffd"
    long_docs: str = "split"
    seed: int = 0
    text_field: str = "text"
    eos: bool = True
    bos: bool = False
    eos_token: str | None = None  # None = find the tokenizer's end-of-text special token
    bos_token: str | None = None
    format: str = "arrow"
    shard_size: int = 100_000_000  # tokens per shard (~200 MB of uint16 tokens)
    unit_bytes: int = 64 * 2**20  # uncompressed inputs are split into ranges this size
    pack_group: int | None = None  # pack each N consecutive documents separately; None = all at once
    text_split: str = "file"  # .txt inputs: one document per file, or "blank-line" separated
    strict: bool = False  # the first bad record fails the run (default: skip and count it)
    on_file_error: str = "fail"  # an unreadable/corrupt input file fails the run, or is "skip"ped
    max_doc_bytes: int = 64 * 2**20  # larger records are skipped as too_large, never held whole

    def __post_init__(self):
        if self.context_length < 1:
            raise ValueError(f"context_length must be >= 1, got {self.context_length}")
        for name, value, allowed in (
            ("algorithm", self.algorithm, ALGORITHMS),
            ("long_docs", self.long_docs, LONG_DOC_POLICIES),
            ("format", self.format, FORMATS),
            ("text_split", self.text_split, TEXT_SPLITS),
            ("on_file_error", self.on_file_error, ON_FILE_ERROR),
        ):
            if value not in allowed:
                raise ValueError(f"{name} must be one of {', '.join(allowed)}; got {value!r}")
        if self.shard_size < self.context_length:
            raise ValueError(
                f"shard_size ({self.shard_size} tokens) must be at least the context length "
                f"({self.context_length})"
            )
        if self.unit_bytes < 1:
            raise ValueError(f"unit_bytes must be >= 1, got {self.unit_bytes}")
        group = self.pack_group
        if group is not None and (type(group) is not int or group < 1):
            raise ValueError(
                f"pack_group must be a whole number of documents >= 1 (or unset to pack all at once), "
                f"got {self.pack_group!r}"
            )
        if self.max_doc_bytes < 1:
            raise ValueError(f"max_doc_bytes must be >= 1, got {self.max_doc_bytes}")

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


@dataclass(frozen=True, kw_only=True)
class Job:
    """A whole run: what to read, how to tokenize, the config, where to write, how many workers."""

    inputs: tuple[str, ...]
    tokenizer: str
    output: str
    config: BuildConfig = field(default_factory=BuildConfig)
    workers: int = 0  # 0 = all cores (ray: tasks in flight, 0 = 2x the cluster's CPUs)
    executor: str = "local"  # where stages run: "local" processes or "ray" tasks (same bytes)
    ray_address: str | None = None  # None: $RAY_ADDRESS, a cluster on this machine, else a new local one

    def __post_init__(self):
        if not self.inputs:
            raise ValueError("a job needs at least one input")
        if self.workers < 0:
            raise ValueError(f"workers must be >= 0, got {self.workers}")
        if self.executor not in EXECUTORS:
            raise ValueError(f"executor must be one of {', '.join(EXECUTORS)}; got {self.executor!r}")
        if self.ray_address and self.executor != "ray":
            raise ValueError(f"ray_address {self.ray_address!r} is set but the executor is {self.executor!r}; set executor = \"ray\" (--executor ray)")

    @property
    def n_workers(self) -> int:
        return self.workers or os.cpu_count() or 1


def load_job(path: str | Path) -> Job:
    """Read a pipeline TOML file (see pipelines/sample.toml). Relative paths in it are taken
    relative to the current directory, like paths given on the command line."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"pipeline file not found: {path}")
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as e:
        raise ValueError(f"{path}: not valid TOML: {e}") from None
    known = {"inputs", "tokenizer", "output", "workers", "executor", "ray_address", "config"}
    unknown = set(data) - known
    if unknown:
        raise ValueError(f"{path}: unknown keys {sorted(unknown)}; expected {sorted(known)}")
    config_keys = {f.name for f in dataclasses.fields(BuildConfig)}
    cfg = data.get("config", {})
    bad = set(cfg) - config_keys
    if bad:
        raise ValueError(f"{path}: unknown [config] keys {sorted(bad)}; expected {sorted(config_keys)}")
    for key in ("inputs", "tokenizer", "output"):
        if key not in data:
            raise ValueError(f"{path}: missing required key {key!r}")
    inputs = data["inputs"]
    if isinstance(inputs, str):
        inputs = [inputs]
    return Job(
        inputs=tuple(inputs),
        tokenizer=data["tokenizer"],
        output=data["output"],
        config=BuildConfig(**cfg),
        workers=int(data.get("workers", 0)),
        executor=data.get("executor", "local"),
        ray_address=data.get("ray_address"),
    )
