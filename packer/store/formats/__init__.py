"""Shard formats: the name -> format table, and the interface each format module fills.

A format is a module with these top-level names (the `ShardFormat` protocol):

    FILES    ((name key, sha256 key, suffix), ...): the files of one shard in the order the
             format fills them, and the manifest entry keys that name them and their sha256
             arrow     ("file", "sha256", ".arrow")
             memmap    ("file", "sha256", ".bin"), ("index_file", "index_sha256", ".idx")
             megatron  the memmap two, then ("doc_ids_file", "doc_ids_sha256", ".docids.npy")
             nemo      ("file", "sha256", ".idx.parquet")
    EXTRA_FILES  {extra: (name key, sha256 key, suffix)}: files of the optional fields
             (packer/store/rows.py EXTRAS: loss_mask, source_ids) a shard has only when its
             build does, after FILES in EXTRAS order; arrow and nemo have none (they are columns)
    write(layout, tokens_of, sinks, extras) -> row bounds of its blocks
             stream one shard into sinks (FILES, then the EXTRA_FILES of `extras`): `layout` is
             the shard's rows without their tokens (packer/store/rows.py), `tokens_of(r0, r1)`
             the tokens of rows r0..r1 (with "loss_mask" in extras: (tokens, mask)), asked for in
             chunks of ROWS_PER_BATCH rows in order. Each sink is a checksums.BlockSink: the
             format cuts the files that hold rows at its read blocks (sink.cut_at, sink.first)
             and returns the blocks' row bounds; the writer stores the checksums file
    blocks(paths, extras, sums=None) -> iterator of (Rows, doc_ids)
             read one shard (paths as write's sinks): zero-copy views of memory maps locally,
             bytes read into memory for a remote path; checks what the format itself can
             (headers, sizes, counts between its files) and raises ValueError naming the file,
             so open_dataset and verify share the format's own verification. With the shard's
             checksums (`sums`), its blocks are the checksummed byte ranges (the caller checks them)
    stream_index(read, size, paths, block_bytes, extras, sums=None) -> (bounds, ranges, state, counts, extras)
    stream_block(state, bounds, k, buffers) -> (Rows, doc_ids)
             the same rows read by byte ranges, for a dataset streamed from a remote store
             (packer/store/stream.py): what a shard's blocks are and which bytes each reads, then
             block k from those bytes
    build_notes(manifest) -> [line, ...]   (optional)
             what a build should say about how the format's trainer reads this manifest's data
             (nemo: documents holding EOS inside them); the build warns each line
    DERIVED_FILES  the names of the files the format keeps beside its shards (reserved: never a shard's)
    derived_files(shards) -> {file name: bytes}
             those files for a manifest's shard entries, a function of the entries alone: the
             build's finalize writes them, verify checks them, packer's record of its own files
             (packer/preprocess/owned.py) adopts them; arrow: HF datasets' state.json and
             dataset_info.json; memmap and megatron: none

Why a protocol that modules satisfy rather than a base class: a format has no state and shares
no code with the others. What every format does alike (temporary names, sha256 while writing,
renames, the manifest entry) is the writer's (packer/preprocess/writer.py), and the row checks are
verify's (packer/store/verify.py); a format only says which bytes go in which file and how to
read them back. Adding one is a module here and a line in FORMATS: nothing outside this folder
names a format.
"""

from __future__ import annotations

from typing import BinaryIO, Callable, Iterator, Protocol, Sequence

import numpy as np

from packer.store import checksums
from packer.store.formats import arrow, megatron, memmap, nemo
from packer.store.rows import EXTRAS, Layout, Rows


class ShardFormat(Protocol):
    FILES: tuple[tuple[str, str, str], ...]
    EXTRA_FILES: dict[str, tuple[str, str, str]]

    def write(self, layout: Layout, tokens_of: Callable[[int, int], np.ndarray], sinks: Sequence[BinaryIO],
              extras: Sequence[str] = ()) -> np.ndarray: ...

    def blocks(self, paths: Sequence, extras: Sequence[str] = (), sums=None) -> Iterator[tuple[Rows, np.ndarray]]: ...

    def stream_index(self, read: Callable, size: Callable, paths: Sequence, block_bytes: int,
                     extras: Sequence[str] = (), sums=None) -> tuple: ...

    def stream_block(self, state, bounds, k: int, buffers: Sequence) -> tuple[Rows, np.ndarray]: ...

    DERIVED_FILES: tuple[str, ...]

    def derived_files(self, shards: list[dict]) -> dict[str, bytes]: ...


FORMATS: dict[str, ShardFormat] = {"arrow": arrow, "memmap": memmap, "megatron": megatron, "nemo": nemo}
# files every dataset has beside its shards (packer/store/manifest.py, packer/preprocess/pipeline.py)
DATASET_FILES = frozenset({"manifest.json", "tokenizer.json", "stats.json", "report.html"})
DEFAULT = "arrow"  # BuildConfig's default: what a manifest (or a write_shard call) that names no format means


def get(fmt: str) -> ShardFormat:
    if fmt not in FORMATS:
        raise ValueError(f"unknown shard format {fmt!r}; this packer reads and writes {', '.join(FORMATS)}")
    return FORMATS[fmt]


