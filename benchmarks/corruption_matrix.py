"""The corruption matrix (issue 17): every file of a built dataset x every damage, against verify,
the loader and the CLI. Prints one row per case and a summary table (cases, caught, missed).

    python benchmarks/corruption_matrix.py                 # arrow, memmap, megatron
    python benchmarks/corruption_matrix.py --formats memmap

A case is *caught* when all of these hold:
  verify    `verify_dataset` (full) raises ValueError naming the problem;
  loader    `open_dataset` + reading every row raises ValueError, or yields only valid rows (1..context
            tokens, offsets rising from 0 to the row length, ids below the vocabulary, 0/1 masks);
  cli       `packer verify`, `packer inspect` and `packer stats` on it exit 1 with one `Error:` line
            (or succeed), never a traceback.
Damages: each file flipped (one byte in the middle, and one in the first 64 bytes), truncated (to
half), deleted (the optional report.html, state.json and dataset_info.json: verify must pass);
the manifest with a shard entry listed twice, a shard entry dropped with the totals
adjusted, edited totals (sequences, tokens_out, docs_accepted), a shard name outside the directory
(`../`, absolute).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np
from click.testing import CliRunner

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from packer.cli import main  # noqa: E402
from packer.config import BuildConfig, Job  # noqa: E402
from packer.preprocess.pipeline import build  # noqa: E402
from packer.stats.report import check_report  # noqa: E402
from packer.store.dataset import open_dataset  # noqa: E402
from packer.store.verify import verify_dataset  # noqa: E402

SAMPLE = ROOT / "sample_data"
# Files a dataset may lack (datasets of packer before 2026-12 have none of them; state.json and
# dataset_info.json are only for datasets.load_from_disk): deleting one leaves a valid dataset.
OPTIONAL = {"report.html", "state.json", "dataset_info.json"}
# .packer-owned.json (packer/preprocess/owned.py) says which files of the directory packer wrote; any damage to
# it leaves the dataset valid (verify passes) and the next build in the directory refuses or re-adopts.


def _build(out: Path, fmt: str) -> Path:
    job = Job(inputs=(str(SAMPLE / "prose.jsonl"), str(SAMPLE / "code.jsonl")), tokenizer=str(SAMPLE / "tokenizer.json"),
              output=str(out), config=BuildConfig(context_length=512, format=fmt, shard_size=60_000), workers=1)
    build(job, progress="off")
    return out


def _flip(at):
    def damage(path: Path):
        data = bytearray(path.read_bytes())
        i = at(len(data))
        data[i] ^= 0xFF
        path.write_bytes(bytes(data))
    return damage


def _truncate(path: Path):
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _delete(path: Path):
    path.unlink()


FILE_DAMAGES = {"flip middle byte": _flip(lambda n: n // 2), "flip header byte": _flip(lambda n: min(n - 1, 40)),
                "truncate": _truncate, "delete": _delete}


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


def _row_valid(tokens, offsets, mask, context: int, vocab: int) -> bool:
    n = len(tokens)
    offsets = np.asarray(offsets, np.int64)
    return (1 <= n <= context and offsets[0] == 0 and offsets[-1] == n and bool((np.diff(offsets) > 0).all())
            and (not n or int(np.max(tokens)) < vocab) and (mask is None or int(np.max(mask, initial=0)) <= 1))


def _loader(d: Path, context: int, vocab: int) -> str:
    """'refused' (ValueError), 'valid rows' (every row valid) or what went wrong."""
    try:
        ds = open_dataset(d)
        rows = np.arange(len(ds))
        tokens, offsets = ds.views(rows)
        masks = ds.mask_views(rows) or [None] * len(rows)
        bad = sum(not _row_valid(t, o, m, context, vocab) for t, o, m in zip(tokens, offsets, masks))
        return "valid rows" if not bad else f"YIELDED {bad} BAD ROWS"
    except (ValueError, FileNotFoundError):  # a clear refusal naming the file
        return "refused"
    except Exception as e:  # anything else is a miss: a crash instead of a clear refusal
        return f"CRASHED {type(e).__name__}"


def _cli_clean(d: Path) -> str:
    for command in (["verify", str(d)], ["inspect", str(d)], ["stats", str(d)]):
        result = CliRunner().invoke(main, command)
        lines = result.output.strip().splitlines()
        crashed = result.exception is not None and not isinstance(result.exception, SystemExit)
        if crashed or "Traceback" in result.output or result.exit_code not in (0, 1):
            return f"TRACEBACK in {command[0]}"
        if result.exit_code == 1 and not (len(lines) == 1 and lines[0].startswith("Error: ")):
            return f"NOT ONE LINE in {command[0]}"
    return "one line"


def _verify(d: Path) -> str:
    try:
        verify_dataset(d)
        check_report(d)  # what `packer verify` adds: report.html against stats.json
        return "PASSED"
    except (ValueError, FileNotFoundError):
        return "caught"
    except Exception as e:
        return f"CRASHED {type(e).__name__}"


def run(formats) -> list[dict]:
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        for fmt in formats:
            clean = _build(tmp / f"clean-{fmt}", fmt)
            manifest = json.loads((clean / "manifest.json").read_text())
            context, vocab = manifest["config"]["context_length"], manifest["tokenizer"]["vocab_size"]
            cases = [(p.name, name, damage) for p in sorted(clean.iterdir()) if p.is_file() and p.name != ".packer.lock"
                     for name, damage in FILE_DAMAGES.items()]
            cases += [("manifest.json", name, _manifest_edit(edit)) for name, edit in MANIFEST_DAMAGES.items()]
            for file, damage_name, damage in cases:
                d = tmp / "case"
                shutil.rmtree(d, ignore_errors=True)
                shutil.copytree(clean, d)
                damage(d / file) if file != "manifest.json" or damage_name in FILE_DAMAGES else damage(d)
                row = {"format": fmt, "file": file.replace("00000", "N").replace("00001", "N"), "damage": damage_name,
                       "verify": _verify(d), "loader": _loader(d, context, vocab), "cli": _cli_clean(d)}
                # verify passes: nothing is wrong with the data (the record is the output directory's, not the
                # dataset's: a damaged one makes the next build refuse, tests/preprocess/test_ownership.py)
                optional = (damage_name == "delete" and file in OPTIONAL) or file == ".packer-owned.json"
                row["caught"] = ((row["verify"] == "caught" or (optional and row["verify"] == "PASSED"))
                                 and row["loader"] in ("refused", "valid rows") and row["cli"] == "one line")
                results.append(row)
                print(f"{fmt:8} {row['file']:24} {damage_name:32} verify {row['verify']:8} loader {row['loader']:12} "
                      f"cli {row['cli']:10} {'ok' if row['caught'] else 'MISSED'}", flush=True)
    return results


def main_() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--formats", default="arrow,memmap,megatron")
    args = parser.parse_args()
    results = run(args.formats.split(","))
    print("\n| format | cases | caught | missed |\n|---|---|---|---|")
    for fmt in args.formats.split(","):
        rows = [r for r in results if r["format"] == fmt]
        caught = sum(r["caught"] for r in rows)
        print(f"| {fmt} | {len(rows)} | {caught} | {len(rows) - caught} |")
    missed = [r for r in results if not r["caught"]]
    print(f"| all | {len(results)} | {len(results) - len(missed)} | {len(missed)} |")
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main_())
