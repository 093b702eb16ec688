"""Ownership comes from packer's record of what it wrote, never from names: a user's file with one
of packer's names, or a packer file the user edited, is never deleted or replaced; --overwrite
keeps the old dataset whole until the new one is complete, through kills and a full disk."""

from __future__ import annotations

import json
import shutil
import signal
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import SAMPLE_INPUTS, TOKENIZER, run_packer, undated

from packer.cli import main
from packer.config import BuildConfig, Job
from packer.preprocess import owned, resume
from packer.preprocess.pipeline import build
from packer.store import formats
from packer.store.dataset import open_dataset
from packer.store.formats import FORMATS
from packer.store.verify import verify_dataset

REFUSED = "holds files packer did not write"


@pytest.fixture(scope="module")
def src(tmp_path_factory) -> str:
    """300 sample documents: two units of 64 kB, several shards at context 256."""
    path = tmp_path_factory.mktemp("src") / "in.jsonl"
    path.write_text("".join(open(SAMPLE_INPUTS[0], encoding="utf-8").readlines()[:300]), encoding="utf-8")
    return str(path)


def _job(src, out, **config) -> Job:
    return Job(inputs=(src,), tokenizer=TOKENIZER, output=str(out), workers=1,
               config=BuildConfig(**{"context_length": 256, "shard_size": 4000, "unit_bytes": 65536, **config}))


def _files(out: Path) -> dict[str, bytes]:
    return {str(p.relative_to(out)): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}


def _dataset(out: Path) -> dict[str, bytes]:
    """The dataset's files as a user compares them (no _work/, lock or record), the manifest without
    its timestamps."""
    files = {n: b for n, b in _files(out).items() if "/" not in n and n not in (owned.RECORD, ".packer.lock")}
    manifest = json.loads(files.pop("manifest.json"))
    manifest.pop("created_unix"), manifest.pop("build_seconds")
    files["manifest.json"] = json.dumps(manifest).encode()
    if "report.html" in files:
        files["report.html"] = undated(files["report.html"])
    return files


def _cli_build(src, out, *extra, fail_at=None):
    """`packer build` as a process (so a failpoint can SIGKILL it); (returncode, output)."""
    return run_packer(["build", src, "--tokenizer", TOKENIZER, "--output", str(out), "--context-length", "256",
                       "--shard-size", "4000", "--unit-bytes", "65536", "--workers", "1", *extra], failpoints=fail_at)


def _refused(run, *names):
    """The build failed with one line naming `names`, and did not tell the user to --overwrite."""
    assert run.exit_code == 1, run.output
    line = next(line for line in run.output.splitlines() if REFUSED in line)
    assert all(n in line for n in names) and "--overwrite" not in line and "Traceback" not in run.output, run.output


