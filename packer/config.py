"""Build configuration: one frozen dataclass that the CLI and pipeline TOML files both produce.

Every choice list and default lives here, but for the names of the extension tables: a shard
format, an executor or an encode engine is one module plus one line in its table
(packer/store/formats FORMATS, packer/preprocess/executors EXECUTORS, packer/encode/engines
ENGINES), and `choices(field)` reads
the names from the table each time a value is checked: no second list to keep in step.

The table readers (TABLES) are this leaf's only imports of packer, each inside its function.
config is imported by every layer and the tables sit in layers above it: a module-level import
would load pyarrow and the executors with `import packer.config` and tie the leaf to those
layers; read lazily, a BuildConfig reads the formats table and a Job the executors table, only
when checked. tests/test_imports.py allows exactly these imports (one table, inside a TABLES
reader), and no table module may import config back (a cycle). Checking these fields at the edge
instead (CLI, build()) would let BuildConfig(format="parquet") construct and a pipeline file's
typo surface only once a build starts.
"""

from __future__ import annotations

import dataclasses
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

ALGORITHMS = ("ffd", "bfd")
LONG_DOC_POLICIES = ("split", "truncate", "drop")
TEXT_SPLITS = ("file", "blank-line")
ON_FILE_ERROR = ("fail", "skip")
INPUT_KINDS = ("text", "prompt-completion", "chat", "tokens", "auto")
LONG_PROMPT_POLICIES = ("split", "drop")
CHOICES = {"algorithm": ALGORITHMS, "long_docs": LONG_DOC_POLICIES, "text_split": TEXT_SPLITS,
           "on_file_error": ON_FILE_ERROR, "input_kind": INPUT_KINDS,
           "long_prompts": LONG_PROMPT_POLICIES}  # field -> allowed values (the CLI's too); and TABLES below


def _format_names() -> tuple[str, ...]:
    from packer.store.formats import FORMATS

    return tuple(FORMATS)


def _executor_names() -> tuple[str, ...]:
    from packer.preprocess.executors import EXECUTORS

    return tuple(EXECUTORS)


def _engine_names() -> tuple[str, ...]:
    from packer.encode.engines import ENGINES

    return ("auto", *ENGINES)  # auto: the fastest exact engine for the tokenizer (packer/encode/engines)


# field -> the names of its table, read when asked (module docstring); a table's field is one line here
TABLES = {"format": _format_names, "executor": _executor_names, "encode_engine": _engine_names}


def choices(name: str) -> tuple[str, ...] | None:
    """The values config field `name` allows (None: it is no choice), for the checks below and the
    CLI's options: config's own list, or the names its table holds now."""
    if name in TABLES:
        return TABLES[name]()
    return CHOICES.get(name)


# Fields that only records (input_kind other than "text") read: a text build leaves them out of its
# manifest and fingerprint, so raw-text datasets keep their bytes (docs/inputs.md).
RECORD_FIELDS = ("input_kind", "prompt_field", "completion_field", "messages_field", "ids_field", "labels_field",
                 "loss_mask_field", "train_roles", "chat_template", "long_prompts")


DEFAULT_ROLE_NAMES = "system,user,assistant,tool"
ROLE_EXTRAS = ("template", "other")  # the ids after the named roles: tokens outside every message; unnamed roles
MAX_ROLE_NAMES = 253  # role ids are uint8; 255 is padding's (packer.masks.PAD_ROLE)


def role_table(role_names: str = DEFAULT_ROLE_NAMES) -> dict[str, int]:
    """The role table of a chat build with --store-roles: "system,user" -> {system: 0, user: 1, template: 2, other: 3}."""
    names = [r.strip() for r in role_names.split(",") if r.strip()]
    return {name: i for i, name in enumerate([*names, *ROLE_EXTRAS])}


# Tokenizer threads a default worker gets: one encode_batch_fast keeps about 1.5 cores busy, and on
# this 2-core box 1 worker x 2 threads built 1.9x faster than 2 x 1 (benchmarks/bench_cores.py, 2026-12-01).
THREADS_PER_WORKER = 2


# The least context that trains a token: each document's first token in a row is labelled -100 (packer/masks.py),
# so a row of 1 token trains nothing; with 2, a row of one document trains its second token.
MIN_CONTEXT = 2


