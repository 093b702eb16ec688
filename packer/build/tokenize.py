"""THE encode path (texts -> token ids, for build, `stats INPUT` and online packing) and the tokenize stage
for one work unit: texts in, unit files out.

    encode_texts(tok, ["hi there", "a"], dtype=np.uint16, eos_id=0)  ->  ids [530, 1146, 0, 65, 0], lengths [3, 2]

Unit files, in the work directory (all written atomically; the .json last, so its
presence means the unit is complete and is never redone):

    unit-000007.tokens.npy   all token ids of the unit's accepted documents, concatenated
    unit-000007.lengths.npy  int64 length of each document (eos/bos included)
    unit-000007.json         counters: docs read / accepted / skipped by reason, examples, and
                             `input`, the hash of what was read (packer/build/changed.py)

Both .npy files stream to disk while the unit is read, so a worker's memory does not grow
with the unit, nor with one huge document (encode_parts: a 200 MB document's ids are never
gathered; its text is a readers.common.Utf8Text, encoded a window at a time). Speed (benchmarks/bench_tokenize.py, 50 MB of JSONL, a busy 2-core machine,
2026-11-29): --workers 1 ran at 0.95 of Tokenizer.encode_batch_fast on the same texts in
memory (0.96 in CPU seconds), --workers 2 at 1.05 (0.98 in CPU seconds) in another run;
starting a 2-worker pool costs ~1.2 s once. Runs on that machine vary by +-20%.
"""

from __future__ import annotations

import itertools
import json
import re
import struct
from collections.abc import Iterable, Iterator

import numpy as np

from packer.build import changed
from packer.build.readers import FileError, SkipLog, Unit, read_unit
from packer.build.readers.common import Utf8Text
from packer.build.tokenizer import TokenizerInfo, load_tokenizer
from packer.config import BuildConfig
from packer.io import atomic, fs

ENCODE_BATCH_DOCS = 1024
ENCODE_BATCH_CHARS = 1 << 20  # tokenizers holds ~500 bytes per token while encoding: bound the batch
PIECE_CHARS = 1 << 20  # longer documents are encoded in pieces of about this size


def _pieces(text: str, piece_chars: int):
    """Cut a long text before a single space between two non-spaces, about every piece_chars.

    For byte-level BPE (GPT-2 style pre-tokenization) no pre-token spans such a point, so the
    pieces encode to exactly the tokens of the whole text (tests/build/test_tokenize.py checks it).
    A stretch with no such point within 64K characters is cut where it stands; a tail with none
    (the text ends within those 64K) stays whole."""
    start = 0
    while len(text) - start > piece_chars:
        match = _CUT.search(text, start + piece_chars, start + piece_chars + 65536)
        if match is None and start + piece_chars + 65536 >= len(text):
            break
        cut = match.start() if match else start + piece_chars
        yield text[start:cut]
        start = cut
    yield text[start:]


_CUT = re.compile(r"(?<=\S) (?=\S)")


def _utf8_pieces(text: Utf8Text, piece_chars: int):
    """_pieces of a text kept as UTF-8 bytes, decoding one window at a time: the same pieces as
    _pieces(str(text)) (each cut is searched in a window holding the next piece_chars + 64K
    characters, or the rest of the text), never the whole text as a str."""
    start, reach = 0, piece_chars + 65536  # byte offset of the next piece; characters a cut may need
    while start < text.n_bytes:
        n_bytes = reach + 4
        window, taken = text.window(start, n_bytes)
        while len(window) < reach and start + taken < text.n_bytes:  # multi-byte characters: widen it
            n_bytes *= 2
            window, taken = text.window(start, n_bytes)
        at_end = start + taken == text.n_bytes
        if at_end and len(window) <= piece_chars:
            yield window
            return
        match = _CUT.search(window, piece_chars, reach)
        if match is None and at_end and len(window) <= reach:  # no cut point before the end: the rest whole
            yield window
            return
        piece = window[: match.start() if match else piece_chars]
        yield piece
        start += len(piece.encode("utf-8"))


def encode_texts(tok, texts: list[str], *, dtype, eos_id: int | None = None, bos_id: int | None = None,
                 piece_chars: int = PIECE_CHARS) -> tuple[np.ndarray, np.ndarray]:
    """A batch of documents -> (flat ids of all of them in order, `dtype`; int64 length of each).

        texts ["hi there", "a <|endoftext|>"], eos_id 0, sample_data/tokenizer.json:
        ids      [530, 1146,  0,   65, 612, 92, 1100, 1297, 423,  92, 30,  0]    lengths [3, 9]
        tokens    hi   there  eos  a   " <" |   end   of    text  |   >   eos

    `tok` comes configured from load_tokenizer or configured_copy (packer/build/tokenizer.py):
    "<|endoftext|>" in a text is text, nothing is truncated or padded. The tokenizer's own
    template is never applied (add_special_tokens=False): bos/eos are added here, one each per
    document. A text longer than `piece_chars` is encoded piece by piece (_pieces: the same
    tokens for byte-level BPE, bounded tokenizer memory)."""
    if any(isinstance(text, Utf8Text) or len(text) > piece_chars for text in texts):
        parts = list(encode_parts(tok, texts, dtype=dtype, eos_id=eos_id, bos_id=bos_id, piece_chars=piece_chars))
        return np.concatenate([ids for ids, _ in parts]), np.concatenate([n for _, n in parts])
    return _add_specials(*_encode_batch(tok, texts, dtype), eos_id, bos_id)


