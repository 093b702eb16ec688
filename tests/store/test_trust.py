"""Never trust a file blindly (issue 17, items 4-6): every file and figure of a dataset that verify
can check, manifest names confined to the dataset directory, and open_dataset cross-checking the
manifest against the shard files and never yielding a row past the context or an id past the
vocabulary. Each case damages a real build (the sample corpus, arrow, memmap and Megatron) the way
a user's disk, an editor or an attacker would, and asserts the one-line refusal; through the CLI
too, which must print one `Error:` line and no traceback."""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import struct

import numpy as np
import pytest
from click.testing import CliRunner
from conftest import attest, build_sample

from packer.cli import main
from packer.io import fs
from packer.store.dataset import open_dataset
from packer.store.formats import megatron, memmap
from packer.store.verify import QUICK_SKIPS, verify_dataset

FORMATS = ("arrow", "memmap", "megatron")
CONTEXT = 1024
VOCAB = 16384  # the sample tokenizer's


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """fmt -> a sample build in that format (several shards), made once; tests damage copies."""
    root = tmp_path_factory.mktemp("trust")
    for fmt in FORMATS:
        build_sample(root / fmt, format=fmt, shard_size=200_000, context_length=CONTEXT)
    return root


@pytest.fixture(params=FORMATS)
def ds_dir(request, built, tmp_path):
    out = tmp_path / request.param
    shutil.copytree(built / request.param, out)
    return out


def _manifest(d):
    return json.loads((d / "manifest.json").read_text())


def _write_manifest(d, manifest):
    (d / "manifest.json").write_text(json.dumps(manifest))


def _edit(d, edit):
    manifest = _manifest(d)
    edit(manifest)
    _write_manifest(d, manifest)


def _cli(*args) -> str:
    """Run `packer ARGS`; assert exit 1 with one `Error:` line and no traceback; return the line."""
    result = CliRunner().invoke(main, list(map(str, args)))
    lines = result.output.strip().splitlines()
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output and len(lines) == 1 and lines[0].startswith("Error: "), result.output
    return lines[0]


def _refused_everywhere(d, match: str, *, quick_too: bool = True):
    """verify (full and, unless told, --quick) and open_dataset refuse `d` with `match`; so do
    `packer verify` and `packer inspect`, in one line."""
    with pytest.raises(ValueError, match=f"{match}|sha256 does not match the manifest"):  # a damaged shard: its sha256
        verify_dataset(d)
    if quick_too:
        with pytest.raises(ValueError, match=match):
            verify_dataset(d, checksums=False)
    with pytest.raises(ValueError, match=match):
        open_dataset(d)
    _cli("verify", d)
    _cli("inspect", d)


# ---- 4. verify checks every file it knows and every figure it can recompute ----------------------


def test_a_whole_build_verifies_and_quick_says_what_it_skips(ds_dir):
    full = verify_dataset(ds_dir)
    assert full["skipped"] == [] and full["sequences"] == _manifest(ds_dir)["totals"]["sequences"]
    quick = verify_dataset(ds_dir, checksums=False)
    assert quick["skipped"] == list(QUICK_SKIPS) and "shard sha256" in quick["skipped"]
    assert {k: quick[k] for k in ("sequences", "tokens", "documents")} == {k: full[k] for k in ("sequences", "tokens", "documents")}


def test_a_swapped_or_missing_tokenizer_is_refused(ds_dir):
    tok = ds_dir / "tokenizer.json"
    data = json.loads(tok.read_text())
    data["model"]["vocab"] = dict(reversed(list(data["model"]["vocab"].items())))  # same size, other ids
    tok.write_text(json.dumps(data))
    for full in (True, False):
        with pytest.raises(ValueError, match="tokenizer.json: sha256 does not match the manifest's tokenizer.sha256"):
            verify_dataset(ds_dir, checksums=full)
    assert "tokenizer.sha256" in _cli("verify", ds_dir)
    tok.unlink()
    with pytest.raises(ValueError, match="tokenizer.json missing"):
        verify_dataset(ds_dir)
    assert "tokenizer.json missing" in _cli("verify", ds_dir)


