"""The tokenize stage: one work unit -> its unit files, through the one encode path (packer/encode/).

Unit files, in the work directory (all written atomically; the .json last, so its
presence means the unit is complete and is never redone):

    unit-000007.tokens.npy   all token ids of the unit's accepted documents, concatenated
    unit-000007.lengths.npy  int64 length of each document (eos/bos included)
    unit-000007.json         counters: docs read / accepted / skipped by reason, examples, those
                             holding the EOS id inside them (docs_inner_eos: packer/preprocess/inner_eos.py),
                             and `input`, the hash of what was read (packer/preprocess/changed.py)

Both .npy files stream to disk while the unit is read, so a worker's memory does not grow
with the unit, nor with one huge document (encode_parts: a 200 MB document's ids are never
gathered; its text is a packer.io.utf8.Utf8Text, encoded a window at a time). Speed (benchmarks/bench_tokenize.py, 50 MB of JSONL, a busy 2-core machine,
2026-11-29): --workers 1 ran at 0.95 of Tokenizer.encode_batch_fast on the same texts in
memory (0.96 in CPU seconds), --workers 2 at 1.05 (0.98 in CPU seconds) in another run;
starting a 2-worker pool costs ~1.2 s once. Runs on that machine vary by +-20%.
"""

from __future__ import annotations

import itertools
import json
import struct

import numpy as np

from packer.config import BuildConfig
from packer.encode import engines
from packer.encode.engines import byte_level
from packer.encode.text import encode_parts, encode_texts
from packer.encode.tokenizer import TokenizerInfo, load_encoder, load_tokenizer, resolve_tokenizer, tokenizer_bytes
from packer.io import atomic, failpoints, fs
from packer.preprocess import changed
from packer.preprocess.inner_eos import InnerEos
from packer.preprocess.readers import FileError, SkipLog, Unit, field_names, read_records, read_unit


def tokenize_task(unit: Unit, info: TokenizerInfo, config: BuildConfig, units_dir: fs.Place) -> dict:
    """The stage's call for one unit on an executor (failpoint "unit" first: tests kill a worker here)."""
    failpoints.hit("unit", unit.index)
    return tokenize_unit(unit, info, config, units_dir)


def warm_worker(tokenizer: str, choice: str):
    """A pool worker's first work as it starts (executors.LocalExecutor warm): the tokenizer, and the
    engine's encoder that auto or `choice` takes unless the driver's check of the rule refuses it
    (then tasks load hf's), kept for the process by load_tokenizer / load_encoder, which each task
    calls. This module is what a pool's forkserver preloads: its imports are a worker's."""
    path = resolve_tokenizer(tokenizer)
    load_tokenizer(path)
    name = engines.FAST[0] if choice == "auto" else choice
    if name == "hf" or engines.ENGINES[name].missing() is not None:
        return
    if not isinstance(byte_level.ranked_vocab_at(path, check_reach=False, data=tokenizer_bytes(path)), str):
        load_encoder(path, name)  # the ranks made from the bytes the tokenizer was loaded from, and probed


def unit_paths(work_dir: fs.Place, index: int) -> dict:
    """The unit's three files in `work_dir` (a Path, or a RemotePath: see packer/io/fs.py)."""
    return {k: work_dir / f"unit-{index:06d}.{k}" for k in ("tokens.npy", "lengths.npy", "json")}


class _NpyAppender:
    """A 1-D .npy file written in pieces: a fixed 128-byte header first, rewritten with the final
    length on commit, so a unit of any size streams to disk instead of gathering in memory.
    Staged (packer/io/atomic.py): it appears under its name only when committed, locally or remote."""

    HEADER_BYTES = 128

    def __init__(self, path, dtype):
        self.dtype, self.n = np.dtype(dtype), 0
        self._staged = atomic.Staged(path)
        self._staged.f.write(self._header())

    def _header(self) -> bytes:
        body = "{'descr': %r, 'fortran_order': False, 'shape': (%d,), }" % (self.dtype.str, self.n)
        body = body.ljust(self.HEADER_BYTES - 11) + "\n"
        return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(body)) + body.encode("latin1")

    def append(self, array: np.ndarray):
        self._staged.f.write(np.ascontiguousarray(array, dtype=self.dtype).data)
        self.n += len(array)

    def commit(self):
        self._staged.f.seek(0)
        self._staged.f.write(self._header())
        self._staged.commit()

    def abort(self):
        self._staged.abort()


def unit_mask_path(work_dir: fs.Place, index: int):
    """The unit's loss mask (uint8, one per token of its tokens.npy), written only for record kinds."""
    return work_dir / f"unit-{index:06d}.loss_mask.npy"


def unit_roles_path(work_dir: fs.Place, index: int):
    """The unit's role ids (uint8, one per token of its tokens.npy), written only by chat builds with store_roles."""
    return work_dir / f"unit-{index:06d}.role_ids.npy"


