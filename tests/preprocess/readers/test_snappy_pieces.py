"""snappy_pieces decompresses a raw Snappy stream a piece at a time: exactly what pyarrow.decompress
gives for every stream pyarrow's compressor writes, or None (a copy across a cut, a stream cut off).

Pieces are cut at every block start here (PIECE_BYTES 1) and windows are 100 bytes, so elements,
literal lengths and copies meet a window's edge everywhere."""

from __future__ import annotations

import random

import pyarrow as pa
import pytest
from conftest import sample_texts

from packer.preprocess.readers.parquet import snappy_pieces


@pytest.fixture(autouse=True)
def small_pieces(monkeypatch):
    monkeypatch.setattr(snappy_pieces, "PIECE_BYTES", 1)
    monkeypatch.setattr(snappy_pieces, "WINDOW_BYTES", 100)


def _file(tmp_path, data: bytes, pad: bytes = b"PAR1"):
    """(an open file holding `data` between two pads, where it starts)."""
    path = tmp_path / "page.bin"
    path.write_bytes(pad + data + pad)
    return pa.OSFile(str(path)), len(pad)


def _inputs():
    rng = random.Random(0)
    prose = "\n".join(sample_texts()).encode()
    yield prose[:200_000]  # prose: literals and copies of every kind
    yield prose[:3 * 65536]  # ends at a block start
    yield bytes(rng.getrandbits(8) for _ in range(150_000))  # incompressible: long literals (4-byte lengths)
    yield b"ab" * 100_000  # one copy after another
    yield b"x"  # one literal, one block


def test_pieces_equal_pyarrows_whole_decompression(tmp_path):
    for data in _inputs():
        stream = pa.compress(data, codec="snappy", asbytes=True)
        f, at = _file(tmp_path, stream)
        with f:
            got = snappy_pieces.decompress(f, at, len(stream), len(data))
        assert got is not None and bytes(got) == data, len(data)


def test_pieces_of_the_default_size_too(tmp_path, monkeypatch):
    monkeypatch.setattr(snappy_pieces, "PIECE_BYTES", 3 * 65536)
    monkeypatch.setattr(snappy_pieces, "WINDOW_BYTES", 1 << 16)
    data = ("\n".join(sample_texts()) * 4).encode()[:1_000_003]
    stream = pa.compress(data, codec="snappy", asbytes=True)
    f, at = _file(tmp_path, stream)
    with f:
        assert bytes(snappy_pieces.decompress(f, at, len(stream), len(data))) == data


def _literal(data: bytes) -> bytes:
    n = len(data) - 1
    if n < 60:
        return bytes([n << 2]) + data
    return bytes([(59 + 3) << 2]) + n.to_bytes(3, "little") + data


def _copy(offset: int, length: int) -> bytes:
    return bytes([(length - 1) << 2 | 2]) + offset.to_bytes(2, "little")


def test_a_copy_across_a_cut_or_a_stream_cut_off_gives_none(tmp_path):
    block = bytes(random.Random(1).getrandbits(8) for _ in range(65536))
    across = bytes([0x8a, 0x80, 0x04]) + _literal(block) + _copy(100, 10)  # 65546 bytes, the copy from block 0
    assert pa.decompress(across, decompressed_size=65546, codec="snappy").to_pybytes() == block + block[-100:-90]
    within = bytes([0x8a, 0x80, 0x04]) + _literal(block) + _literal(b"01234") + _copy(3, 5)  # the copy from its own block
    assert pa.decompress(within, decompressed_size=65546, codec="snappy").to_pybytes() == block + b"0123423423"
    f, at = _file(tmp_path, within)
    with f:
        assert bytes(snappy_pieces.decompress(f, at, len(within), 65546)) == block + b"0123423423"
    for stream, size in ((across, 65546), (within[:-1], 65546), (within, 65547), (within, 65545)):
        f, at = _file(tmp_path, stream)
        with f:
            assert snappy_pieces.decompress(f, at, len(stream), size) is None, (len(stream), size)