def manifest_format(config: dict) -> str:
    """The shard format of a manifest's (or a work fingerprint's) config."""
    return config.get("format", DEFAULT)


def derived_files(fmt: str, shards: list[dict]) -> dict[str, bytes]:
    """{file name: bytes} of what format `fmt` keeps beside the shards of these manifest entries."""
    return get(fmt).derived_files(shards)


def build_notes(fmt: str, manifest: dict) -> list[str]:
    """The lines format `fmt` says at the end of a build of `manifest` (its optional `build_notes`)."""
    notes = getattr(get(fmt), "build_notes", None)
    return list(notes(manifest)) if notes is not None else []


def reserved() -> frozenset[str]:
    """The names no shard may have: packer's own files and every format's derived files."""
    return DATASET_FILES.union(*(f.DERIVED_FILES for f in FORMATS.values()))


def shard_stem(index: int) -> str:
    return f"shard-{index:05d}"


def _files(fmt: str, extras) -> list[tuple[str, str, str]]:
    module = get(fmt)
    return list(module.FILES) + [module.EXTRA_FILES[e] for e in EXTRAS if e in extras and e in module.EXTRA_FILES]


CHECKSUMS = (checksums.NAME_KEY, checksums.SHA_KEY, checksums.SUFFIX)  # every format's, since format version 2


def file_names(fmt: str, index: int, extras=()) -> list[tuple[str, str, str]]:
    """(name key, sha256 key, file name) of each data file of shard `index` storing `extras`, in
    writing order (the checksums file, CHECKSUMS, comes after them)."""
    return [(name_key, sha_key, shard_stem(index) + suffix) for name_key, sha_key, suffix in _files(fmt, extras)]


def entry_extras(fmt: str, entry: dict) -> tuple[str, ...]:
    """The optional fields whose files a manifest shard entry names (none for arrow: they are columns)."""
    return tuple(e for e, (name_key, _, _) in get(fmt).EXTRA_FILES.items() if name_key in entry)


def _name_error(name) -> str | None:
    """Why `name` cannot be a file of this dataset, or None: a manifest names plain files inside
    its own directory, never a path (absolute, `..`, a separator, a drive) nor packer's other files."""
    if not isinstance(name, str) or not name:
        return "not a file name"
    if "/" in name or "\\" in name or ":" in name or "\x00" in name or name in (".", ".."):
        return "a path, not a plain file name"
    if name in reserved():
        return "one of packer's own files, not a shard"
    return None


def entry_files(fmt: str, entry: dict) -> list[tuple[str, str]]:
    """(file name, sha256) of each file a manifest shard entry names, its checksums file last
    (when it has one). A name must be a plain file name: a manifest never points outside its own
    directory (nor at its manifest or tokenizer)."""
    if not isinstance(entry, dict):
        raise ValueError(f"shard entry {str(entry)[:80]!r}: expected an object (the manifest is damaged or not packer's)")
    keys = _files(fmt, entry_extras(fmt, entry)) + ([CHECKSUMS] if CHECKSUMS[0] in entry else [])
    files = []
    for name_key, sha_key, _ in keys:
        name = entry.get(name_key)
        if why := _name_error(name):
            shown = repr(name)[:120]  # the manifest's text, never a file's bytes; cut to one line
            raise ValueError(f"shard entry {name_key}={shown}: {why}; expected a file name inside the dataset "
                             f"directory (the manifest is damaged or not packer's)")
        files.append((name, entry.get(sha_key)))
    return files


def data_files(fmt: str, entry: dict) -> tuple[list[tuple[str, str]], tuple[str, str] | None]:
    """(entry_files less the checksums file, the checksums file or None: a shard of format version 1)."""
    files = entry_files(fmt, entry)
    return (files[:-1], files[-1]) if CHECKSUMS[0] in entry else (files, None)


def manifest_files(fmt: str, shards) -> list[list[tuple[str, str]]]:
    """entry_files of every shard entry, in order; a file named twice (by two entries, or twice
    by one) is refused: rows would be read twice and the totals could be edited to match."""
    if not isinstance(shards, list):
        raise ValueError(f"manifest shards: expected a list, got {type(shards).__name__} (the manifest is damaged)")
    seen: dict[str, int] = {}
    out = []
    for i, entry in enumerate(shards):
        files = entry_files(fmt, entry)
        for name, _ in files:
            if name in seen:
                raise ValueError(f"manifest shard entries {seen[name]} and {i} both name {name!r}: a shard listed twice "
                                 "(the manifest is damaged; rebuild the dataset)")
            seen[name] = i
        out.append(files)
    return out


def suffixes() -> set[str]:
    """Every suffix a shard file of any format ends with (after `shard-00000`)."""
    return {suffix for f in FORMATS.values() for _, _, suffix in [*f.FILES, *f.EXTRA_FILES.values()]} | {CHECKSUMS[2]}


def shard_blocks(directory, entry: dict, fmt: str, sums=None) -> Iterator[tuple[Rows, np.ndarray]]:
    """(Rows, doc_ids) blocks of one manifest shard entry of a dataset in `directory` (by its
    checksummed blocks, given `sums`: its checksums file, read)."""
    paths = [directory / name for name, _ in data_files(fmt, entry)[0]]
    return get(fmt).blocks(paths, entry_extras(fmt, entry), sums)