def tokenize_unit(unit: Unit, info: TokenizerInfo, config: BuildConfig, work_dir: fs.Place) -> dict:
    """Tokenize one unit into its unit files (skipped if already complete); return its counters.

    A FileError fails the unit, or with on_file_error="skip" leaves it empty and named in
    its counters ("file_error"). Records (config.input_kind other than text; packer/encode/records.py)
    also write unit-XXXXXX.loss_mask.npy, and the counters say how many tokens are trained."""
    paths = unit_paths(work_dir, unit.index)
    if paths["json"].exists():
        counters = json.loads(paths["json"].read_text(encoding="utf-8"))
        # counters hold the path redacted (packer/io/fs.py): rotated credentials are the same unit
        if (counters.get("path"), counters.get("start"), counters.get("end")) != (fs.redact(unit.path), unit.start, unit.end):
            # e.g. a _work/ cut into units by another packer version: reusing it would lose documents
            raise ValueError(f"{fs.redact(paths['json'])} holds another unit ({fs.redact(str(counters.get('path')))} "
                             f"{counters.get('start')}-{counters.get('end')}, not {fs.redact(unit.path)} "
                             f"{unit.start}-{unit.end}): this _work/ was cut into units differently; "
                             "pass --overwrite to start over")
        return counters
    kind = unit_kind(unit, config)

    def open_files():
        mask = _NpyAppender(unit_mask_path(work_dir, unit.index), np.uint8) if kind != "text" else None
        roles = _NpyAppender(unit_roles_path(work_dir, unit.index), np.uint8) if config.store_roles else None
        return _NpyAppender(paths["tokens.npy"], info.dtype), _NpyAppender(paths["lengths.npy"], np.int64), mask, roles

    skips = SkipLog.empty(strict=config.strict)
    files = open_files()
    file_error = None
    # what was read, hashed (packer/preprocess/changed.py); records (readers' `records`) are not hashed yet
    sums = changed.InputSum() if changed.ENABLED and kind == "text" else None
    eos = InnerEos(info.eos_id) if info.eos_id is not None else None
    try:
        n_tokens, n_trained = _tokenize_into(unit, info, config, skips, *files, kind=kind, sums=sums, eos=eos)
    except FileError as e:
        for f in files:
            f is None or f.abort()
        if config.on_file_error != "skip":
            raise
        files = open_files()
        skips, n_tokens, n_trained, file_error, sums = SkipLog.empty(), 0, 0, e.cause, None
        eos = eos and InnerEos(info.eos_id)
    except BaseException:
        for f in files:
            f is None or f.abort()
        raise
    tokens, lengths, mask, _ = files
    for f in files:
        f is None or f.commit()
    counters = {
        "unit": unit.index,
        "path": unit.path,
        "start": unit.start,
        "end": unit.end,
        "bytes": unit.size,
        "docs_read": lengths.n + sum(skips.counts.values()),
        "docs_accepted": lengths.n,
        "skipped": dict(sorted(skips.counts.items())),
        "skip_examples": skips.examples,
        "tokens": n_tokens,
        **({"docs_inner_eos": eos.docs} if eos is not None else {}),
        "file_error": file_error,
        "input": sums and sums.record(),  # what was read, hashed: packer/preprocess/changed.py
    }
    if mask is not None:  # record kinds only: text units keep their counters' bytes
        counters["input_kind"] = kind
        counters["trained_tokens"] = n_trained
    atomic.write_json(paths["json"], counters)
    return counters


def unit_kind(unit: Unit, config: BuildConfig) -> str:
    """config.input_kind; under auto, the kind the unit's file shows by its fields (its reader's field_names)."""
    if config.input_kind != "auto":
        return config.input_kind
    from packer.encode.records import kind_of_fields  # records only: a text build does not import them (start-up)

    return kind_of_fields(field_names(unit, max_doc_bytes=config.max_doc_bytes), config)


def _tokenize_into(unit, info, config, skips, tokens: _NpyAppender, lengths: _NpyAppender,
                   mask: _NpyAppender | None = None, roles: _NpyAppender | None = None, *, kind: str = "text",
                   sums=None, eos: InnerEos | None = None) -> tuple[int, int]:
    """Encode the unit into the appenders: (tokens written, tokens trained: all of them for text).
    `sums` hashes what the reader reads (packer/preprocess/changed.py); `eos` counts the documents
    holding the EOS id inside them."""
    if kind != "text":
        return _records_into(unit, info, config, skips, tokens, lengths, mask, kind, roles, eos)
    tok = load_encoder(info.path, info.engine)  # the engine the driver chose (TokenizerInfo)
    texts = read_unit(unit, skips, text_field=config.text_field, text_split=config.text_split,
                      max_doc_bytes=config.max_doc_bytes, sums=sums)
    n_tokens = 0
    for flat, doc_lengths in encode_parts(tok, texts, dtype=info.dtype, eos_id=info.eos_id, bos_id=info.bos_id):
        tokens.append(flat)
        lengths.append(doc_lengths)
        n_tokens += len(flat)
        if eos is not None:
            eos.add(flat, doc_lengths)
    return n_tokens, n_tokens


