"""Check a built dataset against its manifest; the first problem found is raised as one line.

Checked: every name the manifest gives a plain file name inside the directory, no file named
twice; shard by shard, every file present; sha256 equal to the manifest's and every block's
xxh3_64 equal to the shard's checksums file's (packer/store/checksums.py), in one pass per file
(both skipped by `checksums=False`, the `verify --quick`); what the shard's format checks when it opens
the files (headers, sizes, counts between them: packer/store/formats/); every row
non-empty and at most the context length; offsets start at 0, rise strictly and end at
the row length; one doc_id per segment; token ids below the vocabulary size (full check
only); sequence, token and segment counts equal the manifest's, per shard and in total
(`sequences`, `tokens_out`, `pieces`); distinct doc_ids equal `docs_accepted` less
`docs_dropped_long`; loss masks 0/1, one per token, summing to `trained_tokens` where the totals
have it; source ids one per segment, below the number of the manifest's sources; role ids one per
token, below the number of the manifest's roles (a table of names to ids 0..n-1), in every shard
when the manifest has that table and in none otherwise. Beside the shards: tokenizer.json present, its sha256 the manifest's
`tokenizer.sha256` (where it records one); stats.json present when documents were accepted, a JSON object of
packer's stats schema whose context length, document and token counts are the manifest's; an Arrow
dataset's state.json and dataset_info.json equal to what its shard entries give (`packer verify`
also checks report.html against stats.json: packer/stats/report.py check_report).
The returned totals name what `checksums=False` skipped (`skipped`, empty for a full check). The manifest is
read once (verify_generation): a publish while verify runs cannot pair one generation's files with another's
manifest, and `packer verify` checks the page of the generation whose files it checked.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pyarrow as pa

from packer.io import fs
from packer.store import checks, formats
from packer.store import checksums as block_checksums
from packer.store.dataset import files_root
from packer.store.manifest import STATS, load_manifest, read_stats, require_regular, tokenizer_file
from packer.store.stream import BLOCK_BYTES as STREAM_BLOCK_BYTES  # the block a streamed reader reads

QUICK_SKIPS = ("shard sha256", "block checksums", "token ids below the vocabulary")  # what checksums=False leaves out


@dataclasses.dataclass(frozen=True)
class Verified:
    """What verify_generation checked: `totals` (verify_dataset's), the directory whose files it checked (`root`:
    the dataset's, or _work/previous/ mid-publish) and the manifest it read, once, to check them."""

    totals: dict
    root: fs.Place
    manifest: dict


def verify_dataset(path, *, checksums: bool = True) -> dict:
    """Check a dataset; return its totals (sequences, tokens, documents) and `skipped`, the checks
    left out (QUICK_SKIPS without checksums, else none), or raise ValueError."""
    return verify_generation(path, checksums=checksums).totals


def verify_generation(path, *, checksums: bool = True) -> Verified:
    """verify_dataset, also giving the files' directory and the manifest it read (one read) for what checks them
    further (`packer verify`: the report page)."""
    path = fs.location(path)  # a directory, or a URI (packer/io/fs.py)
    manifest, generation = load_manifest(path)
    path = files_root(path, generation)  # mid-publish of an --overwrite: the old dataset, whole, in _work/previous/
    config = manifest["config"]
    fmt = formats.manifest_format(config)
    dtype = np.dtype(config["token_dtype"])
    totals = {"sequences": 0, "tokens": 0, "documents": 0}
    doc_ids, trained = [], 0
    n_roles = checks.role_count(manifest, fs.redact(path))
    for entry, files in zip(manifest["shards"], formats.manifest_files(fmt, manifest["shards"])):
        sums = _check_files(path, fmt, entry, files, checksums)
        where = fs.redact(path / entry["file"])  # no credentials of a URI in messages
        counts = {"sequences": 0, "tokens": 0, "documents": 0}
        try:
            for rows, block_doc_ids in formats.shard_blocks(path, entry, fmt, sums):
                checks.check_rows(rows, len(block_doc_ids), where, counts["sequences"], config["context_length"])
                _check_has_roles(rows, where, n_roles)
                checks.check_extras(rows, len(block_doc_ids), where, len(manifest.get("sources") or []),
                                    n_roles=n_roles)
                checks.check_doc_ids(block_doc_ids, where, manifest["totals"].get("docs_accepted"))
                trained += _trained(rows)
                if checksums:
                    checks.check_dtype(rows, where, dtype)
                    checks.check_token_ids(rows, where, manifest["tokenizer"]["vocab_size"])
                counts["sequences"] += len(rows)
                counts["tokens"] += int(rows.token_starts[-1] - rows.token_starts[0])
                counts["documents"] += len(block_doc_ids)
                doc_ids.append(np.asarray(block_doc_ids))
            if sums is not None:  # what a reader checks of the checksums file before it reads a row
                checks.check_sums_rows(sums, counts["sequences"], where)
                _check_as_streamed(path, fmt, entry, sums)
        except (pa.ArrowException, KeyError, OSError) as e:
            raise ValueError(f"{where}: unreadable shard ({type(e).__name__}: {e})") from None
        checks.check_counts(counts, entry, where)
        for key, value in counts.items():
            totals[key] += value
    _check_totals(totals, doc_ids, manifest["totals"])
    if "trained_tokens" in manifest["totals"] and trained != manifest["totals"]["trained_tokens"]:
        raise ValueError(f"{trained} trained tokens in the shards' loss masks, the manifest totals say "
                         f"{manifest['totals']['trained_tokens']!r} (the manifest was edited; rebuild the dataset)")
    tokenizer_file(path, manifest)
    stats = _check_stats(path, manifest)
    _check_derived(path, manifest, stats)
    return Verified({**totals, "skipped": [] if checksums else list(QUICK_SKIPS)}, path, manifest)


def _check_as_streamed(path, fmt: str, entry: dict, sums):
    """The checks a streaming reader makes of a shard's index and checksums at open (its format's
    stream_index: the checksummed blocks lie on the index's rows, Arrow's batch headers), run on
    these files, so a shard verify passes is one every reader opens."""
    files, _ = formats.data_files(fmt, entry)
    paths = [path / name for name, _ in files]

    def read(file, start: int, stop: int):
        return fs.map_bytes(file)[start:stop]

    formats.get(fmt).stream_index(read, fs.size, paths, STREAM_BLOCK_BYTES, formats.entry_extras(fmt, entry), sums)


def _check_has_roles(rows, where: str, n_roles: int):
    """A manifest with a role table has role ids in every shard (and one without, none)."""
    if (rows.role_ids is not None) != bool(n_roles):
        has = "has role ids but the manifest no \"roles\" table" if n_roles == 0 else \
            "lacks role ids, which the manifest's \"roles\" table says the build stored"
        raise ValueError(f"{where}: {has} (shards of another build, or the manifest was edited; rebuild the dataset)")


def _trained(rows) -> int:
    """Tokens of the block's rows that are trained (all of them without a loss mask)."""
    t0, t1 = int(rows.token_starts[0]), int(rows.token_starts[-1])
    return t1 - t0 if rows.loss_mask is None else int(np.count_nonzero(rows.loss_mask[t0:t1]))


def _check_files(path, fmt: str, entry: dict, files, checksums: bool):
    """Every file of a shard present; with `checksums`, each one's sha256 and blocks checked. Returns
    the shard's checksums (None: not checked, or a shard of format version 1)."""
    for name, _ in files:
        file = path / name
        require_regular(file)
        if not file.is_file():
            raise ValueError(f"shard missing: {fs.redact(file)} (listed in the manifest); restore it or rebuild")
    if not checksums:
        return None
    data, sums_file = formats.data_files(fmt, entry)
    sums = None
    if sums_file is not None:
        block_checksums.check_file(path / sums_file[0], sums_file[1])
        sums = block_checksums.read_sums(path / sums_file[0], sums_file[1], len(data))
    for k, (name, sha256) in enumerate(data):
        block_checksums.check_file(path / name, sha256, sums.files[k] if sums else None)
    return sums


def _check_totals(counts: dict, doc_ids: list, totals: dict):
    """sequences, tokens_out, pieces (segments) and docs_accepted against the shards."""
    checks.check_totals(counts, totals)
    if "pieces" in totals and counts["documents"] != totals["pieces"]:
        raise ValueError(f"{counts['documents']} segments in the shards, the manifest totals say {totals['pieces']!r} "
                         "pieces (the manifest was edited or a shard entry dropped; rebuild the dataset)")
    if "docs_accepted" in totals:
        stored = len(np.unique(np.concatenate(doc_ids))) if doc_ids else 0
        want = totals["docs_accepted"] - totals.get("docs_dropped_long", 0)
        if stored != want:
            raise ValueError(f"{stored} distinct documents in the shards, the manifest totals say {want} (docs_accepted "
                             "less docs_dropped_long; the manifest was edited or a shard entry dropped; rebuild)")


def _check_derived(path, manifest: dict, stats: dict | None):
    """The files the format derives from the shard entries (Arrow: HF datasets' state.json and
    dataset_info.json) equal what the entries give. (report.html, the page stats.json gives, is
    checked by packer/stats/report.py check_report: the page's layout is the stats package's.)"""
    for name, data in formats.derived_files(formats.manifest_format(manifest["config"]), manifest["shards"]).items():
        file = path / name
        if file.is_file() and file.read_bytes() != data:  # absent: a dataset of packer before 2026-12, or by hand
            raise ValueError(f"{fs.redact(file)}: not what this dataset's manifest gives (edited, or of another "
                             "build); rebuild the dataset")


def _check_stats(path, manifest: dict) -> dict | None:
    """stats.json: written when any document was accepted; its counts are the build's. Returns it (None if absent)."""
    file, totals, config = path / STATS, manifest["totals"], manifest["config"]
    if not file.is_file():
        if totals.get("docs_accepted", 0) > 0:
            raise ValueError(f"{fs.redact(file)} missing (the build accepted {totals['docs_accepted']} documents); "
                             "rebuild, or run `packer stats` on the dataset")
        return None
    stats = read_stats(file)
    lengths = stats.get("lengths") if isinstance(stats, dict) else None
    expected = (("context_length", stats.get("context_length") if isinstance(stats, dict) else None,
                 config["context_length"]),
                ("lengths.documents", lengths.get("documents") if isinstance(lengths, dict) else None,
                 totals.get("docs_accepted")),
                ("lengths.tokens", lengths.get("tokens") if isinstance(lengths, dict) else None, totals.get("tokens_in")))
    for key, got, want in expected:
        if want is not None and got != want:
            raise ValueError(f"{fs.redact(file)}: {key} {str(got)[:40]}, the manifest says {want} (stats of another "
                             "build, or edited); rebuild, or run `packer stats` on the dataset")
    return stats
