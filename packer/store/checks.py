"""What a block of rows must satisfy before anything reads it: the checks verify and open_dataset share.

    check_bounds(rows)   cheap, at open (O(rows)): row and offset bounds rise and lie inside
                         the block's arrays, every row 1..context tokens long
    check_rows(rows)     offsets start at 0, rise strictly, end at the row length; one doc_id
                         per segment (O(offsets)): verify, and open_dataset at a block's first read
    check_dtype          tokens stored in the dtype the manifest says
    check_doc_ids        every doc_id a document of the build: 0 <= id < docs_accepted
    check_token_ids      every id below the vocabulary (O(tokens)): verify, and open_dataset at
                         a block's first read
    check_extras         a loss mask (one 0/1 per token), source ids (one per segment, below the
                         number of sources) and role ids (one per token, below the number of roles)
                         where the block has them: lengths at open, values at first read
    check_counts         a shard's sequences, tokens and segments as its manifest entry says
    check_totals         the shards' sequences and tokens as the manifest totals say
    manifest_problem     the manifest against itself, before any shard is opened: the shard entries
                         sum to the totals, stored documents fit in the pieces (load_manifest: every
                         reader, inspect, stats and verify)
    check_sums_rows      a shard's checksums file covers exactly the shard's rows

Each raises ValueError naming the shard (`where`), the row and the limit; indices are absolute
into the block's arrays, rows numbered from `first_row`.
"""

from __future__ import annotations

import numpy as np

from packer.store.rows import Rows


def _first(mask: np.ndarray) -> int:
    return int(np.flatnonzero(mask)[0])


def check_bounds(rows: Rows, where: str, first_row: int, context_length: int):
    """Row r is tokens[token_starts[r]:token_starts[r+1]], 1..context_length long, inside `tokens`;
    its offsets offset_starts[r]:[r+1], at least 2, inside `offsets`."""
    for starts, values, what in ((rows.token_starts, rows.tokens, "token"), (rows.offset_starts, rows.offsets, "offset")):
        if len(starts) < 1 or starts[0] < 0 or starts[-1] > len(values):
            raise ValueError(f"{where}: {what} bounds [{starts[0] if len(starts) else None}, "
                             f"{starts[-1] if len(starts) else None}] outside its {len(values)} {what}s (corrupt index)")
    lengths = np.diff(rows.token_starts)
    n_offsets = np.diff(rows.offset_starts)
    problems = (
        (lengths < 1, "is empty (or its bounds fall)"),
        (lengths > context_length, f"is longer than the context length {context_length}"),
        (n_offsets < 2, "has fewer than 2 offsets"),
    )
    bad = problems[0][0] | problems[1][0] | problems[2][0]
    if bad.any():  # the first bad row, with what is wrong with it
        r = _first(bad)
        what = next(what for mask, what in problems if mask[r])
        raise ValueError(f"{where} row {first_row + r}: {lengths[r]} tokens, {n_offsets[r]} offsets; the row {what} "
                         "(corrupt shard: rebuild it)")


def check_rows(rows: Rows, n_doc_ids: int, where: str, first_row: int, context_length: int):
    """check_bounds, then every row's offsets and the doc_id count."""
    check_bounds(rows, where, first_row, context_length)
    lengths = np.diff(rows.token_starts)
    o0, o1 = int(rows.offset_starts[0]), int(rows.offset_starts[-1])
    offsets = np.asarray(rows.offsets[o0:o1], dtype=np.int64)
    starts = rows.offset_starts[:-1] - o0
    ends = rows.offset_starts[1:] - o0 - 1
    bad = (offsets[starts] != 0) | (offsets[ends] != lengths)
    if bad.any():
        r = _first(bad)
        raise ValueError(
            f"{where} row {first_row + r}: offsets {offsets[starts[r] : ends[r] + 1].tolist()[:8]}... must start "
            f"at 0 and end at the row length {lengths[r]}"
        )
    rises = np.diff(offsets)
    rises[ends[:-1]] = 1  # the step from one row's end to the next row's 0 is not a rise
    if rises.size and (rises <= 0).any():
        r = int(np.searchsorted(ends, _first(rises <= 0)))
        raise ValueError(f"{where} row {first_row + r}: offsets must rise strictly (an empty or reversed segment)")
    if n_doc_ids != o1 - o0 - len(lengths):
        raise ValueError(f"{where}: {n_doc_ids} doc_ids for {o1 - o0 - len(lengths)} segments")


def check_dtype(rows: Rows, where: str, dtype: np.dtype):
    if rows.tokens.dtype.newbyteorder("=") != dtype.newbyteorder("="):
        raise ValueError(f"{where}: tokens are {rows.tokens.dtype}, the manifest says {dtype}")


def check_token_ids(rows: Rows, where: str, vocab_size: int):
    """Every token a row of this block holds is below `vocab_size` (one max over the block)."""
    used = rows.tokens[int(rows.token_starts[0]) : int(rows.token_starts[-1])] if len(rows) else rows.tokens[:0]
    if used.size and int(used.max()) >= vocab_size:
        raise ValueError(f"{where}: token id {int(used.max())} >= the vocabulary size {vocab_size} (corrupt shard: "
                         "rebuild it)")