def _field(default, help: str, minimum: int | None = None):
    """A config field with its one line of --help and its least value (the CLI builds its options from these)."""
    return field(default=default, metadata={"help": help, "minimum": minimum})


@dataclass(frozen=True, kw_only=True)
class BuildConfig:
    """Everything that decides the bytes of a build (workers and paths do not)."""

    context_length: int = _field(2048, "Tokens per packed sequence (at least 2: a row of 1 token trains nothing).",
                                 minimum=MIN_CONTEXT)
    algorithm: str = _field("ffd", "Packing: first-fit or best-fit decreasing.")
    long_docs: str = _field("split", "Documents longer than the context: split into pieces (every token kept), "
                                     "truncate, or drop.")
    seed: int = _field(0, "Seed of the bin shuffle.")
    text_field: str = _field("text", "JSON field / Parquet or Arrow column holding the document text.")
    eos: bool = _field(True, "Append the end-of-text token to each document.")
    bos: bool | None = _field(None, "Prepend the begin-of-text token to each document (default: as the tokenizer's "
                                    "tokenizer_config.json add_bos_token says, else off).")
    eos_token: str | None = _field(None, "Name of the end-of-text token (default: found in the tokenizer).")
    bos_token: str | None = _field(None, "Name of the begin-of-text token (default: found in the tokenizer).")
    format: str = _field("arrow", "Shard format: Arrow IPC; memmap (flat .bin tokens + .idx for np.memmap); or megatron "
                                  "(Megatron-Core .bin + MMIDIDX .idx, with a .docids.npy sidecar; Megatron's stock "
                                  "GPTDataset re-packs it across documents: train with "
                                  "packer.megatron.PackedGPTDataset); or nemo (the .idx.parquet files NeMo / "
                                  "Megatron-Bridge packed fine-tuning reads).")
    shard_size: int = _field(100_000_000, "Tokens per shard (100M uint16 tokens = 200 MB).", minimum=1)
    unit_bytes: int = _field(64 * 2**20, "Uncompressed inputs are split into work units of about this many bytes.", minimum=1)
    pack_group: int | None = _field(None, "Pack each N consecutive documents separately (bounded planning work; "
                                          "costs a little fill rate). Default: all at once.", minimum=1)
    plan_memory: int | None = _field(None, "Plan in groups that fit this many bytes per planning task (instead of "
                                           "--pack-group; about 128 bytes a document). Default: all at once.", minimum=1)
    text_split: str = _field("file", ".txt inputs: one document per file, or documents separated by blank lines.")
    strict: bool = _field(False, "Fail on the first bad record instead of skipping and counting it.")
    on_file_error: str = _field("fail", "An unreadable or corrupt input file fails the run, or is skipped and reported.")
    max_doc_bytes: int = _field(64 * 2**20, "Larger records are skipped (reason too_large) without being read whole.", minimum=1)
    max_skip_fraction: float | None = _field(None, "Fail the build (before its manifest; the same command resumes) when "
                                                   "more than this share of the documents read is skipped, e.g. 0.01. "
                                                   "Default: off (a build that accepts nothing always fails).", minimum=0)
    encode_engine: str = _field("auto", "Encode engine: auto (a fast engine where it gives the ids of the "
                                "tokenizer exactly, else hf), hf (HuggingFace tokenizers), or a named one (docs/engines.md).")
    input_kind: str = _field("text", "What a record is: text (every token trained), prompt-completion, chat (messages "
                                     "rendered with the tokenizer's chat template), tokens (pre-tokenized ids with labels "
                                     "or a loss mask), or auto (detected from each file's first record).")
    prompt_field: str = _field("prompt", "prompt-completion: the field holding the prompt (not trained).")
    completion_field: str = _field("completion", "prompt-completion: the field holding the completion (trained, with its eos).")
    messages_field: str = _field("messages", "chat: the field holding the list of {role, content} messages.")
    ids_field: str = _field("input_ids", "tokens: the field holding the token ids.")
    labels_field: str = _field("labels", "tokens: the field holding labels (-100 = not trained), if the record has it.")
    loss_mask_field: str = _field("loss_mask", "tokens: the field holding a 0/1 loss mask, if the record has no labels.")
    train_roles: str = _field("assistant", "chat: roles whose turns are trained, comma-separated (e.g. assistant,tool).")
    chat_template: str | None = _field(None, "chat: a Jinja template file, or a tokenizer_config.json holding one "
                                             "(default: the chat template shipped beside the tokenizer).")
    long_prompts: str = _field("split", "Examples whose prompt (the untrained tokens before the first trained one) "
                                        "leaves no room in the context for a trained token: split like any long "
                                        "document, or drop (counted as prompt_too_long).")
    store_roles: bool = _field(False, "chat: store each token's role id (role_ids) beside the tokens, the role table "
                                      "in the manifest, for role-aware attention masks (docs/role_masks.md).")
    role_names: str = _field(DEFAULT_ROLE_NAMES, "chat with --store-roles: the message roles given their own id, in "
                                                 "order (then 'template' for the template's own tokens, 'other' for "
                                                 "any role not named).")

    def __post_init__(self):
        if type(self.context_length) is not int or self.context_length < MIN_CONTEXT:
            raise ValueError(f"context_length must be at least {MIN_CONTEXT}, got {self.context_length!r}: in a row "
                             "of one token that token is its document's first, labelled -100, so nothing trains")
        _check_choices(self)
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
        memory = self.plan_memory
        if memory is not None and (type(memory) is not int or memory < 1):
            raise ValueError(f"plan_memory must be a whole number of bytes >= 1 (or unset), got {memory!r}")
        if memory is not None and group is not None:
            raise ValueError(f"pack_group ({group}) and plan_memory ({memory}) both set the group size; give one of them")
        if self.bos not in (None, True, False):
            raise ValueError(f"bos must be true, false or unset (as the tokenizer says), got {self.bos!r}")
        if self.max_doc_bytes < 1:
            raise ValueError(f"max_doc_bytes must be >= 1, got {self.max_doc_bytes}")
        limit = self.max_skip_fraction
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int | float) or not 0 <= limit < 1):
            raise ValueError(f"max_skip_fraction must be a share in [0, 1), e.g. 0.01 (or unset: off), got {limit!r}")
        if isinstance(self.train_roles, (list, tuple)):  # a TOML list: stored as the CLI spells it
            object.__setattr__(self, "train_roles", ",".join(map(str, self.train_roles)))
        if not isinstance(self.train_roles, str) or not self.roles:
            raise ValueError(f"train_roles must name at least one role, e.g. \"assistant\" or \"assistant,tool\"; "
                             f"got {self.train_roles!r}")
        self._check_roles()

    def _check_roles(self):
        if isinstance(self.role_names, (list, tuple)):  # a TOML list, as train_roles
            object.__setattr__(self, "role_names", ",".join(map(str, self.role_names)))
        if self.store_roles not in (True, False):
            raise ValueError(f"store_roles must be true or false, got {self.store_roles!r}")
        if self.store_roles and self.input_kind != "chat":
            raise ValueError(f"store_roles keeps the roles of chat messages: it needs input_kind=\"chat\" (got "
                             f"{self.input_kind!r}); pass --input-kind chat, or drop --store-roles")
        names = [r.strip() for r in self.role_names.split(",") if r.strip()] if isinstance(self.role_names, str) else []
        bad = [n for n in names if n in ROLE_EXTRAS] or [n for n in names if names.count(n) > 1]
        if not names or bad or len(names) > MAX_ROLE_NAMES:
            why = f"{bad[0]!r} is reserved or named twice" if bad else f"{len(names)} names (1..{MAX_ROLE_NAMES})"
            raise ValueError(f"role_names {self.role_names!r}: {why}; give distinct roles, e.g. "
                             f"\"{DEFAULT_ROLE_NAMES}\"")

    @property
    def role_table(self) -> dict[str, int]:
        """The role id of each role name a build with store_roles stores (config.role_table)."""
        return role_table(self.role_names)

    @property
    def roles(self) -> tuple[str, ...]:
        """train_roles as a tuple: "assistant, tool" -> ("assistant", "tool")."""
        if not isinstance(self.train_roles, str):
            return ()
        return tuple(r.strip() for r in self.train_roles.split(",") if r.strip())

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        if d["max_skip_fraction"] is None:  # off: not written, so manifests of builds without it keep their bytes
            del d["max_skip_fraction"]
        if d["plan_memory"] is None:  # likewise
            del d["plan_memory"]
        if d["encode_engine"] == "auto":  # the default: builds that do not name an engine keep their bytes
            del d["encode_engine"]
        if d["input_kind"] == "text":  # records settings mean nothing to text: raw-text builds keep their bytes
            for key in RECORD_FIELDS:
                del d[key]
        if not d["store_roles"]:  # off: builds without roles keep their bytes
            del d["store_roles"], d["role_names"]
        return d