@pytest.mark.parametrize("damage, match", [
    ("delete", "stats.json missing"),
    ("garbage", "stats.json: not readable JSON"),
    ("other build", "stats.json: lengths.documents 3893, the manifest says 3894"),
    ("other context", "stats.json: context_length 2048, the manifest says 1024"),
])
def test_stats_json_is_checked(ds_dir, damage, match):
    stats = ds_dir / "stats.json"
    if damage == "delete":
        stats.unlink()
    elif damage == "garbage":
        stats.write_bytes(b"\x00\xff{not json")
    else:
        figures = json.loads(stats.read_text())
        if damage == "other build":
            figures["lengths"]["documents"] -= 1
        else:
            figures["context_length"] = 2048
        stats.write_text(json.dumps(figures))
    with pytest.raises(ValueError, match=match):
        verify_dataset(ds_dir, checksums=False)
    _cli("verify", ds_dir)


@pytest.mark.parametrize("key, match", [
    ("sequences", "sequences in the shards, the manifest totals say"),
    ("tokens_out", "tokens in the shards, the manifest totals say"),
    ("pieces", "segments in the shards, the manifest totals say"),
    ("docs_accepted", "distinct documents in the shards"),
])
def test_edited_totals_are_refused_by_verify(ds_dir, key, match):
    _edit(ds_dir, lambda m: m["totals"].__setitem__(key, m["totals"][key] + 1))
    with pytest.raises(ValueError, match=match):
        verify_dataset(ds_dir, checksums=False)
    _cli("verify", ds_dir)


def test_a_dropped_shard_entry_with_totals_adjusted_is_refused(ds_dir):
    def drop_last(m):
        gone = m["shards"].pop()
        m["totals"]["sequences"] -= gone["sequences"]
        m["totals"]["tokens_out"] -= gone["tokens"]
        m["totals"]["pieces"] -= gone["documents"]

    _edit(ds_dir, drop_last)
    # the documents no longer fit in the pieces left (a check of the manifest alone: readers make it too),
    # else the shards hold fewer distinct documents than the totals say (verify's count)
    with pytest.raises(ValueError, match="every stored document is at least one piece|distinct documents in the shards"):
        verify_dataset(ds_dir)
    _cli("verify", ds_dir)


def test_a_shard_entry_listed_twice_is_refused(ds_dir):
    def twice(m):
        m["shards"].append(dict(m["shards"][0]))
        for key, total in (("sequences", "sequences"), ("tokens", "tokens_out"), ("documents", "pieces")):
            m["totals"][total] += m["shards"][0][key]

    _edit(ds_dir, twice)
    _refused_everywhere(ds_dir, "both name 'shard-00000")


@pytest.mark.parametrize("fmt", ["memmap", "megatron"])
def test_one_file_named_by_two_keys_is_refused(built, tmp_path, fmt):
    d = tmp_path / fmt
    shutil.copytree(built / fmt, d)
    _edit(d, lambda m: m["shards"][1].__setitem__("index_file", m["shards"][0]["index_file"]))
    _refused_everywhere(d, "both name 'shard-00000.idx'")


# ---- 5. names from a manifest resolve inside the dataset directory -------------------------------


@pytest.mark.parametrize("name, why", [
    ("../../../../etc/passwd", "a path"),
    ("..", "a path"),
    ("sub\\shard-00000.arrow", "a path"),
    ("C:shard-00000.arrow", "a path"),
    ("shard\x00.arrow", "a path"),
    ("tokenizer.json", "one of packer's own files"),
    ("manifest.json", "one of packer's own files"),
    ("", "not a file name"),
    (7, "is not of type 'string'"),
])
def test_manifest_names_outside_the_directory_are_refused(ds_dir, name, why):
    _edit(ds_dir, lambda m: m["shards"][0].__setitem__("file", name))
    # a name of another type is the manifest's schema's to refuse (packer/store/manifest_schema.json)
    _refused_everywhere(ds_dir, f"shard entry file=.*: {why}" if isinstance(name, str) else f"shards.0.file: 7 {why}")


def test_an_absolute_path_to_a_valid_shard_elsewhere_is_refused_unread(ds_dir, tmp_path):
    """The shard elsewhere is whole and matches its sha256, so only the name can refuse it; its
    bytes never reach the message."""
    first = _manifest(ds_dir)["shards"][0]["file"]
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    shutil.move(ds_dir / first, elsewhere / first)
    secret = b"SECRET-BYTES-" * 4
    (elsewhere / "passwd").write_bytes(secret)
    for target in (elsewhere / first, elsewhere / "passwd"):
        _edit(ds_dir, lambda m: m["shards"][0].__setitem__("file", str(target)))
        _refused_everywhere(ds_dir, "a path, not a plain file name")
        assert "SECRET" not in _cli("verify", ds_dir)