def encode_stream(tok, texts: Iterable[str], *, dtype, eos_id: int | None = None, bos_id: int | None = None,
                  piece_chars: int = PIECE_CHARS) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """encode_texts over a stream of documents, in batches of at most ENCODE_BATCH_DOCS documents
    or about ENCODE_BATCH_CHARS characters (bounded memory): yields (ids, lengths) per batch, each
    batch whole documents (a long one is a batch of its own, its pieces' ids joined)."""
    held = []  # the parts of a long document so far
    for ids, lengths in encode_parts(tok, texts, dtype=dtype, eos_id=eos_id, bos_id=bos_id, piece_chars=piece_chars):
        if not len(lengths):
            held.append(ids)
            continue
        if held:
            ids, held = np.concatenate([*held, ids]), []
        yield ids, lengths


def encode_parts(tok, texts: Iterable[str], *, dtype, eos_id: int | None = None, bos_id: int | None = None,
                 piece_chars: int = PIECE_CHARS) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """encode_stream for writers that append what they get (the unit files): the same ids in
    parts of bounded size, so a huge document's ids are never gathered in memory. Short documents
    come in batches (ids and lengths aligned); a document longer than piece_chars comes as one part
    per piece with no length, its length on its last part:

        texts ["a b", <a 3 MiB text>, "c"], bos none, eos 0, piece_chars 1 MiB
            -> ([ids of "a b", 0], [3]), (ids of piece 0, []), (ids of piece 1, []), (ids of piece 2, []),
               ([0], [n]), ([ids of "c", 0], [2])

    Concatenated, the parts' ids and lengths are encode_texts' (flat, lengths)."""
    batch, batch_chars = [], 0
    for text in texts:
        if isinstance(text, Utf8Text) or len(text) > piece_chars:  # a Utf8Text is never made a str whole
            if batch:  # the documents before it first: order kept
                yield encode_texts(tok, batch, dtype=dtype, eos_id=eos_id, bos_id=bos_id, piece_chars=piece_chars)
                batch, batch_chars = [], 0
            yield from _long_parts(tok, text, dtype, eos_id, bos_id, piece_chars)
            continue
        batch.append(text)
        batch_chars += len(text)
        if len(batch) >= ENCODE_BATCH_DOCS or batch_chars >= ENCODE_BATCH_CHARS:
            yield encode_texts(tok, batch, dtype=dtype, eos_id=eos_id, bos_id=bos_id, piece_chars=piece_chars)
            batch, batch_chars = [], 0
    if batch:
        yield encode_texts(tok, batch, dtype=dtype, eos_id=eos_id, bos_id=bos_id, piece_chars=piece_chars)


_NO_LENGTHS = np.zeros(0, dtype=np.int64)


def _long_parts(tok, text: str | Utf8Text, dtype, eos_id: int | None, bos_id: int | None, piece_chars: int):
    """One long document's parts: [bos], the ids of each piece, then [eos] with the document's length."""
    n = 0
    if bos_id is not None:
        yield np.array([bos_id], dtype=dtype), _NO_LENGTHS
        n += 1
    for piece in _utf8_pieces(text, piece_chars) if isinstance(text, Utf8Text) else _pieces(text, piece_chars):
        ids = _encode_batch(tok, [piece], dtype)[0]
        n += len(ids)
        yield ids, _NO_LENGTHS
    tail = np.array([] if eos_id is None else [eos_id], dtype=dtype)
    yield tail, np.array([n + len(tail)], dtype=np.int64)


def _encode_batch(tok, texts: list[str], dtype) -> tuple[np.ndarray, np.ndarray]:
    encodings = tok.encode_batch_fast(texts, add_special_tokens=False)
    lengths = np.fromiter(map(len, encodings), dtype=np.int64, count=len(encodings))
    # One pass over every document's ids, no list per document kept: 19 ms of CPU per 1 MiB batch
    # that took 755 ms to encode (2.5%); building the lists first cost 32 ms (2026-11-29).
    ids = itertools.chain.from_iterable(e.ids for e in encodings)
    return np.fromiter(ids, dtype=dtype, count=int(lengths.sum())), lengths


def _add_specials(flat, lengths, eos_id: int | None, bos_id: int | None):
    """Insert bos/eos around every document in one numpy pass (no per-document Python lists)."""
    if bos_id is None and eos_id is None:
        return flat, lengths
    extra = (bos_id is not None) + (eos_id is not None)
    out = np.empty(len(flat) + extra * len(lengths), dtype=flat.dtype)
    new_lengths = lengths + extra
    ends = np.cumsum(new_lengths)
    starts = ends - new_lengths
    body = np.ones(len(out), dtype=bool)
    if bos_id is not None:
        out[starts] = bos_id
        body[starts] = False
    if eos_id is not None:
        out[ends - 1] = eos_id
        body[ends - 1] = False
    out[body] = flat
    return out, new_lengths