SOURCE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
MAX_SOURCES = 65535  # a stored source id is a uint16


@dataclass(frozen=True, kw_only=True)
class Source:
    """A named part of a job's inputs (web, code, books): its segments carry its id, the manifest its totals.

    `text_field` / `text_split` override the build's for this source's files only (None: the build's)."""

    name: str
    inputs: tuple[str, ...]
    text_field: str | None = None
    text_split: str | None = None

    def __post_init__(self):
        if not isinstance(self.name, str) or not SOURCE_NAME.fullmatch(self.name):
            raise ValueError(f"source name {self.name!r} must be 1-64 letters, digits, '_', '.' or '-' "
                             "starting with a letter or digit, e.g. web")
        if isinstance(self.inputs, str) or not self.inputs:
            raise ValueError(f"source {self.name!r} needs a list of inputs (files, directories, globs or URIs)")
        if self.text_field is not None and (not isinstance(self.text_field, str) or not self.text_field):
            raise ValueError(f"source {self.name!r}: text_field must be a field name, got {self.text_field!r}")
        if self.text_split is not None and self.text_split not in TEXT_SPLITS:
            raise ValueError(f"source {self.name!r}: text_split must be one of {', '.join(TEXT_SPLITS)}; "
                             f"got {self.text_split!r}")


