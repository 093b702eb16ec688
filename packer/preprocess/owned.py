"""Which files in an output directory are packer's: those a record lists with their size and sha256.

    OUTPUT/.packer-owned.json   {"version": 1,
                                 "files": {"manifest.json":     {"bytes": 2811, "sha256": "9f2c...", "mtime_ns": ...},
                                           "shard-00000.arrow": {...}, ...},
                                 "work": true,               packer made OUTPUT/_work (and so may delete it;
                                                             "removing" while it is deleted)
                                 "incoming": {...}}          only while a new dataset is being moved in

A file is packer's only when the record lists it and its bytes still have the recorded sha256
(hashed again only when its size or modification time differs from the record's): a user's file
with one of packer's names, or a packer file the user edited, is foreign, and is never deleted
or replaced; so is any symlink (packer makes none). `.packer.lock` and the record itself (with its
`.tmp<pid>` while it is saved) are the only names packer claims by name.

A build writes its new dataset into OUTPUT/_work/dataset/ and `publish` moves it in:

    1. record["incoming"] = every new file, saved        (from here a rerun rolls forward)
    2. hard-link the old dataset's files into             (the old dataset whole there, under the
       OUTPUT/_work/previous/, manifest.json last          same manifest: readers read it from there)
    3. move each new file in, manifest.json last,         (the new dataset is complete: readers
       replacing the old one in one rename                 read it from OUTPUT)
    4. delete the old files the new dataset did not replace, if still packer's, and previous/
    5. record["files"] = the new files, saved

so readers see the old dataset or the new one at every instant (packer/store/dataset.py
files_root), a kill at any step included, and a crash in steps 2-5 (links and renames, no new
bytes) is finished by the next packer command on the directory (`finish`). On an object store
(no links, no atomic replace) step 2 removes the old manifest.json instead: from then until step 3
ends the directory holds no complete dataset.

A directory built by a packer without this record is trusted as far as its manifest verifies:
each file the manifest lists with its sha256 (shards, tokenizer.json) and that has it, then, when
all do, manifest.json, a stats.json whose counts are the manifest's, a report.html that embeds that
stats.json, and state.json / dataset_info.json equal to what the shard entries give; `_work/` when
it holds a fingerprint, and a shard its `_work/shards/*.json` lists with its sha256.
"""

from __future__ import annotations

import errno
import html
import json
import os
import re

from packer.io import atomic, failpoints, fs, lock
from packer.store import formats
from packer.store.dataset import PREVIOUS
from packer.store.manifest import MANIFEST, REPORT, STATS, TOKENIZER, read_manifest, read_stats, sha256_file

RECORD = ".packer-owned.json"
WORK = "_work"
STAGED = "dataset"  # OUTPUT/_work/dataset/: the new dataset, before it is moved into OUTPUT
_CLAIMED = re.compile(rf"^({re.escape(lock.LOCK_NAME)}|{re.escape(RECORD)}(\.tmp\d+)?)$")


def empty() -> dict:
    return {"version": 1, "files": {}, "work": False}


