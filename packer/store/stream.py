"""Streaming reads of a remote dataset: indexes at open, then blocks of rows by ranged reads, read ahead, cached.

    open       manifest.json; each shard's index (memmap/Megatron .idx and doc ids whole; an Arrow
               shard's message headers, one small ranged read per record batch), shards in parallel
    a block    a run of consecutive rows of one shard and the byte range(s) that hold them:
               memmap/Megatron ~block_bytes (1 MiB) of .bin; Arrow one record batch (ROWS_PER_BATCH rows)
    a read     ds[i], views, get_many: each block the rows fall in, from memory, the cache directory
               or one ranged read of the store (retried, packer/io/retry.py); rows come back as copies
    read-ahead ds.prefetch(indices, calls=...): the rows the loader will read next, in order (and
               how many each read call takes); background threads (read_ahead of them) fetch their
               blocks in that order while memory allows without letting go a block reading on
               demand would keep, so read-ahead never reads more bytes (read_plan.py)

Memory: blocks held (read, or fetched ahead and not yet read) stay under `memory_bytes`; one block
asked for on demand may pass it. Told a plan, memory keeps the blocks it uses soonest (Belady's
rule), else the most recently read. So what this reader holds is at most

    index bytes  +  memory_bytes + largest block  +  the rows of the call in progress

where index bytes are O(rows + segments), never O(tokens): memmap 16 B a row + 12 B a segment,
Megatron 20 B a row + 20 B a segment (its offsets are rebuilt), Arrow 40 B a record batch; and a
prefetch plan costs 24 B a run of rows in one block (a row at most). `ds.held_bytes` is the block part, `ds.max_held_bytes`
its peak (tests/store/test_stream.py holds both to the bound on a dataset 10x larger than it).

Cache: with `cache_dir`, every block and index read is also kept in a local directory shared by
every process of the node (packer/io/cache.py: keyed by the file's sha256 and range, LRU by size,
`cache_bytes`); a block is read from the store once per node while it fits.

Checks: every byte read against its shard's checksums (packer/store/checksums.py: the checksums
file read first, its sha256 the manifest's; an index as a whole, a block as the run of checksummed
ranges it is), from the store or the cache directory alike; a mismatch is read again once from the
store (a bad cache entry is dropped) before it raises, naming the shard, the byte range and the
likely cause (replaced, when the manifest changed too). Then at open what the indexes hold
(memmap, Megatron: every count and row bound, as ShardDataset; Arrow: the sequences per shard);
each block's rows, offsets, doc ids and token ids each time it is fetched (checks.py). Token and
document counts of an Arrow shard are in its bodies: `packer verify` checks them. A dataset of a
packer before block checksums is read unchecked, said once by a warning.

Generation: the reader pins the sha256 of the manifest it opened (packer/store/manifest.py) and
pickles with it; reopened elsewhere (a DataLoader worker) it refuses another generation.

Options come from open_dataset's keywords, else the environment (so DataLoader workers and
PackedDataset get them unchanged): PACKER_STREAM_MEMORY_BYTES, PACKER_READ_AHEAD,
PACKER_CACHE_DIR, PACKER_CACHE_BYTES, PACKER_BLOCK_BYTES.
"""

from __future__ import annotations

import collections
import os
import struct
import warnings
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pyarrow as pa

from packer.io import fs, ranged, retry
from packer.io.cache import BlockCache
from packer.store import checks, checksums, formats
from packer.store.held_blocks import HeldBlocks
from packer.store.manifest import check_generation, generation_of, load_manifest
from packer.store.rows import Rows

MEMORY_BYTES = 256 << 20
READ_AHEAD = 16  # blocks fetched at once (threads); 0: every read on demand, in the caller's thread
CACHE_BYTES = 16 << 30
BLOCK_BYTES = 1 << 20  # memmap/Megatron: about time-to-first-byte x bandwidth, as ranged.GAP_BYTES
ENV = {"memory_bytes": "PACKER_STREAM_MEMORY_BYTES", "read_ahead": "PACKER_READ_AHEAD",
       "cache_dir": "PACKER_CACHE_DIR", "cache_bytes": "PACKER_CACHE_BYTES", "block_bytes": "PACKER_BLOCK_BYTES"}
DEFAULTS = {"memory_bytes": MEMORY_BYTES, "read_ahead": READ_AHEAD, "cache_dir": None, "cache_bytes": CACHE_BYTES,
            "block_bytes": BLOCK_BYTES}


