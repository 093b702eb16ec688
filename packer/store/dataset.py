"""The reader for built datasets: random access to the rows of every shard, whatever its format.

A dataset's shards, in manifest order, are read as blocks of rows in CSR form (`Rows`,
packer/store/rows.py) by their format (packer/store/formats/: Arrow IPC, memmap, Megatron);
`ds[i]` finds row i's block and slices it. Locally every block is a view of a memory map, so
opening reads only indexes and footers; `open_dataset` of a remote URI (packer/io/fs.py) streams
it instead (packer/store/stream.py: indexes at open, blocks of rows by ranged reads, read ahead,
bounded memory, an optional cache directory). Writing is packer/preprocess/writer.py; checking,
packer/store/verify.py.

Nothing in the manifest is taken on trust (packer/store/checks.py). Opening refuses, in one line:
a shard name that is not a plain file name in the directory, a file named twice, per-shard or
total counts that are not what the shard files hold, a row outside its arrays, empty or longer
than the context. Every byte a row comes from is attested by the manifest: each shard's checksums
file (its sha256 the manifest's) holds an xxh3_64 per read block of each of its files
(packer/store/checksums.py); the files read whole (indexes) are checked at open, and a block's
first read (ds[i], views, get_many, iteration) checks its bytes, then its offsets, doc_ids and
token ids (< the vocabulary): one vectorized pass over the block, once per process. So a changed
byte raises ValueError naming the shard and its byte range instead of yielding a row, even one
whose ids stay inside the vocabulary. (Lazy, not at open: a pass over every block would read the
whole dataset before step one.) A dataset of a packer before block checksums (format version 1)
is checked whole at open instead: every shard file's sha256.

A reader pins the dataset's generation (the sha256 of its manifest.json: packer/store/manifest.py)
when it opens, checks it again once its files are mapped, and pickles with it: a DataLoader worker
that reopens it after another build replaced the dataset raises instead of mixing the two.
"""

from __future__ import annotations

import bisect

import numpy as np
import pyarrow as pa

from packer.io import fs
from packer.store import checks, checksums, formats
from packer.store.formats import shard_blocks
from packer.store.manifest import (
    MANIFEST,
    DatasetReplaced,
    check_generation,
    generation_of,
    load_manifest,
    require_regular,
    sha256_file,
)
from packer.store.rows import ROWS_PER_BATCH, Rows

__all__ = ["ROWS_PER_BATCH", "Rows", "ShardDataset", "open_dataset", "read_rows", "shard_blocks"]