# ---- 6. opening cross-checks the manifest; reading never yields a bad row -------------------------


@pytest.mark.parametrize("change", [-1, +1])
def test_edited_total_sequences_are_refused_at_open(ds_dir, change):
    _edit(ds_dir, lambda m: m["totals"].__setitem__("sequences", m["totals"]["sequences"] + change))
    _refused_everywhere(ds_dir, "sequences in the shards, the manifest totals say")


@pytest.mark.parametrize("key", ["sequences", "tokens", "documents"])
def test_an_edited_entry_count_is_refused_at_open(ds_dir, key):
    """Totals adjusted to match: only the shard files themselves can tell."""
    def edit(m):
        m["shards"][0][key] -= 1
        total = {"sequences": "sequences", "tokens": "tokens_out", "documents": "pieces"}[key]
        m["totals"][total] -= 1

    _edit(ds_dir, edit)
    _refused_everywhere(ds_dir, f"shard-00000.* {key}, the manifest says")


def _longest_first(d, fmt) -> int:
    """Shard 0's index with row 0 made longer than the context, as a flipped .idx byte can: the
    bound between rows 0 and 1 moved to row 1's end (the .idx stays the right size, its sections
    consistent with each other and with the .bin). Returns row 0's new length."""
    idx = d / "shard-00000.idx"
    raw = bytearray(idx.read_bytes())
    if fmt == "memmap":
        _, n_rows, _ = memmap.read_header(idx)
        at = memmap.HEADER.size + 8  # token_starts[1]
        token_starts = np.frombuffer(bytes(raw), "<i8", 3, memmap.HEADER.size)
        struct.pack_into("<q", raw, at, int(token_starts[2]) - 1)  # row 0 takes all of row 1 but one token
        idx.write_bytes(bytes(raw))
        return int(token_starts[2]) - 1
    _, lengths, _, document_indices = megatron.read_index(idx)
    at = megatron.HEADER.size + 12 * len(lengths) + 8  # document_indices[1]
    struct.pack_into("<q", raw, at, int(document_indices[2]))  # row 0 takes row 1's segments; row 1 has none
    idx.write_bytes(bytes(raw))
    return int(np.sum(lengths[: document_indices[2]]))


@pytest.mark.parametrize("fmt", ["memmap", "megatron"])
def test_a_row_longer_than_the_context_is_refused_at_open(built, tmp_path, fmt):
    d = tmp_path / fmt
    shutil.copytree(built / fmt, d)
    length = _longest_first(d, fmt)
    attest(d)
    assert length > CONTEXT
    _refused_everywhere(d, f"row 0: {length} tokens.*longer than the context length {CONTEXT}")


def _flip_token(d, fmt, row: int, value: int):
    """Set the first token of row `row` of shard 0 to `value` in the stored bytes (sha256 stale)."""
    ds = open_dataset(d)
    tokens = ds[row][0]
    first = int(tokens[0])
    name = _manifest(d)["shards"][0]["file"]
    raw = bytearray((d / name).read_bytes())
    if fmt == "arrow":  # find the row's token bytes: its tokens are unlikely to repeat earlier
        at = raw.find(np.asarray(tokens[:8]).astype("<u2").tobytes())
    else:
        at = int(np.asarray(ds._blocks[0].token_starts)[row]) * 2
    assert at >= 0 and struct.unpack_from("<H", raw, at)[0] == first
    struct.pack_into("<H", raw, at, value)
    (d / name).write_bytes(bytes(raw))