def check_extras(rows: Rows, n_doc_ids: int, where: str, n_sources: int, values: bool = True, n_roles: int = 0):
    """A loss mask aligned with the tokens and holding only 0/1; source ids one per segment (doc_id),
    each below `n_sources` (the manifest's sources); role ids aligned with the tokens, each below
    `n_roles` (the manifest's role table). `values=False`: lengths only (O(1))."""
    if rows.loss_mask is not None:
        if len(rows.loss_mask) != len(rows.tokens):
            raise ValueError(f"{where}: {len(rows.loss_mask)} loss mask values for {len(rows.tokens)} tokens (corrupt shard)")
        if values and rows.loss_mask.size and int(rows.loss_mask.max()) > 1:
            raise ValueError(f"{where}: loss mask value {int(rows.loss_mask.max())}, expected 0 or 1 (corrupt shard)")
    if rows.source_ids is not None:
        if len(rows.source_ids) != n_doc_ids:
            raise ValueError(f"{where}: {len(rows.source_ids)} source ids for {n_doc_ids} segments (corrupt shard)")
        if values and rows.source_ids.size and int(rows.source_ids.max()) >= n_sources:
            raise ValueError(f"{where}: source id {int(rows.source_ids.max())}, but the manifest names {n_sources} "
                             "sources (corrupt shard, or the manifest's sources were edited)")
    if rows.role_ids is not None:
        if len(rows.role_ids) != len(rows.tokens):
            raise ValueError(f"{where}: {len(rows.role_ids)} role ids for {len(rows.tokens)} tokens (corrupt shard)")
        t0, t1 = int(rows.token_starts[0]), int(rows.token_starts[-1])
        used = rows.role_ids[t0:t1]
        if values and used.size and int(used.max()) >= n_roles:
            raise ValueError(f"{where}: role id {int(used.max())}, but the manifest's role table has {n_roles} roles "
                             "(corrupt shard, or the manifest's \"roles\" were edited; rebuild the dataset)")


def role_count(manifest: dict, where: str) -> int:
    """The number of roles of a manifest's "roles" table ({name: id}, ids 0..n-1), checked; 0 without one."""
    roles = manifest.get("roles")
    if roles is None:
        return 0
    if not isinstance(roles, dict) or sorted(roles.values()) != list(range(len(roles))) \
            or not all(isinstance(k, str) for k in roles):
        raise ValueError(f"{where}: the manifest's \"roles\" is not a table of role names to the ids 0..n-1 "
                         f"({str(roles)[:80]}; the manifest is damaged or edited: rebuild the dataset)")
    return len(roles)


def check_doc_ids(doc_ids: np.ndarray, where: str, n_docs: int | None):
    """Every doc_id is a document index of this build: 0 <= id < n_docs (the accepted documents)."""
    if n_docs is None or not len(doc_ids):
        return
    low, high = int(doc_ids.min()), int(doc_ids.max())
    if low < 0 or high >= n_docs:
        bad = low if low < 0 else high
        raise ValueError(f"{where}: doc_id {bad} outside [0, {n_docs}), the build's accepted documents (corrupt shard: "
                         "rebuild it)")


COUNTS = ("sequences", "tokens", "documents")  # what a shard entry says it holds


def check_counts(counts: dict, entry: dict, where: str):
    """The counts read from a shard's files equal its manifest entry's."""
    for key in COUNTS:
        if counts[key] != entry.get(key):
            raise ValueError(f"{where}: {counts[key]} {key}, the manifest says {entry.get(key)!r} (the manifest "
                             "was edited or the shard replaced; rebuild the dataset)")


def check_totals(counts: dict, totals: dict):
    """Sequences and tokens summed over the shards equal the manifest totals (sequences, tokens_out)."""
    for key, total_key in (("sequences", "sequences"), ("tokens", "tokens_out")):
        if counts[key] != totals.get(total_key):
            raise ValueError(f"{counts[key]} {key} in the shards, the manifest totals say {totals.get(total_key)!r} "
                             "(the manifest was edited or a shard entry dropped; rebuild the dataset)")


def manifest_problem(manifest: dict) -> str | None:
    """What is wrong with a (schema-valid) manifest on its own, or None: the shard entries' sequences,
    tokens and documents (segments) summed are the totals' sequences, tokens_out and pieces; the
    documents stored (docs_accepted less docs_dropped_long) are at most the pieces and none only when
    there are none; trained tokens at most tokens_out. So `shards: []` with totals that say
    otherwise is refused by every reader, not opened with 0 rows."""
    shards, totals = manifest["shards"], manifest["totals"]
    summed = {key: sum(int(entry.get(key) or 0) for entry in shards) for key in COUNTS}
    for key, total_key, word in (("sequences", "sequences", "sequences"), ("tokens", "tokens_out", "tokens"),
                                 ("documents", "pieces", "segments")):
        if total_key in totals and summed[key] != totals[total_key]:
            return (f"{summed[key]} {word} in the shards, the manifest totals say {totals[total_key]!r} {total_key} "
                    f"({len(shards)} shard entries)")
    stored = totals.get("docs_accepted", 0) - totals.get("docs_dropped_long", 0)
    pieces = totals.get("pieces", summed["documents"])
    if "docs_accepted" in totals and (stored < 0 or stored > pieces or (stored == 0) != (pieces == 0)):
        return (f"totals.docs_accepted less docs_dropped_long is {stored} documents, stored in {pieces} pieces "
                f"({len(shards)} shard entries): every stored document is at least one piece")
    if totals.get("trained_tokens", 0) > totals.get("tokens_out", summed["tokens"]):
        return f"totals.trained_tokens {totals['trained_tokens']} is more than tokens_out {totals.get('tokens_out')}"
    return None


def check_sums_rows(sums, n_rows: int, where: str):
    """A shard's checksums file (None: a shard of format version 1) covers exactly its `n_rows` rows."""
    if sums is not None and int(sums.rows[-1]) != n_rows:
        raise ValueError(f"{where}: its checksums file covers {int(sums.rows[-1])} rows, the shard holds {n_rows} "
                         "(a damaged checksums file; rebuild the dataset)")