class ShardDataset:
    """Random access to the sequences of a built dataset (any format).

    ds[i] -> (tokens, offsets): read-only numpy views into memory-mapped files; O(1) and
    touching only that row's pages. ds.get_many(indices) -> Rows: many rows at once,
    copied into one CSR batch. Iteration yields ds[0], ds[1], ... in stored order."""

    def __init__(self, path, generation: str | None = None):
        self.path = fs.location(path)  # a Path, or a RemotePath for a URI
        self.manifest, self.generation = load_manifest(self.path)
        check_generation(self.path, generation, now=self.generation)  # pinned by whoever opened it first
        self._root = files_root(self.path, self.generation)  # where this generation's files are (a publish)
        config = self.manifest["config"]
        self.format = formats.manifest_format(config)
        self.context_length = int(config["context_length"])
        self.vocab_size = int(self.manifest["tokenizer"]["vocab_size"])
        self.source_names = [s.get("name") for s in self.manifest.get("sources") or []]
        self.roles = self.manifest.get("roles")  # role name -> id of a build with --store-roles, else None
        self._n_roles = checks.role_count(self.manifest, fs.redact(self.path))
        self._n_docs = self.manifest["totals"].get("docs_accepted")  # doc_ids lie below it
        dtype = np.dtype(config["token_dtype"])
        self._blocks: list[Rows] = []
        self._doc_ids: list[np.ndarray] = []
        self._where: list[tuple[str, int]] = []  # (shard, its first row) of each block, for messages
        self._ranges: list[list] = []  # per block: (bytes, FileSums, start, stop, file) its first read checks
        starts, n_tokens = [0], 0
        shards = self.manifest["shards"]
        for files in formats.manifest_files(self.format, shards):  # every name inside the directory, none twice
            for name, _ in files:
                require_regular(self._root / name)  # never a link out of the directory, never a FIFO to block on
        for entry in shards:
            where = fs.redact(self._root / entry["file"])
            counts = {"sequences": 0, "tokens": 0, "documents": 0}
            try:
                sums, mapped = self._open_checksums(entry)
                first_block = len(self._blocks)
                for rows, doc_ids in shard_blocks(self._root, entry, self.format, sums):
                    checks.check_bounds(rows, where, counts["sequences"], self.context_length)
                    checks.check_dtype(rows, where, dtype)
                    checks.check_extras(rows, len(doc_ids), where, len(self.source_names), values=False,
                                        n_roles=self._n_roles)
                    self._blocks.append(rows)
                    self._doc_ids.append(doc_ids)
                    self._where.append((where, counts["sequences"]))
                    counts["sequences"] += len(rows)
                    counts["tokens"] += int(rows.token_starts[-1] - rows.token_starts[0])
                    counts["documents"] += len(doc_ids)
                    starts.append(starts[-1] + len(rows))
                checks.check_sums_rows(sums, counts["sequences"], where)  # as verify does
                for rows, (_, first_row) in zip(self._blocks[first_block:], self._where[first_block:]):
                    self._ranges.append(_block_ranges(sums, mapped, first_row, len(rows), where))
            except FileNotFoundError as e:
                raise ValueError(f"shard missing: {fs.redact(e.filename or where)} (listed in the manifest); restore it or "
                                 "rebuild the dataset") from None
            except checksums.ChecksumError:
                check_generation(self._root, self.generation)  # replaced while opening: say so
                raise
            except (pa.ArrowException, KeyError, OSError) as e:  # a damaged Arrow stream (pyarrow's IOError too), a column missing
                raise ValueError(f"{where}: unreadable shard ({type(e).__name__}: {str(e)[:200]}); run `packer verify`, "
                                 "or rebuild") from None
            checks.check_counts(counts, entry, where)
            n_tokens += counts["tokens"]
        checks.check_totals({"sequences": starts[-1], "tokens": n_tokens}, self.manifest["totals"])
        # Every file is mapped now (a mapping keeps the bytes it opened): if the manifest is still the
        # one read first, no other build moved in meanwhile, so they are all of this generation.
        check_generation(self._root, self.generation)
        self.has_loss_mask = self._has("loss_mask")
        self.has_source_ids = self._has("source_ids")
        self.has_role_ids = self._has("role_ids")
        self._block_starts = np.asarray(starts, dtype=np.int64)
        self._starts_list = starts  # bisect on a list beats np.searchsorted for one scalar
        self._n = starts[-1]
        self._unread = np.ones(len(self._blocks), bool)  # blocks whose bytes, offsets and ids are not checked yet
        self._n_unread = len(self._blocks)

    def _open_checksums(self, entry: dict):
        """(the shard's checksums, (bytes, name) of each of its files), its whole files and head ranges
        checked now; (None, None) for a shard of format version 1, each of whose files' sha256 is
        checked instead (a full read: rebuild the dataset to get block checksums)."""
        files, sums_file = formats.data_files(self.format, entry)
        paths = [self._root / name for name, _ in files]
        if sums_file is None:
            for path, (_, sha) in zip(paths, files):
                if sha256_file(path) != sha:
                    raise ValueError(f"{fs.redact(path)}: sha256 does not match the manifest (the file changed or is "
                                     "corrupt); run `packer verify`, or rebuild the dataset")
            return None, None
        sums = checksums.read_sums(self._root / sums_file[0], sums_file[1], len(files))
        mapped = []
        for path, file_sums in zip(paths, sums.files):
            raw = fs.map_bytes(path)
            if len(raw) != file_sums.cuts[-1]:
                raise checksums.ChecksumError(f"{fs.redact(path)}: {len(raw)} bytes, its checksums file says "
                                              f"{int(file_sums.cuts[-1])} ({checksums.CAUSES}); rebuild the dataset")
            mapped.append(raw)
        for f, a, b in checksums.head_ranges(sums):  # indexes, Arrow's schema and end marker
            checksums.check_range(sums.files[f], a, b, mapped[f][a:b], fs.redact(paths[f]))
        return sums, [(raw, fs.redact(path)) for raw, path in zip(mapped, paths)]  # held while the format maps them too

    def _has(self, field: str) -> bool:
        """Whether the blocks hold `field` (loss_mask, source_ids, role_ids): all of them, or none."""
        have = [getattr(rows, field) is not None for rows in self._blocks]
        if any(have) and not all(have):
            where = self._where[have.index(not have[0])][0]
            raise ValueError(f"{where}: {'has' if have[0] is False else 'lacks'} {field}, unlike the dataset's first "
                             "shard (shards of different builds mixed; rebuild the dataset)")
        return bool(have) and have[0]

    def _first_read(self, b: int):
        """A block's first read: its bytes against their checksums, then its offsets, doc_ids, token
        ids, mask and source ids checked (O(its tokens), once)."""
        rows, (where, first_row) = self._blocks[b], self._where[b]
        try:
            for raw, file_sums, start, stop, file in self._ranges[b]:
                checksums.check_range(file_sums, start, stop, raw[start:stop], file)
        except checksums.ChecksumError:
            check_generation(self._root, self.generation)  # the likelier cause, when it is the one
            raise
        checks.check_rows(rows, len(self._doc_ids[b]), where, first_row, self.context_length)
        checks.check_token_ids(rows, where, self.vocab_size)
        checks.check_doc_ids(self._doc_ids[b], where, self._n_docs)
        checks.check_extras(rows, len(self._doc_ids[b]), where, len(self.source_names), n_roles=self._n_roles)
        self._unread[b] = False
        self._n_unread -= 1

    def __len__(self) -> int:
        return self._n

    def __reduce__(self):
        return type(self), (self.path, self.generation)  # pickles as its path: reopened (the same dataset), never copied

    def __getitem__(self, i):
        n = self._n
        if not -n <= i < n:
            raise IndexError(f"sequence {i} out of range for a dataset of {n}")
        i = int(i) % n
        b = bisect.bisect_right(self._starts_list, i) - 1
        if self._n_unread and self._unread[b]:
            self._first_read(b)
        rows = self._blocks[b]
        r = i - self._starts_list[b]
        t0, t1 = rows.token_starts[r], rows.token_starts[r + 1]
        return rows.tokens[t0:t1], rows.offsets[rows.offset_starts[r] : rows.offset_starts[r + 1]]

    def _checked(self, indices) -> np.ndarray:
        """`indices` as int64 row numbers in [0, n) (negatives from the end); IndexError outside."""
        idx = np.asarray(indices, dtype=np.int64).reshape(-1)
        n = self._n
        if idx.size and (idx.min() < -n or idx.max() >= n):
            raise IndexError(f"indices must be in [-{n}, {n}) for a dataset of {n} sequences")
        return idx % n if n else idx

    def _locate(self, idx: np.ndarray) -> tuple[list, list]:
        """(block, row within it) of each row number, as plain ints; every block touched gets its first read."""
        block = self._block_starts.searchsorted(idx, side="right") - 1
        if self._n_unread:
            for b in np.flatnonzero(self._unread & (np.bincount(block, minlength=len(self._blocks)) > 0)).tolist():
                self._first_read(b)
        return block.tolist(), (idx - self._block_starts[block]).tolist()

    def views(self, indices) -> tuple[list, list]:
        """Rows `indices` (any order, repeats allowed) as two lists of read-only views,
        (tokens of each row, offsets of each row): what `ds[i]` gives, for many rows in one
        vectorized lookup. Nothing is copied."""
        idx = self._checked(indices)
        if len(self._blocks) == 1:  # one memmap or Megatron shard, or one record batch: no block lookup
            if self._n_unread and idx.size:
                self._first_read(0)
            rows = self._blocks[0]
            t, o, ts, ost = rows.tokens, rows.offsets, rows.token_starts, rows.offset_starts
            t0, t1, o0, o1 = ts[idx].tolist(), ts[idx + 1].tolist(), ost[idx].tolist(), ost[idx + 1].tolist()
            return [t[a:b] for a, b in zip(t0, t1)], [o[a:b] for a, b in zip(o0, o1)]
        block, local = self._locate(idx)
        blocks = self._blocks
        tokens, offsets = [], []
        for b, r in zip(block, local):  # plain ints: numpy scalars per row cost more
            rows = blocks[b]
            tokens.append(rows.tokens[rows.token_starts[r] : rows.token_starts[r + 1]])
            offsets.append(rows.offsets[rows.offset_starts[r] : rows.offset_starts[r + 1]])
        return tokens, offsets

    def _extra_views(self, indices, field: str) -> list:
        """Per row of `indices`, a view of its `field`: loss_mask or role_ids (per token), source_ids (per segment)."""
        out = []
        for b, r in zip(*self._locate(self._checked(indices))):
            rows = self._blocks[b]
            if field in ("loss_mask", "role_ids"):
                out.append(getattr(rows, field)[rows.token_starts[r] : rows.token_starts[r + 1]])
            else:  # a row's segments: its offsets less one, counted from the block's first row
                a = rows.offset_starts[r] - r - (rows.offset_starts[0])
                out.append(rows.source_ids[a : a + rows.offset_starts[r + 1] - rows.offset_starts[r] - 1])
        return out

    def mask_views(self, indices) -> list | None:
        """Rows `indices`' loss masks (uint8 views, 1 = trained, one per token), or None when the
        dataset has none (every token trained)."""
        return self._extra_views(indices, "loss_mask") if self.has_loss_mask else None

    def source_views(self, indices) -> list | None:
        """Rows `indices`' source ids (uint16 views, one per segment: index into `source_names`),
        or None when the build named no sources."""
        return self._extra_views(indices, "source_ids") if self.has_source_ids else None

    def role_views(self, indices) -> list | None:
        """Rows `indices`' role ids (uint8 views, one per token: ids of the manifest's "roles"), or None
        when the build stored none (docs/role_masks.md)."""
        return self._extra_views(indices, "role_ids") if self.has_role_ids else None

    def get_many(self, indices) -> Rows:
        """Rows `indices` (any order, repeats allowed) as one CSR batch: `Rows.row(k)` equals
        `ds[indices[k]]`. Tokens keep the stored dtype, offsets are int32; loss_mask,
        source_ids and role_ids are filled where the dataset has them."""
        tokens, offsets = self.views(indices)
        token_starts = np.zeros(len(tokens) + 1, np.int64)
        offset_starts = np.zeros(len(offsets) + 1, np.int64)
        np.cumsum([len(t) for t in tokens], out=token_starts[1:])
        np.cumsum([len(o) for o in offsets], out=offset_starts[1:])
        dtype = self._blocks[0].tokens.dtype if self._blocks else np.uint16
        joined = np.concatenate(tokens).astype(dtype, copy=False) if tokens else np.zeros(0, dtype)
        masks, sources, roles = self.mask_views(indices), self.source_views(indices), self.role_views(indices)
        return Rows(joined, token_starts, np.concatenate(offsets) if offsets else np.zeros(0, np.int32), offset_starts,
                    loss_mask=_joined(masks, np.uint8), source_ids=_joined(sources, np.uint16),
                    role_ids=_joined(roles, np.uint8))

    def doc_ids(self) -> np.ndarray:
        """int64 global document index of every stored segment, rows in stored order (reads
        every shard's doc_ids; a document split over several rows appears once per piece)."""
        for b in np.flatnonzero(self._unread).tolist():  # Arrow keeps them in the blocks' bytes
            self._first_read(b)
        return np.concatenate(self._doc_ids).astype(np.int64) if self._doc_ids else np.zeros(0, np.int64)

    def __iter__(self):
        for b, rows in enumerate(self._blocks):
            if self._unread[b]:
                self._first_read(b)
            for r in range(len(rows)):
                t0, t1 = rows.token_starts[r], rows.token_starts[r + 1]
                yield rows.tokens[t0:t1], rows.offsets[rows.offset_starts[r] : rows.offset_starts[r + 1]]