def unit_paths(work_dir, index: int) -> dict:
    """The unit's three files in `work_dir` (a local path, or a URI: see packer/io/fs.py)."""
    work_dir = fs.location(work_dir)
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


def unit_mask_path(work_dir, index: int):
    """The unit's loss mask (uint8, one per token of its tokens.npy), written only for record kinds."""
    return fs.location(work_dir) / f"unit-{index:06d}.loss_mask.npy"


def tokenize_unit(unit: Unit, info: TokenizerInfo, config: BuildConfig, work_dir: str) -> dict:
    """Tokenize one unit into its unit files (skipped if already complete); return its counters.

    A FileError fails the unit, or with on_file_error="skip" leaves it empty and named in
    its counters ("file_error"). Records (config.input_kind other than text; packer/build/records.py)
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
    kind = _unit_kind(unit, config)

    def open_files():
        mask = _NpyAppender(unit_mask_path(work_dir, unit.index), np.uint8) if kind != "text" else None
        return _NpyAppender(paths["tokens.npy"], info.dtype), _NpyAppender(paths["lengths.npy"], np.int64), mask

    skips = SkipLog.empty(strict=config.strict)
    files = open_files()
    file_error = None
    # what was read, hashed (packer/build/changed.py); record kinds' reader (record_reader) does not hash yet
    sums = changed.InputSum() if changed.ENABLED and kind == "text" else None
    try:
        n_tokens, n_trained = _tokenize_into(unit, info, config, skips, *files, kind=kind, sums=sums)
    except FileError as e:
        for f in files:
            f is None or f.abort()
        if config.on_file_error != "skip":
            raise
        files = open_files()
        skips, n_tokens, n_trained, file_error, sums = SkipLog.empty(), 0, 0, e.cause, None
    except BaseException:
        for f in files:
            f is None or f.abort()
        raise
    tokens, lengths, mask = files
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
        "file_error": file_error,
        "input": sums and sums.record(),  # what was read, hashed: packer/build/changed.py
    }
    if mask is not None:  # record kinds only: text units keep their counters' bytes
        counters["input_kind"] = kind
        counters["trained_tokens"] = n_trained
    atomic.write_json(paths["json"], counters)
    return counters


def _unit_kind(unit: Unit, config: BuildConfig) -> str:
    if config.input_kind != "auto":
        return config.input_kind
    from packer.build.record_reader import detect_kind

    return detect_kind(unit, config)


def _tokenize_into(unit, info, config, skips, tokens: _NpyAppender, lengths: _NpyAppender,
                   mask: _NpyAppender | None = None, *, kind: str = "text", sums=None) -> tuple[int, int]:
    """Encode the unit into the appenders: (tokens written, tokens trained: all of them for text).
    `sums` hashes what the reader reads (packer/build/changed.py)."""
    if kind != "text":
        return _records_into(unit, info, config, skips, tokens, lengths, mask, kind)
    tok = load_tokenizer(info.path)
    texts = read_unit(unit, skips, text_field=config.text_field, text_split=config.text_split,
                      max_doc_bytes=config.max_doc_bytes, sums=sums)
    n_tokens = 0
    for flat, doc_lengths in encode_parts(tok, texts, dtype=info.dtype, eos_id=info.eos_id, bos_id=info.bos_id):
        tokens.append(flat)
        lengths.append(doc_lengths)
        n_tokens += len(flat)
    return n_tokens, n_tokens


RECORD_BATCH = 256  # records encoded together (one encode_batch call; rendering is per record)


def _records_into(unit, info, config, skips, tokens, lengths, mask, kind: str) -> tuple[int, int]:
    """Records of the unit -> ids, lengths and mask, in batches of RECORD_BATCH (packer/build/records.py)."""
    from packer.build.record_reader import read_records
    from packer.build.records import RecordEncoder

    encoder = RecordEncoder(kind, info, config, encode_texts)
    fields = encoder.fields()
    fix = {"chat": "choose the column with --messages-field", "prompt-completion": "choose it with --prompt-field",
           "tokens": "choose it with --ids-field"}[kind]
    records = read_records(unit, skips, fields, max_doc_bytes=config.max_doc_bytes, fix=fix)
    n_tokens = n_trained = 0
    for batch in iter(lambda: list(itertools.islice(records, RECORD_BATCH)), []):
        encoded = encoder.encode(batch, skips)
        tokens.append(encoded.ids)
        lengths.append(encoded.lengths)
        mask.append(encoded.mask)
        n_tokens += len(encoded.ids)
        n_trained += int(np.count_nonzero(encoded.mask))
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
            mask = np.load(fs.for_numpy(path), mmap_mode=None if fs.is_remote(path) else "r")
            sums = np.concatenate([[0], np.cumsum(mask, dtype=np.int64)])
            trained[at] = sums[plan.piece_start[at] + plan.piece_len[at]] - sums[plan.piece_start[at]]
    return trained


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