def test_a_token_id_past_the_vocabulary_is_never_yielded(ds_dir):
    fmt = ds_dir.name
    _flip_token(ds_dir, fmt, 3, 65535)
    with pytest.raises(ValueError, match="sha256 does not match"):
        verify_dataset(ds_dir)
    with pytest.raises(ValueError, match=r"bytes \d+-\d+: checksum mismatch"):
        open_dataset(ds_dir)[3]
    attest(ds_dir)
    with pytest.raises(ValueError, match=f"token id 65535 >= the vocabulary size {VOCAB}"):
        verify_dataset(ds_dir)  # the checksums made to match: the id scan still catches it
    ds = open_dataset(ds_dir)  # opening reads no tokens: the block is checked at its first read
    with pytest.raises(ValueError, match=f"token id 65535 >= the vocabulary size {VOCAB}"):
        ds[3]
    with pytest.raises(ValueError, match="token id 65535"):
        open_dataset(ds_dir).views([0, 3])
    with pytest.raises(ValueError, match="token id 65535"):
        open_dataset(ds_dir).get_many([3])
    with pytest.raises(ValueError, match="token id 65535"):
        list(open_dataset(ds_dir))
    # rows of other shards stay readable
    last = len(ds) - 1
    assert len(open_dataset(ds_dir)[last][0]) > 0
    assert "token id 65535" in _cli("inspect", ds_dir, "--seq", 3, "--raw")


def test_broken_offsets_are_never_yielded_memmap(built, tmp_path):
    d = tmp_path / "memmap"
    shutil.copytree(built / "memmap", d)
    idx = d / "shard-00000.idx"
    _, n_rows, n_segments = memmap.read_header(idx)
    raw = bytearray(idx.read_bytes())
    first_offsets = memmap.HEADER.size + 8 * (2 * (n_rows + 1) + n_segments)
    struct.pack_into("<i", raw, first_offsets + 4, 5000)  # row 0's first boundary past its end
    idx.write_bytes(bytes(raw))
    attest(d)
    with pytest.raises(ValueError, match="row 0: offsets"):
        open_dataset(d)[0]


@pytest.mark.parametrize("fmt", ["memmap", "megatron"])
def test_a_doc_id_outside_the_build_is_never_used(built, tmp_path, fmt):
    """A flipped doc_id (found by the corruption matrix: `packer stats` tried to allocate terabytes
    for a bincount) is refused by verify, by a block's first read, by doc_ids(), and by the CLI."""
    d = tmp_path / fmt
    shutil.copytree(built / fmt, d)
    manifest = _manifest(d)
    if fmt == "memmap":  # doc_ids follow the header and the two int64[S+1] sections of the .idx
        path = d / manifest["shards"][0]["index_file"]
        n_rows = struct.unpack_from("<Q", path.read_bytes(), 16)[0]
        at = memmap.HEADER.size + 16 * (n_rows + 1)
    else:  # the .docids.npy sidecar: the first value after its header
        path = d / manifest["shards"][0]["doc_ids_file"]
        at = len(path.read_bytes()) - 8 * manifest["shards"][0]["documents"]
    raw = bytearray(path.read_bytes())
    struct.pack_into("<q", raw, at, 10**12)
    path.write_bytes(bytes(raw))
    attest(d)
    with pytest.raises(ValueError, match=r"doc_id 1000000000000 outside \[0, \d+\)"):
        verify_dataset(d, checksums=False)
    with pytest.raises(ValueError, match="doc_id 1000000000000 outside"):
        open_dataset(d)[0]
    with pytest.raises(ValueError, match="doc_id 1000000000000 outside"):
        open_dataset(d).doc_ids()
    assert "doc_id 1000000000000 outside" in _cli("stats", d)


def test_a_deleted_shard_file_is_refused_in_one_line_at_open(ds_dir):
    name = _manifest(ds_dir)["shards"][-1]["file"]
    (ds_dir / name).unlink()
    with pytest.raises(ValueError, match=f"shard missing: .*{name} \\(listed in the manifest\\)"):
        open_dataset(ds_dir)
    assert "shard missing" in _cli("verify", ds_dir)


def test_derived_files_are_checked_against_what_they_derive_from(ds_dir):
    """report.html is the page stats.json gives; an Arrow dataset's state.json / dataset_info.json
    are what its shard entries give: an edited one is caught (found by the corruption matrix)."""
    names = ["report.html"] + (["state.json", "dataset_info.json"] if ds_dir.name == "arrow" else [])
    for name in names:
        original = (ds_dir / name).read_bytes()
        (ds_dir / name).write_bytes(original.replace(b"e", b"E", 1))
        if name != "report.html":
            with pytest.raises(ValueError, match=f"{name}: not what this dataset's manifest gives"):
                verify_dataset(ds_dir, checksums=False)
        assert f"{name}: not" in _cli("verify", ds_dir, "--quick")
        (ds_dir / name).write_bytes(original)
    verify_dataset(ds_dir)
    assert CliRunner().invoke(main, ["verify", str(ds_dir)]).exit_code == 0