def _block_ranges(sums, mapped, first_row: int, n_rows: int, where: str) -> list:
    """What the first read of a block of rows [first_row, first_row + n_rows) of a shard checks:
    (bytes, FileSums, start, stop, file) of each checksummed range holding them."""
    if sums is None:
        return []
    rows = sums.rows
    k0 = int(np.searchsorted(rows, first_row))
    k1 = int(np.searchsorted(rows, first_row + n_rows)) if first_row + n_rows < rows[-1] else sums.n_blocks
    if rows[k0] != first_row or rows[k1] != first_row + n_rows:
        raise ValueError(f"{where}: rows {first_row}-{first_row + n_rows} are not whole checksummed blocks (the "
                         "checksums file does not match the shard; rebuild the dataset)")
    return [(mapped[f][0], sums.files[f], start, stop, mapped[f][1]) for f, start, stop in checksums.block_ranges(sums, k0, k1)]


def _joined(views, dtype):
    if views is None:
        return None
    return np.concatenate(views).astype(dtype, copy=False) if views else np.zeros(0, dtype)


def read_rows(ds, indices) -> tuple[list, list]:
    """Rows `indices` of an opened dataset as (token views, offset views): its `views` where it
    has one (one vectorized lookup), else `ds[i]` row by row (any reader with __getitem__)."""
    if hasattr(ds, "views"):
        return ds.views(indices)
    pairs = [ds[i] for i in np.asarray(indices).tolist()]
    return [p[0] for p in pairs], [p[1] for p in pairs]


