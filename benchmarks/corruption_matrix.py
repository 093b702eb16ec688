"""The corruption matrix (issues 17, 28): every file of a built dataset x every damage, against every
reader. Prints one row per case and a table of corruption class x reader.

    python benchmarks/corruption_matrix.py                 # arrow, memmap, megatron
    python benchmarks/corruption_matrix.py --formats memmap

Readers, and what each one's outcome is:
  verify          `verify_dataset` (full) + report.html's check: caught (ValueError) or PASSED
  open_dataset    open + every row read (ds.views, ds.mask_views)
  packed local    PackedDataset(DIR, shuffle=False), every item
  packed stream   the same dataset copied into an in-memory object store (memory://), streamed
  stats           `packer stats DIR` (CLI)
  inspect         `packer inspect DIR` and `packer inspect DIR --seq S --raw` for the first row of each shard
A reader *refused* (ValueError or OSError naming the file; a CLI: exit 1 with one `Error:` line), gave the
*same* output as on the undamaged dataset, or (a row reader, on a manifest edited to drop a shard and its
totals) a *prefix*: fewer rows, each the undamaged dataset's (a stats or inspect output of such a manifest
then *differs*, as it should). Anything else is a miss: WRONG (a row, or an output, unlike the undamaged
dataset's, without an error: silent wrong rows), TRACEBACK (another exception; a CLI: a traceback, or more
than one line) or HANG (nothing within HANG_SECONDS). A case is caught when no reader missed and verify
caught it (or the file is optional and verify passed: nothing is wrong with the data).

Damages: each file flipped (one byte in the middle; one in its first 64 bytes), truncated (to half),
deleted; a token of each shard changed inside the vocabulary (+1; its low bit flipped), where only a
checksum can tell; every file of shard 0 swapped for another build's (the same command with another
seed); the manifest with a shard entry listed twice, a shard entry dropped with the totals adjusted,
edited totals (sequences, tokens_out, docs_accepted), a shard name outside the directory (`../`,
absolute); and the whole dataset replaced by another build between PackedDataset's construction and its
iteration (the packed readers only).

Measured 2026-12-03 (busy 2-core box, ~8 min, arrow + memmap + megatron): 266 cases, all caught; silent
wrong rows 0, tracebacks 0, hangs 0. Every reader refused each damage to shard bytes (+1 on a token and a
flipped low bit included), the other readers gave the same rows for damage to files they do not read, and
for a manifest edited to drop a shard with its totals the row readers read a prefix (verify refuses it).
Main before block checksums (7d9bf52), memmap alone: 14 of 86 cases gave wrong rows silently through
open_dataset, PackedDataset (local and streamed) and inspect: each changed .bin byte that left the ids
inside the vocabulary. (The first full run found a CPython 3.11 SystemError in parallel .npy header
parsing: packer/store/formats/sidecars.py.)
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import sys
import tempfile
import traceback
from pathlib import Path

import numpy as np
from click.testing import CliRunner

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from packer.cli import main  # noqa: E402
from packer.config import BuildConfig, Job  # noqa: E402
from packer.io import fs, retry  # noqa: E402
from packer.preprocess.pipeline import build  # noqa: E402
from packer.stats.report import check_report  # noqa: E402
from packer.store.dataset import open_dataset  # noqa: E402
from packer.store.verify import verify_dataset  # noqa: E402

SAMPLE = ROOT / "sample_data"
CONTEXT, SHARD_SIZE = 512, 200_000
HANG_SECONDS = 60
READERS = ("verify", "open_dataset", "packed local", "packed stream", "stats", "inspect")
# Files a dataset may lack (datasets of packer before 2026-12 have none of them; state.json and
# dataset_info.json are only for datasets.load_from_disk): deleting one leaves a valid dataset.
OPTIONAL = {"report.html", "state.json", "dataset_info.json"}
# .packer-owned.json (packer/preprocess/owned.py) says which files of the directory packer wrote; any damage to
# it leaves the dataset valid (verify passes) and the next build in the directory refuses or re-adopts.


def _build(out: Path, fmt: str, seed: int = 0) -> Path:
    job = Job(inputs=(str(SAMPLE / "prose.jsonl"), str(SAMPLE / "code.jsonl")), tokenizer=str(SAMPLE / "tokenizer.json"),
              output=str(out), config=BuildConfig(context_length=CONTEXT, format=fmt, shard_size=SHARD_SIZE, seed=seed),
              workers=1)
    build(job, progress="off")
    return out


# -- damages --------------------------------------------------------------------------------


def _flip(at):
    def damage(path: Path):
        data = bytearray(path.read_bytes())
        data[at(len(data))] ^= 0xFF
        path.write_bytes(bytes(data))
    return damage


def _truncate(path: Path):
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


FILE_DAMAGES = {"flip middle byte": _flip(lambda n: n // 2), "flip header byte": _flip(lambda n: min(n - 1, 40)),
                "truncate": _truncate, "delete": Path.unlink}


def _token_offset(d: Path, entry: dict, fmt: str, itemsize: int) -> tuple[Path, int]:
    """(file, byte offset) of the token stream of a shard: its .bin, or the input_ids values of its
    Arrow file's first record batch (found by address in a map of the file)."""
    import pyarrow as pa
    import pyarrow.ipc as ipc

    file = d / entry["file"]
    if fmt != "arrow":
        return file, 0
    whole = pa.memory_map(str(file)).read_buffer()
    batch = next(iter(ipc.open_stream(pa.BufferReader(whole))))
    return file, batch.column("input_ids").values.buffers()[1].address - whole.address