def _cli(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def test_packer_names_alone_make_no_file_packers(tmp_path):
    """Every format's shard names (and their temporary names), packer's other names: without a record
    listing them, all are foreign."""
    names = [name for fmt in FORMATS for _, _, name in formats.file_names(fmt, 3)] + sorted(formats.reserved())
    for name in names:
        (tmp_path / name).write_text("mine")
        (tmp_path / f"{name}.tmp123").write_text("mine")
    assert owned.foreign(tmp_path, owned.load(tmp_path)) == sorted({*names, *(f"{n}.tmp123" for n in names)})
    with pytest.raises(ValueError, match=REFUSED):
        resume.refuse_foreign(tmp_path)
    assert all((tmp_path / n).read_text() == "mine" for n in names)


def test_a_users_tokenizer_in_the_output_survives_overwrite(src, tmp_path):
    """The issue's reproduction: `cp tok/tokenizer.json d/; packer build x --tokenizer d/tokenizer.json
    --output d --overwrite` deleted the user's tokenizer, then failed reading it."""
    d = tmp_path / "d"
    d.mkdir()
    shutil.copy(TOKENIZER, d / "tokenizer.json")
    mine = (d / "tokenizer.json").read_bytes()
    run = _cli("build", src, "--tokenizer", d / "tokenizer.json", "--output", d, "--overwrite", "--workers", "1")
    _refused(run, "tokenizer.json")
    assert sorted(p.name for p in d.iterdir()) == ["tokenizer.json"] and (d / "tokenizer.json").read_bytes() == mine


@pytest.mark.parametrize("overwrite", [False, True])
def test_a_users_work_directory_survives(src, tmp_path, overwrite):
    out = tmp_path / "d"
    (out / "_work").mkdir(parents=True)
    (out / "_work" / "x").write_text("mine")
    run = _cli("build", src, "--tokenizer", TOKENIZER, "--output", out, "--workers", "1",
               *(["--overwrite"] if overwrite else []))
    _refused(run, "_work")
    assert _files(out) == {"_work/x": b"mine"}


def test_a_work_directory_with_a_fingerprint_packer_did_not_record_is_foreign(src, tmp_path):
    """A _work/ copied in beside a dataset (fingerprint and all) is not packer's: its record says it made none."""
    kept = tmp_path / "kept"
    build(_job(src, kept), keep_work=True)
    out = tmp_path / "d"
    build(_job(src, out))
    shutil.copytree(kept / "_work", out / "_work")
    before = _files(out)
    with pytest.raises(ValueError, match=r"holds files packer did not write \(_work\)"):
        build(_job(src, out), overwrite=True)
    assert _files(out) == before


def test_a_symlinked_work_directory_is_foreign(src, tmp_path):
    """A link is never packer's, even one to a _work/ packer made: deleting through it would reach elsewhere."""
    elsewhere = tmp_path / "elsewhere"
    build(_job(src, elsewhere), keep_work=True)
    out = tmp_path / "d"
    build(_job(src, out))
    (out / "_work").symlink_to(elsewhere / "_work")
    with pytest.raises(ValueError, match=r"holds files packer did not write \(_work\)"):
        build(_job(src, out, seed=1), overwrite=True)
    assert (elsewhere / "_work" / "fingerprint.json").is_file() and (out / "_work").is_symlink()


def test_a_users_stats_json_is_refused_not_replaced(src, tmp_path):
    out = tmp_path / "d"
    out.mkdir()
    (out / "stats.json").write_text('{"mine": true}')
    with pytest.raises(ValueError, match=r"holds files packer did not write \(stats.json\); packer never deletes"):
        build(_job(src, out))
    assert _files(out) == {"stats.json": b'{"mine": true}'}


def test_packer_run_refuses_a_users_report_html(src, tmp_path):
    out = tmp_path / "d"
    out.mkdir()
    (out / "report.html").write_text("<p>my notes</p>")
    job = tmp_path / "job.toml"
    job.write_text(f"inputs = [{json.dumps(src)}]\ntokenizer = {json.dumps(TOKENIZER)}\noutput = {json.dumps(str(out))}\n"
                   "workers = 1\n\n[config]\ncontext_length = 256\n")
    _refused(_cli("run", job), "report.html")
    assert _files(out) == {"report.html": b"<p>my notes</p>"}


@pytest.mark.parametrize("name", ["stats.json", "shard-00001.arrow", "manifest.json"])
def test_a_packer_file_the_user_edited_is_foreign(src, tmp_path, name):
    """Edited in place: appended to (stats, manifest), or one byte flipped at the same size (a shard)."""
    out = tmp_path / "d"
    build(_job(src, out))
    path = out / name
    data = bytearray(path.read_bytes())
    if name.startswith("shard-"):
        data[len(data) // 2] ^= 1
    else:
        data += b"\n"
    path.write_bytes(bytes(data))
    before = _files(out)
    for overwrite in (False, True):
        with pytest.raises(ValueError, match=rf"holds files packer did not write \({name}\)"):
            build(_job(src, out, seed=1), overwrite=overwrite)
    assert _files(out) == before


def test_a_users_file_put_where_packer_deleted_its_own_is_foreign(src, tmp_path):
    out = tmp_path / "d"
    build(_job(src, out))
    (out / "report.html").write_text("<p>my own report</p>")  # same name, the user's bytes
    with pytest.raises(ValueError, match=r"\(report.html\)"):
        build(_job(src, out))
    assert (out / "report.html").read_text() == "<p>my own report</p>"


def test_overwrite_deletes_only_recorded_files_and_the_record_follows(src, tmp_path):
    out = tmp_path / "d"
    first = build(_job(src, out))
    record = json.loads((out / owned.RECORD).read_text())
    assert sorted(record["files"]) == sorted(p.name for p in out.iterdir() if p.name != owned.RECORD)
    assert record["work"] is False and "incoming" not in record
    assert len(first["shards"]) > 3
    build(_job(src, out, format="memmap", shard_size=40_000), overwrite=True)  # fewer shards, other files
    names = sorted(p.name for p in out.iterdir())
    assert not any(n.endswith(".arrow") for n in names) and "state.json" not in names
    assert sorted(json.loads((out / owned.RECORD).read_text())["files"]) == [n for n in names if n != owned.RECORD]
    assert verify_dataset(out)["sequences"] == first["totals"]["sequences"]


def test_a_build_without_records_is_adopted_when_its_manifest_verifies(src, tmp_path):
    """A dataset of a packer without records (here: this one's, record removed) is trusted file by
    file as far as its manifest vouches: the rerun is 'already complete', the record comes back,
    and --overwrite then replaces it; a shard whose sha256 is not the manifest's is foreign."""
    out = tmp_path / "d"
    build(_job(src, out))
    record = json.loads((out / owned.RECORD).read_text())
    (out / owned.RECORD).unlink()
    assert build(_job(src, out))["already_complete"]
    adopted = json.loads((out / owned.RECORD).read_text())
    assert {n: e["sha256"] for n, e in adopted["files"].items()} == {n: e["sha256"] for n, e in record["files"].items()}
    build(_job(src, out, seed=3), overwrite=True)
    assert verify_dataset(out)["sequences"] > 0
    (out / owned.RECORD).unlink()
    (out / "stats.json").write_text('{"mine": 1}')
    assert owned.foreign(out, owned.load(out)) == ["report.html", "stats.json"]  # the page embeds other figures
    shard = out / "shard-00002.arrow"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 1
    shard.write_bytes(bytes(data))
    # one shard off its sha256: the manifest vouches for nothing but the files that still match it
    assert owned.foreign(out, owned.load(out)) == ["dataset_info.json", "manifest.json", "report.html",
                                                   "shard-00002.arrow", "state.json", "stats.json"]
    before = _files(out)
    with pytest.raises(ValueError, match=r"\(dataset_info.json, manifest.json, report.html, \.\.\.\)"):
        build(_job(src, out, seed=3), overwrite=True)
    assert _files(out) == before


def test_an_unreadable_record_is_refused(src, tmp_path):
    out = tmp_path / "d"
    out.mkdir()
    (out / owned.RECORD).write_text("not json")
    with pytest.raises(ValueError, match=r"\.packer-owned\.json is not packer's record of the files it wrote"):
        build(_job(src, out))
    assert _files(out) == {owned.RECORD: b"not json"}


@pytest.fixture(scope="module")
def fresh(src, tmp_path_factory) -> dict[str, bytes]:
    """The dataset of --seed 1, built uninterrupted into an empty directory."""
    out = tmp_path_factory.mktemp("fresh") / "d"
    build(_job(src, out, seed=1))
    return _dataset(out)


@pytest.mark.parametrize("fail_at", ["write:1=kill", "publish:3=kill",
                                     *(pytest.param(f, marks=pytest.mark.slow) for f in
                                       ("tokenize:1=kill", "write:1=enospc", "finalize:0=kill", "publish:0=kill"))])
def test_overwrite_cut_short_keeps_the_old_dataset_then_finishes(src, tmp_path, fresh, fail_at):
    """An --overwrite killed while it builds, or out of disk, leaves the old dataset as it was
    (`packer verify` passes); killed while moving the new one in, the next run finishes the move.
    Either way the same command then gives the bytes of a fresh build."""
    out = tmp_path / "d"
    code, log = _cli_build(src, out)
    assert code == 0, log
    old = _dataset(out)
    old_rows = _rows(out)
    code, log = _cli_build(src, out, "--seed", "1", "--overwrite", fail_at=fail_at)
    assert code != 0 and "Traceback" not in log, log
    if not fail_at.startswith("publish"):
        assert _dataset(out) == old
    assert _rows(out) == old_rows  # killed mid-publish too: the old dataset is read (from _work/previous/)
    assert _cli("verify", out).exit_code == 0
    code, log = _cli_build(src, out, "--seed", "1", "--overwrite")
    assert code == 0, log
    assert _dataset(out) == fresh and sorted(p.name for p in out.iterdir()) == sorted([*fresh, owned.RECORD])


def test_a_crash_while_moving_in_is_finished_by_any_next_command(src, tmp_path, fresh):
    """Killed mid-move, the directory holds part of the new dataset; the next build, even another
    command, first completes the move, then decides (here: refuses the other command)."""
    out = tmp_path / "d"
    assert _cli_build(src, out)[0] == 0
    code, log = _cli_build(src, out, "--seed", "1", "--overwrite", fail_at="publish:2=kill")
    assert code == -signal.SIGKILL and (out / "manifest.json").exists(), log  # the old one, until the new replaces it
    with pytest.raises(ValueError, match=r"built differently \(config\.seed: 1 there, 2 now\)"):
        build(_job(src, out, seed=2))
    assert _dataset(out) == fresh and verify_dataset(out)["sequences"] > 0


def _rows(out) -> list[tuple[list, list]]:
    """Every row of the dataset at `out` as a reader gets it (tokens, offsets)."""
    return [(tokens.tolist(), offsets.tolist()) for tokens, offsets in open_dataset(out)]


@pytest.mark.parametrize("fail_at", ["publish-keep:3=kill", "publish:2=kill",
                                     *(pytest.param(f, marks=pytest.mark.slow) for f in
                                       ("publish-keep:0=kill", "publish:0=kill", "publish:5=kill"))])
def test_a_reader_sees_the_old_dataset_until_the_new_one_is_complete(src, tmp_path, fresh, fail_at):
    """An --overwrite killed at any step of its publish (linking the old dataset aside, moving the
    new one in): open_dataset, verify and PackedDataset read the old dataset, whole, never nothing
    and never a mix; the next command finishes the move and readers get the new one."""
    out = tmp_path / "d"
    assert _cli_build(src, out)[0] == 0
    old_rows, old_generation = _rows(out), open_dataset(out).generation
    code, log = _cli_build(src, out, "--seed", "1", "--overwrite", fail_at=fail_at)
    assert code == -signal.SIGKILL, log
    assert _rows(out) == old_rows and open_dataset(out).generation == old_generation
    assert verify_dataset(out)["sequences"] == len(old_rows)
    assert _cli("inspect", out, "--seq", "0").exit_code == 0
    code, log = _cli_build(src, out, "--seed", "1", "--overwrite")
    assert code == 0, log
    assert _dataset(out) == fresh and _rows(out) != old_rows
    assert not (out / owned.WORK).exists()


def test_readers_during_a_publish_see_old_or_new_never_nothing(src, tmp_path, monkeypatch):
    """A reader opens the dataset before every step of an --overwrite's publish (each link, each
    move): every open succeeds, with the old rows until the manifest is replaced, the new after."""
    out = tmp_path / "d"
    build(_job(src, out))
    old_rows = _rows(out)
    seen = []

    def read_now(point, n):
        if point.startswith("publish"):
            seen.append(_rows(out))

    monkeypatch.setattr(owned.failpoints, "hit", read_now)
    build(_job(src, out, seed=1), overwrite=True)
    new_rows = _rows(out)
    assert new_rows != old_rows and len(seen) > 8
    assert all(rows in (old_rows, new_rows) for rows in seen)
    assert seen[0] == old_rows and seen[-1] == old_rows  # the manifest moves last: until then, the old dataset


def test_a_resumed_fresh_build_still_records_its_files(src, tmp_path, fresh):
    out = tmp_path / "d"
    code, _ = _cli_build(src, out, "--seed", "1", fail_at="write:1=kill")
    assert code == -signal.SIGKILL
    assert json.loads((out / owned.RECORD).read_text()) == {"version": 1, "files": {}, "work": True}
    assert sorted(p.name for p in out.iterdir()) == sorted([".packer.lock", "_work", owned.RECORD])  # shards wait in _work/
    assert (out / "_work" / "dataset" / "shard-00000.arrow").is_file()
    assert _cli_build(src, out, "--seed", "1")[0] == 0
    assert _dataset(out) == fresh


@pytest.mark.parametrize("point", ["remove-work:0", "remove-work:1", "remove-work:-1"])
def test_a_kill_while_work_is_removed_leaves_a_directory_the_same_command_finishes(src, tmp_path, point):
    """Killed while deleting _work/ after publishing: the dataset is complete and the same command
    reports it complete and removes what is left of _work/ (it was refused as foreign: issue 28)."""
    clean = tmp_path / "clean"
    assert _cli_build(src, clean)[0] == 0
    out = tmp_path / "ds"
    code, log = _cli_build(src, out, fail_at=f"{point}=kill")
    assert code == -signal.SIGKILL, log
    assert (out / owned.WORK).is_dir()  # the kill came mid-removal
    code, log = _cli_build(src, out)
    assert code == 0 and "already complete" in log, log
    assert not (out / owned.WORK).exists() and _dataset(out) == _dataset(clean)
    verify_dataset(out)
    code, log = _cli_build(src, out, "--seed", "1", "--overwrite", fail_at=f"{point}=kill")
    assert code == -signal.SIGKILL, log
    code, log = _cli_build(src, out, "--seed", "1", "--overwrite")
    assert code == 0 and not (out / owned.WORK).exists(), log
    verify_dataset(out)
