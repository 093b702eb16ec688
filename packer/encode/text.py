"""THE text path: documents -> token ids, for the build, `packer stats INPUT` and online packing.

    encode_texts(tok, ["hi there", "a"], dtype=np.uint16, eos_id=0)  ->  ids [530, 1146, 0, 65, 0], lengths [3, 2]

bos/eos are added here, one each per document (the tokenizer's own template never runs); a document
longer than PIECE_CHARS is encoded in pieces cut where byte-level BPE pre-tokenization cannot span
(so the pieces give the whole text's ids, in bounded tokenizer memory); a huge document read as
UTF-8 bytes (packer/io/utf8.py Utf8Text) is never made a whole str. The engine call itself is
packer/encode/engines/: `tok` is an engine's encoder (packer/encode/tokenizer.py load_encoder) or a `tokenizers.Tokenizer` (hf).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator

import numpy as np

from packer.encode.engines import hf
from packer.io.utf8 import Utf8Text

ENCODE_BATCH_DOCS = 1024
ENCODE_BATCH_CHARS = 1 << 20  # tokenizers holds ~500 bytes per token while encoding: bound the batch
PIECE_CHARS = 1 << 20  # longer documents are encoded in pieces of about this size


def _pieces(text: str, piece_chars: int):
    """Cut a long text before a single space between two non-spaces, about every piece_chars.

    For byte-level BPE (GPT-2 style pre-tokenization) no pre-token spans such a point, so the
    pieces encode to exactly the tokens of the whole text (tests/preprocess/test_tokenize.py checks it).
    A stretch with no such point within 64K characters is cut where it stands; a tail with none
    (the text ends within those 64K) stays whole."""
    start = 0
    while len(text) - start > piece_chars:
        match = _CUT.search(text, start + piece_chars, start + piece_chars + 65536)
        if match is None and start + piece_chars + 65536 >= len(text):
            break
        cut = match.start() if match else start + piece_chars
        yield text[start:cut]
        start = cut
    yield text[start:]


_CUT = re.compile(r"(?<=\S) (?=\S)")


def _utf8_pieces(text: Utf8Text, piece_chars: int):
    """_pieces of a text kept as UTF-8 bytes, decoding one window at a time: the same pieces as
    _pieces(str(text)) (each cut is searched in a window holding the next piece_chars + 64K
    characters, or the rest of the text), never the whole text as a str."""
    start, reach = 0, piece_chars + 65536  # byte offset of the next piece; characters a cut may need
    while start < text.n_bytes:
        n_bytes = reach + 4
        window, taken = text.window(start, n_bytes)
        while len(window) < reach and start + taken < text.n_bytes:  # multi-byte characters: widen it
            n_bytes *= 2
            window, taken = text.window(start, n_bytes)
        at_end = start + taken == text.n_bytes
        if at_end and len(window) <= piece_chars:
            yield window
            return
        match = _CUT.search(window, piece_chars, reach)
        if match is None and at_end and len(window) <= reach:  # no cut point before the end: the rest whole
            yield window
            return
        piece = window[: match.start() if match else piece_chars]
        yield piece
        start += len(piece.encode("utf-8"))


def encode_texts(tok, texts: list[str], *, dtype, eos_id: int | None = None, bos_id: int | None = None,
                 piece_chars: int = PIECE_CHARS) -> tuple[np.ndarray, np.ndarray]:
    """A batch of documents -> (flat ids of all of them in order, `dtype`; int64 length of each).

        texts ["hi there", "a <|endoftext|>"], eos_id 0, sample_data/tokenizer.json:
        ids      [530, 1146,  0,   65, 612, 92, 1100, 1297, 423,  92, 30,  0]    lengths [3, 9]
        tokens    hi   there  eos  a   " <" |   end   of    text  |   >   eos

    `tok` comes configured from load_tokenizer or configured_copy (packer/encode/tokenizer.py):
    "<|endoftext|>" in a text is text, nothing is truncated or padded. The tokenizer's own
    template is never applied (add_special_tokens=False): bos/eos are added here, one each per
    document. A text longer than `piece_chars` is encoded piece by piece (_pieces: the same
    tokens for byte-level BPE, bounded tokenizer memory)."""
    if any(isinstance(text, Utf8Text) or len(text) > piece_chars for text in texts):
        parts = list(encode_parts(tok, texts, dtype=dtype, eos_id=eos_id, bos_id=bos_id, piece_chars=piece_chars))
        return np.concatenate([ids for ids, _ in parts]), np.concatenate([n for _, n in parts])
    return _add_specials(*_encode_ids(tok, texts, dtype), eos_id, bos_id)


def encode_stream(tok, texts: Iterable[str], *, dtype, eos_id: int | None = None, bos_id: int | None = None,
                  piece_chars: int = PIECE_CHARS) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """encode_texts over a stream of documents, in batches of at most ENCODE_BATCH_DOCS documents
    or about ENCODE_BATCH_CHARS characters (bounded memory): yields (ids, lengths) per batch, each
    batch whole documents (a long one is a batch of its own, its pieces' ids joined)."""
    held = []  # the parts of a long document so far
    for ids, lengths in encode_parts(tok, texts, dtype=dtype, eos_id=eos_id, bos_id=bos_id, piece_chars=piece_chars):
        if not len(lengths):
            held.append(ids)
            continue
        if held:
            ids, held = np.concatenate([*held, ids]), []
        yield ids, lengths


def encode_parts(tok, texts: Iterable[str], *, dtype, eos_id: int | None = None, bos_id: int | None = None,
                 piece_chars: int = PIECE_CHARS) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """encode_stream for writers that append what they get (the unit files): the same ids in
    parts of bounded size, so a huge document's ids are never gathered in memory. Short documents
    come in batches (ids and lengths aligned); a document longer than piece_chars comes as one part
    per piece with no length, its length on its last part:

        texts ["a b", <a 3 MiB text>, "c"], bos none, eos 0, piece_chars 1 MiB
            -> ([ids of "a b", 0], [3]), (ids of piece 0, []), (ids of piece 1, []), (ids of piece 2, []),
               ([0], [n]), ([ids of "c", 0], [2])

    Concatenated, the parts' ids and lengths are encode_texts' (flat, lengths).

    An engine that encodes on threads of its own without the GIL (`submit_ids`: tiktoken) gets each
    batch as soon as it is read and is waited on only once the next batch is read: reading (JSON
    parsing, under the GIL) overlaps encoding, and no core idles at a batch's end."""
    batch, batch_chars, pending = [], 0, None  # pending: the batch being encoded, to be waited on
    for text in texts:
        if isinstance(text, Utf8Text) or len(text) > piece_chars:  # a Utf8Text is never made a str whole
            if batch:  # the documents before it first: order kept
                started = _start(tok, batch, dtype, eos_id, bos_id)
                yield from _waited(pending)
                pending, batch, batch_chars = started, [], 0
            yield from _waited(pending)
            pending = None
            yield from _long_parts(tok, text, dtype, eos_id, bos_id, piece_chars)
            del text  # not held while the reader reads the next document
            continue
        batch.append(text)
        batch_chars += len(text)
        if len(batch) >= ENCODE_BATCH_DOCS or batch_chars >= ENCODE_BATCH_CHARS:
            started = _start(tok, batch, dtype, eos_id, bos_id)  # started before the one before is waited on
            yield from _waited(pending)
            pending, batch, batch_chars = started, [], 0
    started = _start(tok, batch, dtype, eos_id, bos_id) if batch else None
    yield from _waited(pending)
    yield from _waited(started)


def _start(tok, texts: list[str], dtype, eos_id: int | None, bos_id: int | None):
    """A batch of short documents, encoding: a callable that gives its (ids, lengths); encoded here
    and now unless the engine submits it to threads of its own."""
    submit = getattr(tok, "submit_ids", None)
    if submit is None:
        done = _add_specials(*_encode_ids(tok, texts, dtype), eos_id, bos_id)
        return lambda: done
    wait = submit(texts, dtype)
    return lambda: _add_specials(*wait(), eos_id, bos_id)


def _waited(pending):
    if pending is not None:
        yield pending()


_NO_LENGTHS = np.zeros(0, dtype=np.int64)


def _encode_ids(tok, texts: list[str], dtype):
    """`tok`: an engine's encoder (packer/encode/engines load_encoder), or a configured
    `tokenizers.Tokenizer`, which the reference engine runs."""
    if hasattr(tok, "encode_ids"):
        return tok.encode_ids(texts, dtype)
    return hf.encode_batch(tok, texts, dtype)


def _long_parts(tok, text: str | Utf8Text, dtype, eos_id: int | None, bos_id: int | None, piece_chars: int):
    """One long document's parts: [bos], the ids of each piece, then [eos] with the document's length."""
    n = 0
    if bos_id is not None:
        yield np.array([bos_id], dtype=dtype), _NO_LENGTHS
        n += 1
    for piece in _utf8_pieces(text, piece_chars) if isinstance(text, Utf8Text) else _pieces(text, piece_chars):
        ids = _encode_ids(tok, [piece], dtype)[0]
        n += len(ids)
        yield ids, _NO_LENGTHS
    tail = np.array([] if eos_id is None else [eos_id], dtype=dtype)
    yield tail, np.array([n + len(tail)], dtype=np.int64)


def _add_specials(flat, lengths, eos_id: int | None, bos_id: int | None):
    """Insert bos/eos around every document in one numpy pass (no per-document Python lists)."""
    if bos_id is None and eos_id is None:
        return flat, lengths
    extra = (bos_id is not None) + (eos_id is not None)
    out = np.empty(len(flat) + extra * len(lengths), dtype=flat.dtype)
    new_lengths = lengths + extra
    ends = np.cumsum(new_lengths)
    starts = ends - new_lengths
    body = np.ones(len(out), dtype=bool)
    if bos_id is not None:
        out[starts] = bos_id
        body[starts] = False
    if eos_id is not None:
        out[ends - 1] = eos_id
        body[ends - 1] = False
    out[body] = flat
    return out, new_lengths