def _records_into(unit, info, config, skips, tokens, lengths, mask, kind: str, roles=None, eos=None) -> tuple[int, int]:
    """Records of the unit -> ids, lengths and mask, in batches of RECORD_BATCH (packer/encode/records.py)."""
    from packer.encode.records import RECORD_BATCH, RecordEncoder

    encoder = RecordEncoder(kind, info, config, encode_texts)
    fields = encoder.fields()
    fix = {"chat": "choose the column with --messages-field", "prompt-completion": "choose it with --prompt-field",
           "tokens": "choose it with --ids-field"}[kind]
    records = read_records(unit, skips, fields, max_doc_bytes=config.max_doc_bytes, fix=fix)
    n_tokens = n_trained = 0
    for batch in iter(lambda: list(itertools.islice(records, RECORD_BATCH)), []):
        for encoded in encoder.encode_parts(batch, skips):  # a huge example in parts: its ids never gathered
            tokens.append(encoded.ids)
            lengths.append(encoded.lengths)
            mask.append(encoded.mask)
            if roles is not None:
                roles.append(encoded.roles)
            if eos is not None:
                eos.add(encoded.ids, encoded.lengths)
            n_tokens += len(encoded.ids)
            n_trained += int(np.count_nonzero(encoded.mask))
        batch = encoded = None  # a huge record's text is freed before the next batch is read
    return n_tokens, n_trained


def piece_trained(plan, work_dir, n_units: int) -> np.ndarray | None:
    """Trained tokens of every planned piece (int64, aligned with plan.piece_len), from the units'
    loss masks (a unit without one: all trained); None when no unit has a mask.

        unit 0 mask [0, 0, 1, 1, 1], pieces (unit 0, start 1, len 3), (0, 4, 1)  ->  [2, 1]
    """
    paths = [unit_mask_path(work_dir, u) for u in range(n_units)]
    if not any(p.exists() for p in paths):
        return None
    trained = plan.piece_len.astype(np.int64).copy()
    order = np.argsort(plan.piece_unit, kind="stable")
    bounds = np.searchsorted(plan.piece_unit[order], np.arange(n_units + 1))
    for u, path in enumerate(paths):
        at = order[bounds[u]:bounds[u + 1]]
        if len(at) and path.exists():
            starts = plan.piece_start[at].astype(np.int64)
            sums = prefix_sums(fs.load_npy(path), np.concatenate([starts, starts + plan.piece_len[at]]))
            trained[at] = sums[len(at):] - sums[:len(at)]
    return trained


SUM_CHUNK = 1 << 22  # prefix sums over this many mask values at a time (32 MiB of int64)


def prefix_sums(mask: np.ndarray, points: np.ndarray) -> np.ndarray:
    """int64 sums of mask[:p] for each p of `points` (any order, 0..len(mask)), without a full-length
    cumulative sum (a 200M-token unit's would be 1.6 GB): a chunk's cumsum at a time, read at the
    points inside it.

        mask [0, 1, 1, 0, 1], points [5, 0, 3]  ->  [3, 0, 2]"""
    points = np.asarray(points, np.int64)
    order = np.argsort(points, kind="stable")
    ordered = points[order]
    out = np.empty(len(points), np.int64)
    total, i = 0, 0
    for start in range(0, len(mask) + 1, SUM_CHUNK):
        chunk = mask[start:start + SUM_CHUNK]
        j = int(np.searchsorted(ordered, start + len(chunk), side="right")) if start + SUM_CHUNK <= len(mask) else len(ordered)
        if j > i:
            sums = np.concatenate([[0], np.cumsum(chunk, dtype=np.int64)])
            out[order[i:j]] = total + sums[ordered[i:j] - start]
            i = j
        total += int(chunk.sum(dtype=np.int64))
    return out


def trained_totals(unit_counters, plans, work) -> dict:
    """The manifest totals' trained_tokens (input: every accepted example; output: what the shards
    train) when some unit holds records; {} for text builds, which keep their bytes. `plans`: the
    shards' plans (an iterable: one shard's plan in memory at a time)."""
    if not any("trained_tokens" in c for c in unit_counters):
        return {}
    stored = 0
    for plan in plans:
        trained = piece_trained(plan, work / "units", len(unit_counters))
        stored += int(trained.sum()) if trained is not None else 0
    trained_in = sum(c.get("trained_tokens", c["tokens"]) for c in unit_counters)
    return {"trained_tokens_in": trained_in, "trained_tokens": stored}