def _token_damage(how):
    """Change the 37th token of a shard so that its id stays below the vocabulary."""
    def damage(d: Path, entry: dict, fmt: str, itemsize: int, vocab: int):
        file, at = _token_offset(d, entry, fmt, itemsize)
        data = bytearray(file.read_bytes())
        pos = at + 37 * itemsize
        old = int.from_bytes(data[pos : pos + itemsize], "little")
        new = how(old)
        new = new if 0 <= new < vocab else old - 1
        data[pos : pos + itemsize] = new.to_bytes(itemsize, "little")
        file.write_bytes(bytes(data))
    return damage


TOKEN_DAMAGES = {"+1 on a token": _token_damage(lambda t: t + 1), "token low bit flipped": _token_damage(lambda t: t ^ 1)}


def _manifest_edit(edit):
    def damage(d: Path):
        manifest = json.loads((d / "manifest.json").read_text())
        edit(manifest)
        (d / "manifest.json").write_text(json.dumps(manifest))
    return damage


def _drop_entry(m):
    gone = m["shards"].pop()
    m["totals"]["sequences"] -= gone["sequences"]
    m["totals"]["tokens_out"] -= gone["tokens"]
    m["totals"]["pieces"] -= gone["documents"]


def _set(key, delta):
    def edit(m):
        m["totals"][key] += delta
    return edit


def _rename(name):
    def edit(m):
        m["shards"][0]["file"] = name
    return edit


MANIFEST_DAMAGES = {
    "entry listed twice": lambda m: m["shards"].append(dict(m["shards"][0])),
    "entry dropped, totals adjusted": _drop_entry,
    "totals.sequences - 1": _set("sequences", -1),
    "totals.sequences + 1": _set("sequences", +1),
    "totals.tokens_out + 7": _set("tokens_out", 7),
    "totals.docs_accepted - 1": _set("docs_accepted", -1),
    "shard name ../": _rename("../../../../etc/passwd"),
    "shard name absolute": _rename("/etc/passwd"),
}


def _swap_shard(other: Path):
    def damage(d: Path):
        manifest = json.loads((other / "manifest.json").read_text())
        for key, value in manifest["shards"][0].items():
            if key.endswith("file") and (other / value).is_file():
                shutil.copyfile(other / value, d / value)
    return damage


