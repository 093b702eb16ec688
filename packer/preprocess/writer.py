"""Write stage: the plan and the unit files -> one shard's files (any format), hashed.

A shard is first a `Layout` (row bounds, offsets, doc_ids: plan arithmetic, no tokens);
its tokens are then gathered from the memory-mapped unit files one chunk of rows at a
time, and its format (packer/store/formats/) streams them into temporary files that two
threads write and hash while the next chunk is gathered (packer/io/hashed.py). Renames come
last, so a shard file under its final name is complete; `_work/shards/shard-XXXXX.json` (its
manifest entry) says the shard is done. On a remote
filesystem (packer/io/fs.py) pieces come by ranged reads and the shard is written in place:
there only that .json says the shard is complete.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

import numpy as np

from packer.io import atomic, failpoints, fs, ranged
from packer.io.hashed import HashedFile
from packer.preprocess.plan import Plan
from packer.store import checksums, formats
from packer.store.rows import Layout, extras_of


@functools.lru_cache(maxsize=1)
def _load_plan(path: fs.Place, stamp: tuple) -> Plan:
    """The plan at `path`: the plan stage writes one file per shard (read once, by its write task);
    a whole plan.npz (tests, benchmarks) is read once per worker process, not once per shard."""
    return Plan.load(fs.for_numpy(path))


def _gather_tokens(plan: Plan, p0: int, p1: int, units_dir, dtype, units: dict, kind: str = "tokens") -> np.ndarray:
    """Concatenate the tokens of pieces p0..p1 from the unit token files (packer/io/ranged.py: memory
    maps locally, ranged reads remotely); with kind "loss_mask", their masks from the units'
    loss_mask.npy files (a unit without one: all 1); with kind "role_ids", their role ids from the
    units' role_ids.npy files. Returns a read-only array over the joined bytes."""
    itemsize = np.dtype(dtype).itemsize
    piece_unit = plan.piece_unit[p0:p1]
    begin = plan.piece_start[p0:p1] * itemsize
    end = begin + plan.piece_len[p0:p1] * itemsize
    return np.frombuffer(ranged.gather_pieces(units_dir, piece_unit, begin, end, units, kind), dtype=dtype)


def shard_layout(plan: Plan, shard: int) -> tuple[Layout, int]:
    """The layout of one shard from the plan alone, and its first piece."""
    s0, s1 = int(plan.shard_starts[shard]), int(plan.shard_starts[shard + 1])
    p0, p1 = int(plan.seq_starts[s0]), int(plan.seq_starts[s1])
    piece_len = plan.piece_len[p0:p1]
    seq_starts = plan.seq_starts[s0 : s1 + 1] - p0  # pieces of each row, relative to p0
    piece_end = np.cumsum(piece_len)
    token_starts = np.concatenate([[0], piece_end])[seq_starts].astype(np.int64)
    # offsets of row r: [0, piece ends of its pieces...] relative to the row start.
    n_pieces = np.diff(seq_starts)
    row_of_piece = np.repeat(np.arange(len(n_pieces)), n_pieces)
    offsets = np.zeros(len(piece_len) + len(n_pieces), dtype=np.int32)
    offsets[np.arange(len(piece_len)) + row_of_piece + 1] = piece_end - token_starts[row_of_piece]
    offset_starts = (seq_starts + np.arange(len(seq_starts))).astype(np.int64)
    return Layout(token_starts, offsets, offset_starts, plan.piece_doc[p0:p1].astype(np.int64)), p0


def _close_all(files):
    """Close every file; re-raise the first failure (a full disk) after the others are closed."""
    error = None
    for f in files:
        try:
            f.close()
        except BaseException as e:  # re-raised below, once all are closed
            error = error or e
    if error is not None:
        raise error