@dataclass(frozen=True, kw_only=True)
class Job:
    """A whole run: what to read (`inputs`, or named `sources`), how to tokenize, the config, where to
    write, how many workers."""

    inputs: tuple[str, ...]
    tokenizer: str
    output: str
    config: BuildConfig = field(default_factory=BuildConfig)
    workers: int = _field(0, "Worker processes (default 0: one per 2 usable cores, each with 2 tokenizer threads; "
                             "ray: tasks in flight, 0 = 2x the cluster's CPUs).", minimum=0)
    executor: str = _field("local", "Run stages in local processes or as Ray tasks (same output bytes).")
    ray_address: str | None = _field(None, "Ray cluster for --executor ray (default: $RAY_ADDRESS, a cluster on "
                                           "this machine, else a new local one).")
    sources: tuple[Source, ...] = ()

    def __post_init__(self):
        if self.sources and self.inputs:
            raise ValueError("a job names its inputs or its sources, not both: put every input in a source "
                             "(--source NAME=PATH, or [sources.NAME] inputs = [...])")
        if not self.inputs and not self.sources:
            raise ValueError("a job needs at least one input")
        _check_sources(self.sources)
        if self.workers < 0:
            raise ValueError(f"workers must be >= 0, got {self.workers}")
        _check_choices(self)
        if self.ray_address and self.executor != "ray":
            raise ValueError(f"ray_address {self.ray_address!r} is set but the executor is {self.executor!r}; set executor = \"ray\" (--executor ray)")

    @property
    def n_workers(self) -> int:
        """--workers, else one per THREADS_PER_WORKER usable cores (taskset and cpusets counted); each
        worker then runs cores // workers tokenizer threads (packer/preprocess/executors.py)."""
        if self.workers:
            return self.workers
        try:
            cores = len(os.sched_getaffinity(0)) or 1
        except AttributeError:  # not Linux
            cores = os.cpu_count() or 1
        return max(1, cores // THREADS_PER_WORKER)


def _check_sources(sources):
    names = [s.name for s in sources]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ValueError(f"source names must differ; {', '.join(twice)} is named more than once")
    if len(sources) > MAX_SOURCES:
        raise ValueError(f"{len(sources):,} sources: at most {MAX_SOURCES:,} (a stored source id is a uint16)")


def _check_choices(obj):
    for f in dataclasses.fields(obj):
        value, allowed = getattr(obj, f.name), choices(f.name)
        if allowed is not None and value not in allowed:
            raise ValueError(f"{f.name} must be one of {', '.join(allowed)}; got {value!r}")


def load_job(path: str | Path) -> Job:
    """Read a pipeline TOML file (see pipelines/sample.toml). Relative paths in it are taken
    relative to the current directory, like paths given on the command line."""
    import tomllib  # here: `packer build` reads no TOML

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"pipeline file not found: {path}")
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as e:
        raise ValueError(f"{path}: not valid TOML: {e}") from None
    except RecursionError:  # tomllib parses nested arrays and inline tables recursively
        raise ValueError(f"{path}: arrays or tables nested too deeply to read (a pipeline file nests 3 levels); "
                         "fix the file") from None
    known = {"inputs", "sources", "tokenizer", "output", "workers", "executor", "ray_address", "config"}
    unknown = set(data) - known
    if unknown:
        raise ValueError(f"{path}: unknown keys {sorted(unknown)}; expected {sorted(known)}")
    config_keys = {f.name for f in dataclasses.fields(BuildConfig)}
    cfg = data.get("config", {})
    bad = set(cfg) - config_keys
    if bad:
        raise ValueError(f"{path}: unknown [config] keys {sorted(bad)}; expected {sorted(config_keys)}")
    for key in ("tokenizer", "output"):
        if key not in data:
            raise ValueError(f"{path}: missing required key {key!r}")
    if "inputs" not in data and "sources" not in data:
        raise ValueError(f"{path}: missing required key 'inputs' (or [sources.NAME] tables)")
    inputs = data.get("inputs", [])
    if isinstance(inputs, str):
        inputs = [inputs]
    return Job(
        inputs=tuple(inputs),
        sources=_load_sources(data.get("sources", {}), path),
        tokenizer=data["tokenizer"],
        output=data["output"],
        config=BuildConfig(**cfg),
        workers=int(data.get("workers", 0)),
        executor=data.get("executor", "local"),
        ray_address=data.get("ray_address"),
    )