# -- readers ----------------------------------------------------------------------------------


TRACEBACKS: list[str] = []  # printed at the end: what to fix


class Hang(Exception):
    pass


@contextlib.contextmanager
def _deadline(seconds: int):
    def alarm(*_):
        raise Hang()
    old = signal.signal(signal.SIGALRM, alarm)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def _outcome(read, want) -> str:
    """Run read() under the deadline: 'refused', 'same' (== want) or the miss."""
    try:
        with _deadline(HANG_SECONDS):
            got = read()
    except Hang:
        return "HANG"
    except (ValueError, OSError):  # a clear refusal naming the file (FileNotFoundError included)
        return "refused"
    except Exception as e:  # a crash instead of a clear refusal
        TRACEBACKS.append(traceback.format_exc())
        return f"TRACEBACK {type(e).__name__}"
    if isinstance(got, str) and got.startswith(("TRACEBACK", "refused")):
        return got
    if _equal(got, want):
        return "same"
    if isinstance(got, list) and got and isinstance(got[0], list) and 0 < len(got[0]) < len(want[0]) \
            and _equal(got, [w[: len(got[0])] for w in want]):
        return "prefix"
    return f"WRONG {_count_wrong(got, want)}"


def _equal(a, b) -> bool:
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b))
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return a is not None and b is not None and np.array_equal(a, b)
    return a == b


def _count_wrong(got, want) -> int:
    if isinstance(got, (list, tuple)) and isinstance(want, (list, tuple)) and got and isinstance(got[0], list):
        return sum(not _equal(g, w) for gs, ws in zip(got, want) for g, w in zip(gs, ws)) + abs(len(got[0]) - len(want[0]))
    return 1


def _rows(d) -> list:
    ds = open_dataset(d)
    idx = np.arange(len(ds))
    tokens, offsets = ds.views(idx)
    masks = ds.mask_views(idx) or []
    return [[t.copy() for t in tokens], [o.copy() for o in offsets], [m.copy() for m in masks]]


def _packed(path) -> list:
    from packer.data import PackedDataset

    items = list(PackedDataset(path, shuffle=False))
    return [[it["input_ids"].numpy() for it in items], [it["cu_seqlens"].numpy() for it in items],
            [it["labels"].numpy() for it in items]]


def _cli(args, d: Path, clean: Path) -> str:
    """A CLI command's output (the case's path written as the clean dataset's), or its miss."""
    result = CliRunner().invoke(main, [str(a) for a in args])
    lines = result.output.strip().splitlines()
    crashed = result.exception is not None and not isinstance(result.exception, SystemExit)
    if crashed or "Traceback" in result.output or result.exit_code not in (0, 1):
        return f"TRACEBACK in {args[0]}"
    if result.exit_code == 1:
        if len(lines) == 1 and lines[0].startswith("Error: "):
            raise ValueError(lines[0])
        return "TRACEBACK (not one line)"
    return result.output.replace(str(d), str(clean))


def _inspect(d: Path, clean: Path, shard_rows: list[int]) -> list:
    return [_cli(["inspect", d], d, clean)] + [_cli(["inspect", d, "--seq", r, "--raw"], d, clean) for r in shard_rows]


_STREAMED = [0]


def _streamed(d: Path) -> str:
    """The case's files copied into memory:// (a store read by ranged reads): its URI."""
    _STREAMED[0] += 1
    uri = f"memory://matrix/case-{_STREAMED[0]}"
    for file in sorted(d.iterdir()):
        if file.is_file():
            fs.upload(file, fs.location(uri) / file.name)
    return uri


def _verify(d: Path) -> str:
    try:
        with _deadline(HANG_SECONDS):
            verify_dataset(d)
            check_report(d)  # what `packer verify` adds: report.html against stats.json
        return "PASSED"
    except Hang:
        return "HANG"
    except (ValueError, FileNotFoundError):
        return "caught"
    except Exception as e:
        return f"TRACEBACK {type(e).__name__}"


