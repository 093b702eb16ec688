"""packer/store/verify.py and `packer verify`: the manifest is read once, so the files, the manifest they are
checked against and the report page checked beside them are of one generation, even if a publish lands while
verify runs."""

from __future__ import annotations

import shutil

from click.testing import CliRunner

from packer.cli import main
from packer.store import manifest as manifest_module
from packer.store.verify import verify_dataset, verify_generation


def _count_manifest_reads(monkeypatch) -> list:
    """Every parse of a manifest.json from here on, listed; a second one raises, as a publish that replaced the
    manifest between two reads would leave verify two generations to mix."""
    reads, parse = [], manifest_module.parse_json

    def counted(raw, file, fix):
        if file.name == manifest_module.MANIFEST:
            reads.append(file)
            if len(reads) > 1:
                raise AssertionError(f"{file} read again: another generation could be there by now")
        return parse(raw, file, fix)

    monkeypatch.setattr(manifest_module, "parse_json", counted)
    return reads


def test_packer_verify_reads_the_manifest_once(sample_dataset, tmp_path, monkeypatch):
    out = tmp_path / "ds"
    shutil.copytree(sample_dataset, out)
    assert (out / "report.html").is_file()  # so the page is checked, against the manifest read once
    reads = _count_manifest_reads(monkeypatch)
    result = CliRunner().invoke(main, ["verify", str(out), "--quick"])
    assert result.exit_code == 0 and result.output.startswith("ok:"), result.output
    assert len(reads) == 1
    page = (out / "report.html").read_text()
    (out / "report.html").write_text(page.replace("<h2>", "<h2>edited ", 1))
    reads.clear()
    result = CliRunner().invoke(main, ["verify", str(out), "--quick"])
    assert result.exit_code == 1 and "report.html: not the page" in result.output, result.output
    assert len(reads) == 1


def test_verify_generation_gives_the_manifest_and_directory_it_checked(sample_dataset):
    checked = verify_generation(sample_dataset, checksums=False)
    assert checked.root == sample_dataset
    assert checked.manifest == manifest_module.read_manifest(sample_dataset)
    assert checked.totals == verify_dataset(sample_dataset, checksums=False)
    assert checked.totals["sequences"] == checked.manifest["totals"]["sequences"]