SOURCE_KEYS = ("inputs", "text_field", "text_split")


def _load_sources(table, path) -> tuple[Source, ...]:
    """`[sources.web] inputs = [...]` tables (in file order), or `[[sources]] name = "web"` entries -> Sources."""
    if isinstance(table, dict):
        entries = [{"name": name, **(body if isinstance(body, dict) else {"inputs": body})} for name, body in table.items()]
    elif isinstance(table, list) and all(isinstance(t, dict) for t in table):
        entries = table
    else:
        raise ValueError(f"{path}: sources must be [sources.NAME] tables or [[sources]] entries with a name")
    out = []
    for entry in entries:
        bad = set(entry) - {"name", *SOURCE_KEYS}
        if bad or "name" not in entry or "inputs" not in entry:
            raise ValueError(f"{path}: source {entry.get('name', '(no name)')!r}: unknown keys {sorted(bad)} or a "
                             f"missing name/inputs; a source takes name, {', '.join(SOURCE_KEYS)}")
        inputs = entry["inputs"]
        out.append(Source(name=entry["name"], inputs=(inputs,) if isinstance(inputs, str) else tuple(inputs),
                          text_field=entry.get("text_field"), text_split=entry.get("text_split")))
    return tuple(out)


def _pairs(items, option: str, example: str) -> list[tuple[str, str]]:
    out = []
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name or not value:
            raise ValueError(f"{option} {item!r} is not NAME=VALUE; write e.g. {option} {example}")
        out.append((name, value))
    return out


def sources_from_options(paths=(), fields=(), splits=()) -> tuple[Source, ...]:
    """--source web=a.jsonl --source web=b/ --source code=c.jsonl --source-field code=content
    -> (Source web [a.jsonl, b/], Source code [c.jsonl] text_field content): names in first-given order."""
    inputs: dict[str, list[str]] = {}
    for name, path in _pairs(paths, "--source", "web=data/web/"):
        inputs.setdefault(name, []).append(path)
    settings: dict[str, dict] = {name: {} for name in inputs}
    for option, key, items, example in (("--source-field", "text_field", fields, "code=content"),
                                        ("--source-split", "text_split", splits, "books=blank-line")):
        for name, value in _pairs(items, option, example):
            if name not in settings:
                raise ValueError(f"{option} {name}={value}: no --source {name}=PATH names that source "
                                 f"(sources: {', '.join(settings) or 'none'})")
            settings[name][key] = value
    return tuple(Source(name=name, inputs=tuple(paths), **settings[name]) for name, paths in inputs.items())