def _readers(d: Path, clean: Path, want: dict, shard_rows) -> dict:
    return {"verify": _verify(d),
            "open_dataset": _outcome(lambda: _rows(d), want["rows"]),
            "packed local": _outcome(lambda: _packed(d), want["packed"]),
            "packed stream": _outcome(lambda: _packed(_streamed(d)), want["packed"]),
            "stats": _outcome(lambda: _cli(["stats", d], d, clean), want["stats"]),
            "inspect": _outcome(lambda: _inspect(d, clean, shard_rows), want["inspect"])}


def _replaced(clean: Path, other: Path, d: Path) -> dict:
    """The dataset replaced by another build between PackedDataset's construction and iteration."""
    from packer.data import PackedDataset

    out = {}
    for reader, where in (("packed local", None), ("packed stream", "stream")):
        shutil.rmtree(d, ignore_errors=True)
        shutil.copytree(clean, d)
        path = _streamed(d) if where else d
        try:
            packed = PackedDataset(path, shuffle=False)
        except Exception as e:
            out[reader] = f"TRACEBACK {type(e).__name__}"
            continue
        for file in sorted(other.iterdir()):  # another build moved in, as `packer build --overwrite` does
            if file.is_file():
                if where:
                    fs.upload(file, fs.location(path) / file.name)
                else:
                    shutil.copyfile(file, d / file.name)

        def read(packed=packed):
            items = list(packed)
            return [[it["input_ids"].numpy() for it in items]]
        out[reader] = _outcome(read, [[]])  # any item at all is a mix of two builds
    return out


ROW_READERS = ("open_dataset", "packed local", "packed stream")


def _settle(row: dict) -> dict:
    """A stats or inspect output of a manifest whose row readers all read a prefix differs, rightly."""
    if all(row[r] == "prefix" for r in ROW_READERS):
        for r in ("stats", "inspect"):
            row[r] = "differs" if row[r].startswith("WRONG") else row[r]
    return row


def _missed(row: dict, optional: bool) -> bool:
    caught_by_verify = row.get("verify", "caught") == "caught" or (optional and row.get("verify") == "PASSED")
    return not caught_by_verify or any(row[r].startswith(("WRONG", "TRACEBACK", "HANG")) for r in READERS if r in row)


def run(formats, smoke: bool = False) -> list[dict]:
    retry.BASE_SECONDS = 0.001  # a truncated object fails each read 6 times: waits of 3 s per read otherwise
    os.environ.setdefault("PACKER_REMOTE_ATTEMPTS", "6")  # the policy's default is a 60 s deadline per read
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        for fmt in formats:
            clean, other = _build(tmp / f"clean-{fmt}", fmt), _build(tmp / f"other-{fmt}", fmt, seed=1)
            manifest = json.loads((clean / "manifest.json").read_text())
            vocab, itemsize = manifest["tokenizer"]["vocab_size"], np.dtype(manifest["config"]["token_dtype"]).itemsize
            shard_rows = np.cumsum([0] + [e["sequences"] for e in manifest["shards"][:-1]]).tolist()
            want = {"rows": _rows(clean), "packed": _packed(clean), "stats": _cli(["stats", clean], clean, clean),
                    "inspect": _inspect(clean, clean, shard_rows)}
            cases = [(p.name, name, lambda d, p=p, damage=damage: damage(d / p.name))
                     for p in sorted(clean.iterdir()) if p.is_file() and p.name != ".packer.lock"
                     for name, damage in FILE_DAMAGES.items()]
            cases += [(entry["file"], name, lambda d, e=entry, damage=damage: damage(d, e, fmt, itemsize, vocab))
                      for entry in manifest["shards"] for name, damage in TOKEN_DAMAGES.items()]
            cases += [("shard N files", "swapped from another build", _swap_shard(other))]
            cases += [("manifest.json", name, _manifest_edit(edit)) for name, edit in MANIFEST_DAMAGES.items()]
            if smoke:  # every tenth case: a spread over the files and the damages, in a tenth of the time
                cases = cases[::10]
            for file, damage_name, damage in cases:
                d = tmp / "case"
                shutil.rmtree(d, ignore_errors=True)
                shutil.copytree(clean, d)
                damage(d)
                row = _settle({"format": fmt, "file": _shard_n(file), "damage": damage_name,
                               **_readers(d, clean, want, shard_rows)})
                # verify passes: nothing is wrong with the data (the record is the output directory's, not the
                # dataset's: a damaged one makes the next build refuse, tests/preprocess/test_ownership.py)
                optional = (damage_name == "delete" and file in OPTIONAL) or file == ".packer-owned.json"
                row["caught"] = not _missed(row, optional)
                results.append(row)
                _print(row)
            row = {"format": fmt, "file": "(all)", "damage": "dataset replaced after open",
                   **_replaced(clean, other, tmp / "case")}
            row["caught"] = not _missed(row, False) and all(row[r] == "refused" for r in ("packed local", "packed stream"))
            results.append(row)
            _print(row)
    return results