def open_dataset(path, generation: str | None = None, **stream_options):
    """Open a dataset directory written by `packer build` (any shard format), or its URI.

    A local directory is memory-mapped (ShardDataset). A URI is streamed (packer/store/stream.py:
    indexes at open, then blocks of rows by ranged reads, read ahead, with a bounded memory and an
    optional cache directory); `stream_options` are its memory_bytes, read_ahead, cache_dir,
    cache_bytes and block_bytes (else the PACKER_* environment variables, else defaults), and
    a local path ignores them. `generation` (a reader's `.generation`): refuse any other
    generation of the dataset (DatasetReplaced), as PackedDataset's workers do."""
    place = fs.location(path)  # resolved once, here: the readers take the place
    if fs.is_remote(place):
        from packer.store.stream import StreamDataset

        return StreamDataset(place, generation=generation, **stream_options)
    try:
        return ShardDataset(place, generation)
    except DatasetReplaced:
        if generation is not None:
            raise
        return ShardDataset(place)  # a publish ended while this opened: the new dataset is whole now


PREVIOUS = ("_work", "previous")  # OUTPUT/_work/previous/: the old dataset while a new one moves in


def files_root(path, generation: str):
    """The directory holding the files of generation `generation` of the dataset at `path`: `path`,
    or, while an --overwrite moves a new dataset in over it (packer/preprocess/owned.py publish),
    path/_work/previous/, where the old one stays whole (hard links) under the same manifest.json:
    the old manifest stays in `path` until the new one replaces it, last and atomically, so a reader
    sees the old dataset or the new one at every instant, a kill mid-publish included."""
    if fs.is_remote(path):  # an object store keeps no previous/: no links to make it cheaply
        return path
    previous = path.joinpath(*PREVIOUS)
    if (previous / MANIFEST).is_file() and generation_of(previous) == generation:
        return previous
    return path