def options(**given) -> dict:
    """The reader's options: those given (not None), else the environment's, else the defaults."""
    out = {}
    for key, default in DEFAULTS.items():
        value = given.get(key)
        if value is None and os.environ.get(ENV[key]):
            value = os.environ[ENV[key]]
            if key != "cache_dir":
                try:
                    value = int(value)
                except ValueError:
                    raise ValueError(f"{ENV[key]}={value!r}: expected a whole number") from None
        out[key] = default if value is None else value
    for key in ("memory_bytes", "block_bytes", "cache_bytes"):
        if int(out[key]) < 1:
            raise ValueError(f"{key}={out[key]}: must be at least 1 byte")
    if int(out["read_ahead"]) < 0:
        raise ValueError(f"read_ahead={out['read_ahead']}: give 0 (no read-ahead) or a number of blocks")
    return out


class StreamDataset(HeldBlocks):
    """ShardDataset's interface (len, ds[i], views, get_many, doc_ids, iteration, manifest) over a
    remote dataset read by blocks (module docstring), plus prefetch(indices) (held_blocks.py: the
    blocks held in memory and read ahead)."""

    def __init__(self, path, generation: str | None = None, **given):
        self.path = fs.location(path)
        self.options = options(**given)
        self.manifest, self.generation = retry.retried(lambda: load_manifest(self.path), self.path)
        check_generation(self.path, generation, now=self.generation)
        config = self.manifest["config"]
        self.format = formats.manifest_format(config)
        self.context_length = int(config["context_length"])
        self.vocab_size = int(self.manifest["tokenizer"]["vocab_size"])
        self.dtype = np.dtype(config["token_dtype"])
        self.source_names = [source.get("name") for source in self.manifest.get("sources") or []]
        self.roles = self.manifest.get("roles")  # role name -> id of a build with --store-roles, else None
        self._n_roles = checks.role_count(self.manifest, fs.redact(self.path))
        self._n_docs = self.manifest["totals"].get("docs_accepted")  # doc_ids lie below it
        self._module = formats.get(self.format)
        self._cache = (BlockCache(self.options["cache_dir"], int(self.options["cache_bytes"]))
                       if self.options["cache_dir"] else None)
        self.stats = collections.Counter()  # store reads, bytes read, cache hits, blocks fetched
        self._sha: dict[str, str] = {}
        self._sums: dict[str, checksums.FileSums] = {}  # file URI -> its checksummed ranges
        self._warned_call = False  # _warn_if_call_too_big: once
        self._reset_threads()
        self._open_shards()

    # -- open ----------------------------------------------------------------------------

    def _open_shards(self):
        formats.manifest_files(self.format, self.manifest["shards"])  # names inside the directory, none twice
        files = [formats.data_files(self.format, entry) for entry in self.manifest["shards"]]
        paths = [[self.path / name for name, _ in shard] for shard, _ in files]
        extras = [formats.entry_extras(self.format, entry) for entry in self.manifest["shards"]]
        for shard, sums_file in files:
            self._sha.update({(self.path / name).uri: sha for name, sha in [*shard, *[sums_file] * bool(sums_file)] if sha})
        if any(sums_file is None for _, sums_file in files):
            _warn_unchecked(self.path)
        block_bytes = int(self.options["block_bytes"])

        def index(k):
            try:
                sums = self._read_sums(paths[k], files[k][1])
                opened = self._module.stream_index(self._read, self._size, paths[k], block_bytes, extras[k], sums)
                checks.check_sums_rows(sums, opened[3]["sequences"], fs.redact(paths[k][0]))  # as verify does
                return opened
            except FileNotFoundError as e:
                raise ValueError(f"shard missing: {getattr(e, 'where', None) or fs.redact(paths[k][0])} (listed in the manifest); "
                                 "restore it or rebuild the dataset") from None
            except (pa.ArrowException, KeyError, IndexError, struct.error) as e:  # damaged bytes, not our checks'
                raise ValueError(f"{fs.redact(paths[k][0])}: unreadable shard ({type(e).__name__}: {str(e)[:200]}); "
                                 "run `packer verify`, or rebuild") from None

        with ThreadPoolExecutor(max(1, min(16, len(paths)))) as pool:  # shards' headers read in parallel
            indexes = list(pool.map(index, range(len(paths))))
        self._shards = []  # (paths, state, row bounds) per shard
        starts, ranges, where, n_tokens, fields = [0], [], [], 0, []
        for k, (entry, (bounds, block_ranges, state, counts, present)) in enumerate(zip(self.manifest["shards"], indexes)):
            name = fs.redact(paths[k][0])
            self._check_shard(entry, name, state, counts)
            self._shards.append((paths[k], state, bounds))
            fields.append((name, set(present)))
            for b in range(len(block_ranges)):
                ranges.append((k, b, block_ranges[b]))
                where.append((name, int(bounds[b])))
                starts.append(starts[-1] + int(bounds[b + 1] - bounds[b]))
            n_tokens = None if n_tokens is None or "tokens" not in counts else n_tokens + counts["tokens"]
        self._block_starts = np.asarray(starts, dtype=np.int64)
        self._blocks, self._where = ranges, where
        self._nbytes = [sum(stop - start for _, start, stop in r) for _, _, r in ranges]
        self._n = starts[-1]
        totals = {"sequences": self._n, "tokens": n_tokens}
        if n_tokens is None:  # an Arrow dataset: tokens are in the bodies, checked by `packer verify`
            totals["tokens"] = self.manifest["totals"].get("tokens_out")
        checks.check_totals(totals, self.manifest["totals"])
        self.has_loss_mask, self.has_source_ids, self.has_role_ids = (
            _all_or_none(fields, f) for f in ("loss_mask", "source_ids", "role_ids"))

    def _check_shard(self, entry, name, state, counts):
        for key, value in counts.items():
            if value != entry.get(key):
                raise ValueError(f"{name}: {value} {key}, the manifest says {entry.get(key)!r} (the manifest was "
                                 "edited or the shard replaced; rebuild the dataset)")
        if isinstance(state, tuple) and hasattr(state, "token_starts"):  # memmap, Megatron: every row bound now
            fake = np.broadcast_to(np.zeros(1, state.dtype), (int(state.token_starts[-1]),))  # no token read
            rows = Rows(fake, state.token_starts, state.offsets, state.offset_starts)
            checks.check_bounds(rows, name, 0, self.context_length)
            checks.check_dtype(rows, name, self.dtype)
            checks.check_doc_ids(state.doc_ids, name, self._n_docs)

    # -- reads ---------------------------------------------------------------------------

    def _size(self, path) -> int:
        self.stats["store requests"] += 1
        return retry.retried(lambda: fs.size(path), path)

    def _read_sums(self, paths, sums_file):
        """A shard's checksums (None for a shard of format version 1), its ranges kept per file."""
        if sums_file is None:
            return None
        path, parsed = self.path / sums_file[0], []

        def check(data, cause):  # its sha256 the manifest's
            parsed[:] = [checksums.parse_checked(data, path, sums_file[1], len(paths))]

        self._read(path, 0, self._size(path), check)
        for file, file_sums in zip(paths, parsed[0].files):
            self._sums[file.uri] = file_sums
        return parsed[0]

    def _read(self, path, start: int, stop: int, check=None):
        """Bytes [start, stop) of a shard file: from the cache directory, else one ranged read;
        checked against the file's checksums, or by check(data, cause) (a mismatch read again once,
        from the store, before it raises)."""
        if check is None and (file_sums := self._sums.get(path.uri)) is not None:
            def check(data, cause):
                checksums.check_range(file_sums, start, stop, data, fs.redact(path), cause)
        key = f"{self._sha[path.uri]}:{start}:{stop}" if self._cache is not None and path.uri in self._sha else None
        data = self._cache.get(key, stop - start) if key is not None else None
        cached = data is not None
        if cached:
            self.stats["cache hits"] += 1
        else:
            data = self._store_read(path, start, stop)
        if check is not None:
            try:
                check(data, checksums.CAUSES)
            except checksums.ChecksumError:
                self.stats["checksum retries"] += 1
                if cached:
                    self._cache.discard(key)
                data, cached = self._store_read(path, start, stop), False
                try:
                    check(data, checksums.CAUSES + ", in the store, or in transit; read twice")
                except checksums.ChecksumError as e:
                    self._explain(e)
        if key is not None and not cached:
            self._cache.put(key, data)
        return data

    def _store_read(self, path, start: int, stop: int):
        try:
            data = ranged.read_range(path, start, stop) if stop > start else b""
        except OSError as e:  # a short read, gone: replaced, if the manifest changed too (asked once)
            try:
                now = generation_of(self.path)
            except OSError:
                raise e from None
            check_generation(self.path, self.generation, now=now)
            raise
        self.stats["store requests"] += 1
        self.stats["store bytes"] += stop - start
        return data

    def _explain(self, error: Exception):
        """Raise `error`, or DatasetReplaced when the manifest changed since this reader opened it
        (the likelier cause of a block that does not match)."""
        now = retry.retried(lambda: generation_of(self.path), self.path)
        check_generation(self.path, self.generation, now=now)
        raise error

    def _fetch(self, b: int):
        """Block b read and checked: (Rows, doc_ids)."""
        k, j, block_ranges = self._blocks[b]
        paths, state, bounds = self._shards[k]
        buffers = [self._read(paths[i], start, stop) for i, start, stop in block_ranges]
        where, first_row = self._where[b]
        try:
            rows, doc_ids = self._module.stream_block(state, bounds, j, buffers)
        except (pa.ArrowException, KeyError, IndexError) as e:
            _, start, stop = block_ranges[0]
            raise ValueError(f"{where} bytes {start}-{stop}: unreadable block ({type(e).__name__}: {str(e)[:200]}); "
                             "run `packer verify`, or rebuild") from None
        checks.check_dtype(rows, where, self.dtype)
        checks.check_rows(rows, len(doc_ids), where, first_row, self.context_length)
        checks.check_token_ids(rows, where, self.vocab_size)
        checks.check_doc_ids(doc_ids, where, self._n_docs)
        checks.check_extras(rows, len(doc_ids), where, len(self.source_names), n_roles=self._n_roles)
        self.stats["blocks fetched"] += 1
        return rows, doc_ids

    def __len__(self) -> int:
        return self._n

    def __reduce__(self):
        given = {k: v for k, v in self.options.items() if v != DEFAULTS[k]}
        return _reopen, (self.path, given, self.generation)  # reopened where it is unpickled, never copied

    def _indices(self, indices) -> np.ndarray:
        idx = np.asarray(indices, dtype=np.int64).reshape(-1)
        n = self._n
        if idx.size and (idx.min() < -n or idx.max() >= n):
            raise IndexError(f"indices must be in [-{n}, {n}) for a dataset of {n} sequences")
        return idx % n if n else idx

    def __getitem__(self, i):
        n = self._n
        if not -n <= i < n:
            raise IndexError(f"sequence {i} out of range for a dataset of {n}")
        tokens, offsets = self.views([i])
        return tokens[0], offsets[0]

    def _gather(self, indices, fields: tuple[str, ...]) -> dict[str, list]:
        """{field: one copy per row of `indices`} for fields tokens, offsets, loss_mask,
        source_ids: the call's blocks fetched together (read_ahead threads), then read in turn."""
        self._check_pid()
        idx = self._indices(indices)
        block = self._blocks_of(idx)
        order = np.argsort(block, kind="stable")
        firsts = np.flatnonzero(np.diff(block[order], prepend=-1))
        wanted = block[order][firsts]
        read_order = self._start_call(block, wanted.tolist())
        try:
            return self._copy_rows(idx, block, order, firsts, wanted, read_order, fields)
        finally:
            self._end_call()

    def _copy_rows(self, idx, block, order, firsts, wanted, read_order, fields) -> dict[str, list]:
        """The rows' fields copied out of their blocks (`wanted`, ascending; read in `read_order`),
        each block read once."""
        out = {field: [None] * len(idx) for field in fields}
        local = (idx - self._block_starts[block]).tolist()
        ends = [*firsts[1:].tolist(), len(order)]
        for b in read_order:
            g = int(wanted.searchsorted(b))
            rows, _ = self._block(b)
            ts, ost = rows.token_starts, rows.offset_starts
            for p in order[firsts[g] : ends[g]].tolist():
                r = local[p]
                for field in fields:
                    if field in ("tokens", "loss_mask", "role_ids"):
                        out[field][p] = getattr(rows, field)[ts[r] : ts[r + 1]].copy()
                    elif field == "offsets":
                        out[field][p] = rows.offsets[ost[r] : ost[r + 1]].copy()
                    else:  # a row's segments: its offsets less one, counted from the block's first row
                        a = ost[r] - r - ost[0]
                        out[field][p] = rows.source_ids[a : a + ost[r + 1] - ost[r] - 1].copy()
            self._done_with(b)
        return out

    def views(self, indices) -> tuple[list, list]:
        """Rows `indices` (any order, repeats allowed) as (tokens of each row, offsets of each
        row), ShardDataset.views' shape; copies, not views (a block is let go once read)."""
        got = self._gather(indices, ("tokens", "offsets"))
        return got["tokens"], got["offsets"]

    def mask_views(self, indices) -> list | None:
        """Rows `indices`' loss masks (uint8, one per token), or None when the dataset has none."""
        return self._gather(indices, ("loss_mask",))["loss_mask"] if self.has_loss_mask else None

    def source_views(self, indices) -> list | None:
        """Rows `indices`' source ids (uint16, one per segment), or None when the build named none."""
        return self._gather(indices, ("source_ids",))["source_ids"] if self.has_source_ids else None

    def role_views(self, indices) -> list | None:
        """Rows `indices`' role ids (uint8, one per token), or None when the build stored none."""
        return self._gather(indices, ("role_ids",))["role_ids"] if self.has_role_ids else None

    def get_many(self, indices) -> Rows:
        """Rows `indices` as one CSR batch (ShardDataset.get_many), in one pass over their blocks."""
        fields = ("tokens", "offsets") + ("loss_mask",) * self.has_loss_mask + ("source_ids",) * self.has_source_ids \
            + ("role_ids",) * self.has_role_ids
        got = self._gather(indices, fields)
        tokens, offsets = got["tokens"], got["offsets"]
        token_starts = np.zeros(len(tokens) + 1, np.int64)
        offset_starts = np.zeros(len(offsets) + 1, np.int64)
        np.cumsum([len(t) for t in tokens], out=token_starts[1:])
        np.cumsum([len(o) for o in offsets], out=offset_starts[1:])
        return Rows(_joined(tokens, self.dtype), token_starts, _joined(offsets, np.int32), offset_starts,
                    loss_mask=_joined(got.get("loss_mask"), np.uint8), source_ids=_joined(got.get("source_ids"), np.uint16),
                    role_ids=_joined(got.get("role_ids"), np.uint8))

    def _block_in_order(self, b: int):
        """Block b read whole, as the plan of a pass over every row in stored order says (then _done_with)."""
        self._start_call(np.full(int(self._block_starts[b + 1] - self._block_starts[b]), b, np.int64), [b])
        return self._block(b)

    def doc_ids(self) -> np.ndarray:
        """int64 global document index of every stored segment, rows in stored order: from the
        indexes where the format's index holds them (memmap, Megatron: checked at open), or every
        block in turn (Arrow: a pass over the dataset)."""
        parts = [getattr(state, "doc_ids", None) for _, state, _ in self._shards]
        if any(part is None for part in parts):
            self.prefetch(np.arange(self._n), reset=True)
            parts = []
            for b in range(len(self._blocks)):
                parts.append(self._block_in_order(b)[1].copy())
                self._end_call()
        return np.concatenate(parts).astype(np.int64) if parts else np.zeros(0, np.int64)

    def __iter__(self):
        self.prefetch(np.arange(self._n), reset=True)
        for b in range(len(self._blocks)):
            rows, _ = self._block_in_order(b)
            try:
                for r in range(len(rows)):
                    t0, t1 = rows.token_starts[r], rows.token_starts[r + 1]
                    yield rows.tokens[t0:t1].copy(), rows.offsets[rows.offset_starts[r] : rows.offset_starts[r + 1]].copy()
            finally:
                self._end_call()


def _joined(parts, dtype):
    if parts is None:
        return None
    return np.concatenate(parts).astype(dtype, copy=False) if parts else np.zeros(0, dtype)


def _all_or_none(fields: list[tuple[str, set]], field: str) -> bool:
    """Whether the shards hold optional `field`: all of them, or none (ShardDataset's rule)."""
    have = [field in present for _, present in fields]
    if any(have) and not all(have):
        where = fields[have.index(not have[0])][0]
        raise ValueError(f"{where}: {'has' if have[0] is False else 'lacks'} {field}, unlike the dataset's first "
                         "shard (shards of different builds mixed; rebuild the dataset)")
    return bool(have) and have[0]


def _reopen(path, given, generation=None):
    return StreamDataset(path, generation, **given)


_WARNED: set[str] = set()


def _warn_unchecked(path):
    """Once per dataset and process: a dataset of a packer before block checksums is streamed unchecked."""
    where = fs.redact(path)
    if where not in _WARNED:
        _WARNED.add(where)
        warnings.warn(f"{where} was built by a packer without block checksums: its blocks are streamed without a "
                      "check of their bytes (a local copy is checked by sha256 at open); rebuild it to add them",
                      stacklevel=4)