def _shard_n(name: str) -> str:
    return ("shard-N" + name[len("shard-00000"):]) if name.startswith("shard-") and name[6:11].isdigit() else name


def _print(row):
    cells = " ".join(f"{r} {row[r]:9}" for r in READERS if r in row)
    print(f"{row['format']:8} {row['file']:24} {row['damage']:30} {cells} {'ok' if row['caught'] else 'MISSED'}",
          flush=True)


def _class(row) -> str:
    """The corruption class of a case: its damage, and the file for file damages."""
    return f"{row['damage']}: {row['file']}" if row["damage"] in FILE_DAMAGES else row["damage"]


def table(results) -> str:
    """Corruption class x reader: cases, and per reader how many were refused, same, ... (any miss shows
    as WRONG, TRACEBACK or HANG)."""
    classes: dict[str, list] = {}
    for row in results:
        classes.setdefault(_class(row), []).append(row)
    lines = ["| class | cases | " + " | ".join(READERS) + " |", "|---" * (len(READERS) + 2) + "|"]
    for name, rows in classes.items():
        cells = []
        for r in READERS:
            got = [row[r] for row in rows if r in row]
            if not got:
                cells.append("-")
                continue
            counts = {}
            for g in got:
                g = {"caught": "refused", "PASSED": "passed"}.get(g, g)
                counts[g] = counts.get(g, 0) + 1
            cells.append(", ".join(f"{n} {g}" for g, n in sorted(counts.items())))
        lines.append(f"| {name} | {len(rows)} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main_() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--formats", default="arrow,memmap,megatron")
    parser.add_argument("--smoke", action="store_true", help="the smallest run (seconds; tests/test_benchmarks.py runs it)")
    args = parser.parse_args()
    results = run(["arrow"] if args.smoke else args.formats.split(","), smoke=args.smoke)
    for text in TRACEBACKS:
        print(text, file=sys.stderr)
    print()
    print(table(results))
    misses = {kind: sum(row[r].startswith(kind) for row in results for r in READERS if r in row)
              for kind in ("WRONG", "TRACEBACK", "HANG")}
    verify_missed = sum(not row["caught"] for row in results) - sum(
        any(row[r].startswith(("WRONG", "TRACEBACK", "HANG")) for r in READERS if r in row) for row in results)
    print(f"\n{len(results)} cases; silent wrong rows (reader x case) {misses['WRONG']}, tracebacks {misses['TRACEBACK']}, "
          f"hangs {misses['HANG']}, passed by verify {verify_missed}; caught {sum(r['caught'] for r in results)}")
    return 0 if all(r["caught"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main_())