@pytest.mark.parametrize("damage, match", [
    (lambda text: text[: len(text) // 2], "not readable JSON"),
    (lambda text: "[1, 2]", "the top level: .1, 2. is not of type 'object'"),
    (lambda text: text.replace('"totals"', '"totalz"'), "'totals' is a required property"),
])
def test_a_damaged_manifest_is_refused_in_one_line(ds_dir, damage, match):
    path = ds_dir / "manifest.json"
    path.write_text(damage(path.read_text()))
    for read in (verify_dataset, open_dataset):
        with pytest.raises(ValueError, match=match):
            read(ds_dir)
    assert match.split(" ")[0] in _cli("inspect", ds_dir)


# ---- issue 35 item 5: verify checks at least what every reader checks ----------------------------


def _every_reader_refuses(d, match: str):
    """verify (full), open_dataset, PackedDataset, `packer verify`, `inspect` and `stats`: each one
    line matching `match`, none opening the dataset."""
    with pytest.raises(ValueError, match=match):
        verify_dataset(d)
    with pytest.raises(ValueError, match=match):
        open_dataset(d)
    pytest.importorskip("torch")
    from packer.data import PackedDataset

    with pytest.raises(ValueError, match=match):
        PackedDataset(d)
    for command in ("verify", "inspect", "stats"):
        assert re.search(match, _cli(command, d)), command


@pytest.mark.parametrize("zeroed", [(), ("sequences", "tokens_out"), ("sequences", "tokens_out", "pieces")])
def test_a_manifest_without_shards_whose_totals_disagree_is_refused_by_every_reader(ds_dir, zeroed):
    """`shards: []` (and totals zeroed to match it, in part): refused everywhere, never 0 rows."""
    def empty(m):
        m["shards"] = []
        for key in zeroed:
            m["totals"][key] = 0

    _edit(ds_dir, empty)
    _every_reader_refuses(ds_dir, r"manifest.json: .*(in the shards, the manifest totals say|every stored document)")


def _sums_row_bound(d, shard: int, bound: int, value: int):
    """Set row bound `bound` (-1: the last) of a shard's checksums file to `value`, and its sha256 in
    the manifest to match, so only the bound itself can tell."""
    manifest = _manifest(d)
    entry = manifest["shards"][shard]
    sums = d / entry["checksums_file"]
    raw = bytearray(sums.read_bytes())
    (n_blocks,) = struct.unpack_from("<Q", raw, 16)
    struct.pack_into("<q", raw, 24 + 8 * (bound % (n_blocks + 1)), value)
    sums.write_bytes(bytes(raw))
    entry["checksums_sha256"] = hashlib.sha256(raw).hexdigest()
    _write_manifest(d, manifest)
    return n_blocks


def test_a_checksums_file_covering_rows_the_shard_lacks_is_refused_by_verify_and_readers(ds_dir):
    """The last row bound 10^12 (sha256 updated): verify passed it while every reader refused it."""
    _sums_row_bound(ds_dir, -1, -1, 10**12)
    match = r"checksums file (covers|says) 1000000000000|holds \d+ rows, its checksums file says 1000000000000"
    _every_reader_refuses(ds_dir, match)


@pytest.mark.parametrize("fmt", ["memmap", "megatron"])
def test_checksummed_blocks_off_the_rows_are_refused_by_verify_as_by_the_streaming_reader(built, tmp_path, fmt):
    """An inner row bound moved by one (sha256 updated): the local reader maps the shard whole and
    never looks, the streaming reader refuses it at open; verify runs the streaming reader's check."""
    d = tmp_path / fmt
    shutil.copytree(built / fmt, d)
    n_blocks = _sums_row_bound(d, 0, 1, 1)  # block 1 starts at row 1: not where its bytes start
    assert n_blocks > 2
    streamed = fs.location("memory://trust-" + fmt)
    streamed.mkdir(exist_ok=True)
    for file in sorted(d.iterdir()):
        if file.is_file():
            fs.upload(file, streamed / file.name)
    match = "blocks do not lie on the index's rows"
    with pytest.raises(ValueError, match=match):
        open_dataset(streamed)
    with pytest.raises(ValueError, match=match):
        verify_dataset(d)
    assert match in _cli("verify", d)