def load(out) -> dict:
    """The record of `out`; derived from what a packer without records left (module docstring) when
    there is none; empty for a new directory."""
    path = out / RECORD
    if path.exists():
        try:
            record = json.loads(path.read_text(encoding="utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError):
            record = None
        if not isinstance(record, dict) or record.get("version") != 1 or not isinstance(record.get("files"), dict):
            raise ValueError(f"{fs.redact(path)} is not packer's record of the files it wrote; move it away (with the "
                             "files it may describe) or choose another --output")
        return record
    return _legacy(out) if out.is_dir() else empty()


def save(out, record: dict):
    """Write the record atomically; an empty one is removed, so a build that leaves nothing leaves no record."""
    if not record["files"] and not record["work"] and not record.get("incoming"):
        (out / RECORD).unlink(missing_ok=True)
        return
    atomic.write_json(out / RECORD, record)


def matches(path, entry) -> bool:
    """True when `path` holds the bytes `entry` records: same size, then the same sha256 (not hashed
    again when the modification time is the recorded one too)."""
    try:
        size, mtime_ns = fs.stamp(path)
    except OSError:
        return False
    if not isinstance(entry, dict) or entry.get("bytes", size) != size:
        return False
    if mtime_ns is not None and entry.get("mtime_ns") == mtime_ns:
        return True
    return sha256_file(path) == entry.get("sha256")


def _work_is_ours(work, record: dict) -> bool:
    """_work/ is packer's when the record says packer made it, and it holds packer's fingerprint
    (or nothing yet: a build stopped between making it and writing the fingerprint)."""
    if not record.get("work") or not work.is_dir():
        return False
    if record["work"] == REMOVING:  # a removal cut short: whatever is left was packer's
        return True
    return (work / "fingerprint.json").is_file() or not any(work.iterdir())


def foreign(out, record: dict) -> list[str]:
    """Names in `out` that are not packer's by `record`, sorted."""
    if not out.is_dir():
        return []
    found = []
    for p in out.iterdir():
        if _CLAIMED.match(p.name):
            continue
        if isinstance(p, os.PathLike) and p.is_symlink():
            ours = False  # packer makes no links: a link's target is someone's
        elif p.name == WORK:
            ours = _work_is_ours(p, record)
        else:
            entries = (record["files"].get(p.name), record.get("incoming", {}).get(p.name))
            ours = not p.is_dir() and any(e is not None and matches(p, e) for e in entries)
        if not ours:
            found.append(p.name)
    return sorted(found)


def clear_leftovers(out):
    """Remove the record's temporary copies a killed save left (the only temporary files packer
    writes in OUTPUT itself: everything else is written in _work/)."""
    if fs.is_remote(out) or not out.is_dir():
        return
    for p in out.iterdir():
        if p.name.startswith(RECORD + ".tmp") and _CLAIMED.match(p.name):
            p.unlink(missing_ok=True)


def claim_work(out, record: dict):
    """Record that packer makes OUTPUT/_work, before it is made."""
    if not record["work"]:
        record["work"] = True
        save(out, record)


REMOVING = "removing"  # record["work"] while _work/ is being deleted: what is left of it is not resumable


def remove_work(out, record: dict):
    """Delete OUTPUT/_work (packer's: `foreign` checked it), then say so in the record. The record
    says "removing" first, so a kill at any moment leaves a _work/ that is still packer's but never
    resumed from (half its files are gone): the next command finishes the removal (`_owned_record`)."""
    work = out / WORK
    if work.exists():
        if record["work"] != REMOVING:
            record["work"] = REMOVING
            save(out, record)
        for n, child in enumerate(sorted(work.iterdir())):
            failpoints.hit("remove-work", n)
            if child.is_dir():
                fs.rmtree(child)
            else:
                child.unlink(missing_ok=True)
        failpoints.hit("remove-work", -1)  # emptied, not yet removed
        fs.rmtree(work)
    if record["work"]:
        record["work"] = False
        save(out, record)


def _described(staged, manifest: dict) -> dict:
    """{name: {bytes, sha256}} of every file in `staged`, the shards' sha256 taken from the
    manifest (computed as they were written), the few small others hashed here."""
    known = {TOKENIZER: manifest["tokenizer"]["sha256"]}
    fmt = formats.manifest_format(manifest["config"])
    for files in formats.manifest_files(fmt, manifest["shards"]):
        known.update(files)
    files = {}
    for p in staged.iterdir():
        if atomic.is_tmp(p.name) or p.is_dir():
            continue
        files[p.name] = {"bytes": fs.size(p), "sha256": known.get(p.name) or sha256_file(p)}
    return dict(sorted(files.items()))


def publish(out, manifest: dict, record: dict):
    """Move the complete dataset in OUTPUT/_work/dataset/ into OUTPUT (the steps of the module
    docstring); `manifest` is the one written there."""
    record["incoming"] = _described(out / WORK / STAGED, manifest)
    save(out, record)
    finish(out, record)


def finish(out, record: dict):
    """Steps 2-5 of a publish, each skipped where done: a rerun after a crash in them completes them."""
    incoming = record.get("incoming")
    if not incoming:
        return
    staged = out / WORK / STAGED
    if (staged / MANIFEST).exists():  # the new manifest is not in yet: the one in OUTPUT is the old one
        if not _keep_previous(out):
            (out / MANIFEST).unlink(missing_ok=True)
    for n_moved, name in enumerate([n for n in incoming if n != MANIFEST] + [MANIFEST]):
        if (staged / name).exists():
            failpoints.hit("publish", n_moved)
            fs.move(staged / name, out / name)
    for name, entry in record["files"].items():
        if name not in incoming and matches(out / name, entry):
            (out / name).unlink()
    previous = out / PREVIOUS[0] / PREVIOUS[1]  # a RemotePath has no joinpath
    if previous.exists():
        fs.rmtree(previous)
    record["files"] = {name: {**entry, "mtime_ns": _mtime(out / name)} for name, entry in incoming.items()}
    del record["incoming"]
    save(out, record)
    if staged.is_dir() and not any(staged.iterdir()):
        fs.rmtree(staged)


def _keep_previous(out) -> bool:
    """Step 2 of a publish: the old dataset (every file beside its manifest.json in OUTPUT) hard-linked
    into OUTPUT/_work/previous/, manifest.json last, so it stays whole there while its files are
    replaced. True when it is there (or there is no old dataset); False where links cannot be made
    (an object store, a filesystem without them)."""
    if fs.is_remote(out):
        return False
    manifest = out / MANIFEST
    if not manifest.is_file():
        return True  # nothing to keep
    previous = out / PREVIOUS[0] / PREVIOUS[1]  # a RemotePath has no joinpath
    if (previous / MANIFEST).is_file():
        return True  # kept before a kill: the links are of the same files, none replaced yet
    if previous.exists():
        fs.rmtree(previous)  # a kill while linking: begin again
    previous.mkdir(parents=True)
    names = sorted(p.name for p in out.iterdir() if p.name != MANIFEST and not _CLAIMED.match(p.name)
                   and not atomic.is_tmp(p.name) and p.is_file() and not p.is_symlink())
    try:
        for n, name in enumerate([*names, MANIFEST]):
            failpoints.hit("publish-keep", n)
            os.link(out / name, previous / name)
    except OSError as e:
        if e.errno not in (errno.EPERM, errno.EXDEV, errno.ENOTSUP, errno.EMLINK):
            raise
        fs.rmtree(previous)
        return False
    return True


def _mtime(path):
    try:
        return fs.stamp(path)[1]
    except OSError:
        return None


def _legacy(out) -> dict:
    """The record a packer without records would have written, from what its manifest verifies."""
    record = empty()
    work = out / WORK
    if (work / "fingerprint.json").is_file():
        record["work"] = True
        _adopt_marked_shards(out, work, record)
    try:
        manifest = read_manifest(out / MANIFEST)
        fmt = formats.manifest_format(manifest["config"])
        listed = [f for files in formats.manifest_files(fmt, manifest["shards"]) for f in files]
        listed.append((TOKENIZER, manifest["tokenizer"]["sha256"]))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return record  # no manifest (or none packer could have written): nothing beside it is trusted
    verified = [(name, sha) for name, sha in listed if _adopt(out, name, sha, record)]
    if len(verified) < len(listed):
        return record
    _adopt(out, MANIFEST, sha256_file(out / MANIFEST), record)
    for name, data in formats.derived_files(fmt, manifest["shards"]).items():
        _adopt(out, name, _sha(data), record)
    stats = _legacy_stats(out, manifest)
    if stats is not None:
        _adopt(out, STATS, sha256_file(out / STATS), record)
        page = out / REPORT
        if page.is_file() and html.escape(json.dumps(stats, indent=2)) in page.read_text(encoding="utf-8", errors="replace"):
            _adopt(out, REPORT, sha256_file(page), record)
    return record


def _adopt(out, name: str, sha256, record: dict) -> bool:
    path = out / name
    if not isinstance(sha256, str) or not path.is_file() or sha256_file(path) != sha256:
        return False
    size, mtime_ns = fs.stamp(path)
    record["files"][name] = {"bytes": size, "sha256": sha256, "mtime_ns": mtime_ns}
    return True


def _adopt_marked_shards(out, work, record: dict):
    """Shards an unfinished build of an older packer wrote into OUTPUT, each listed with its sha256
    in its _work/shards/*.json."""
    try:
        fmt = formats.manifest_format(json.loads((work / "fingerprint.json").read_text(encoding="utf-8"))["config"])
        markers = sorted((work / "shards").iterdir()) if (work / "shards").is_dir() else []
        for marker in markers:
            if marker.name.endswith(".json"):
                for name, sha in formats.entry_files(fmt, json.loads(marker.read_text(encoding="utf-8"))):
                    _adopt(out, name, sha, record)
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return


def _legacy_stats(out, manifest: dict):
    """stats.json as an object when its counts are the manifest's (what verify checks), else None."""
    try:
        stats = read_stats(out / STATS)
        lengths, totals = stats["lengths"], manifest["totals"]
        same = (stats["context_length"] == manifest["config"]["context_length"]
                and lengths["documents"] == totals["docs_accepted"] and lengths["tokens"] == totals["tokens_in"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return stats if same else None


def _sha(data: bytes) -> str:
    import hashlib

    return hashlib.sha256(data).hexdigest()