def write_rows(layout: Layout, tokens_of, out_dir: Path, shard: int, fmt: str, *, loss_mask: bool = False,
               role_ids: bool = False) -> dict:
    """Write one shard's files atomically (temporary names, then renames; in place on a remote
    filesystem, where the caller's marker says complete); return its entry's file names and sha256.

    `tokens_of(r0, r1)` gives the tokens of rows r0..r1 (a new array each call, in the
    stored dtype; with `loss_mask`, (tokens, uint8 mask); with `role_ids` too, (tokens, mask, uint8
    roles)): the format (packer/store/formats/) asks
    for rows in chunks of ROWS_PER_BATCH, gathered while the previous chunk is written and hashed,
    so the whole shard never sits in memory. `layout.source_ids`, when set, is stored too, and
    last the shard's checksums file (an xxh3_64 per read block of each file: packer/store/checksums.py)."""
    extras = extras_of(layout, loss_mask, role_ids)
    names = formats.file_names(fmt, shard, extras)
    files = []
    try:
        for _, _, name in names:
            files.append(HashedFile(out_dir / name))
        sinks = [checksums.BlockSink(f) for f in files]
        bounds = formats.get(fmt).write(layout, tokens_of, sinks, extras)
        names.append((*formats.CHECKSUMS[:2], formats.shard_stem(shard) + formats.CHECKSUMS[2]))
        files.append(HashedFile(out_dir / names[-1][2]))
        for buf in checksums.sums_bytes(bounds, [sink.sums() for sink in sinks]):
            files[-1].write(buf)
    finally:
        _close_all(files)
    entry = {}
    for (name_key, sha_key, name), f in zip(names, files):
        entry[name_key], entry[sha_key] = name, f.hexdigest()
    failpoints.hit("write-shard", shard)
    for (_, _, name), f in zip(names, files):
        atomic.publish(f.tmp, out_dir / name)
    return entry


def _complete(entry: dict, out, fmt: str) -> bool:
    try:
        names = formats.entry_files(fmt, entry)
    except ValueError:  # not an entry of this format: write the shard again
        return False
    return all((out / name).exists() for name, _ in names)


def write_shard(plan_path: fs.Place, shard: int, work: fs.Place, out: fs.Place, dtype: str, fmt: str = formats.DEFAULT, *,
                loss_mask: bool = False, unit_sources: tuple[int, ...] | None = None, role_ids: bool = False) -> dict:
    """Write one shard (skipped if a finished run of this call left its entry); return its entry.

    `loss_mask`: gather each piece's mask from the units' loss_mask.npy files and store it;
    `role_ids` (with loss_mask: chat): each piece's role ids from the units' role_ids.npy files.
    `unit_sources[u]`: the source index of unit u; every segment stores its unit's source."""
    failpoints.hit("shard", shard)
    done = work / "shards" / f"shard-{shard:05d}.json"
    if done.exists():
        entry = json.loads(done.read_text(encoding="utf-8"))
        if _complete(entry, out, fmt):
            return entry
    plan = _load_plan(plan_path, fs.stamp(plan_path))
    layout, p0 = shard_layout(plan, 0 if plan.n_shards == 1 else shard)  # a one-shard plan is this shard's own
    if unit_sources is not None:
        p1 = p0 + len(layout.doc_ids)
        sources = np.asarray(unit_sources, np.uint16)[plan.piece_unit[p0:p1]]
        layout = Layout(layout.token_starts, layout.offsets, layout.offset_starts, layout.doc_ids, sources)  # (no
        # _replace: a NamedTuple's _replace checks len(), which Layout counts in rows)
    pieces = p0 + np.concatenate([[0], np.cumsum(np.diff(layout.offset_starts) - 1)])  # first piece of each row
    units: dict[int, np.ndarray] = {}
    masks: dict[int, np.ndarray] = {}
    roles: dict[int, np.ndarray] = {}

    def tokens_of(r0: int, r1: int):
        a, b = int(pieces[r0]), int(pieces[r1])
        tokens = _gather_tokens(plan, a, b, work / "units", np.dtype(dtype), units)
        if not loss_mask:
            return tokens
        mask = _gather_tokens(plan, a, b, work / "units", np.dtype(np.uint8), masks, "loss_mask")
        if not role_ids:
            return tokens, mask
        return tokens, mask, _gather_tokens(plan, a, b, work / "units", np.dtype(np.uint8), roles, "role_ids")

    entry = {
        **write_rows(layout, tokens_of, out, shard, fmt, loss_mask=loss_mask, role_ids=role_ids),
        "sequences": len(layout),
        "tokens": int(layout.token_starts[-1]),
        "documents": len(layout.doc_ids),
    }
    done.parent.mkdir(exist_ok=True)
    atomic.write_json(done, entry)
    return entry
