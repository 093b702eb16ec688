"""UTF-8 text as bytes: strict validity, lone surrogates, and huge documents kept as bytes (Utf8Text).

Readers hand a document over HUGE_TEXT_BYTES on as a Utf8Text; the encode path reads it a window at a time.
"""

from __future__ import annotations

import codecs

HUGE_TEXT_BYTES = 16 << 20  # a document this large is handed on as its UTF-8 bytes (Utf8Text), never a whole str


class Utf8Text:
    """A huge document kept as its UTF-8 bytes (any buffer: a bytearray, an Arrow string value), the
    form readers hand on for a text over HUGE_TEXT_BYTES instead of a str: a str of it would take 2
    or 4 bytes a character as soon as one character is past U+00FF (sample_data's prose has such),
    and copying the bytes into it doubles the peak. The encode path (packer/encode/text.py) reads
    it a window at a time; `str(t)` decodes it whole, for callers that want one.

        Utf8Text(b"caf\xc3\xa9 au lait")   len 12 (characters), window(0, 4) -> ("caf", 3): never half an é

    The bytes are valid UTF-8 (the reader checked: `valid_utf8`)."""

    WINDOW_BYTES = 1 << 22

    def __init__(self, data):
        self.data = memoryview(data).cast("B")
        self._n_chars: int | None = None

    @property
    def n_bytes(self) -> int:
        return len(self.data)

    def __len__(self) -> int:
        """Characters: bytes that are not UTF-8 continuation bytes (0b10xxxxxx), counted a window at a time."""
        if self._n_chars is None:
            import numpy as np

            n = 0
            for i in range(0, len(self.data), self.WINDOW_BYTES):
                chunk = np.frombuffer(self.data[i:i + self.WINDOW_BYTES], dtype=np.uint8)
                n += len(chunk) - int(np.count_nonzero((chunk & 0xC0) == 0x80))
            self._n_chars = n
        return self._n_chars

    def window(self, start: int, n_bytes: int) -> tuple[str, int]:
        """(the text of about n_bytes from byte `start` (a character start), the bytes it took): cut back
        to a character start, so a multi-byte character is never split."""
        end = min(start + n_bytes, len(self.data))
        while end < len(self.data) and end > start and (self.data[end] & 0xC0) == 0x80:
            end -= 1
        return str(self.data[start:end], "utf-8"), end - start

    def is_blank(self) -> bool:
        start = 0
        while start < len(self.data):
            text, n = self.window(start, self.WINDOW_BYTES)
            if not text.isspace():
                return False
            start += n
        return True

    def __str__(self) -> str:
        return str(self.data, "utf-8")


class HugeRecord(dict):
    """A record read from a huge line, whose long strings, at any depth, may be Utf8Text
    (packer/preprocess/readers/huge_json.py): the mark that lets the record kinds look for them in
    that record alone (packer/encode/records.py), not in every record of a build."""


def valid_utf8(data) -> bool:
    """Is `data` (any buffer) strict UTF-8 (no raw surrogates: CESU-8 is not)? Checked a window at a
    time, so a huge document is never decoded whole to find out."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    view = memoryview(data).cast("B")
    try:
        for i in range(0, len(view), Utf8Text.WINDOW_BYTES):
            decoder.decode(view[i:i + Utf8Text.WINDOW_BYTES])
        decoder.decode(b"", final=True)
    except UnicodeDecodeError:
        return False
    return True


def is_blank(text) -> bool:
    """Empty or only whitespace (str.isspace: Unicode's too): such a document is empty_text in every reader."""
    if isinstance(text, Utf8Text):
        return text.is_blank()
    return not text or text.isspace()


def encodable(text) -> bool:
    """Whether a str is valid UTF-8 when written (no lone surrogate, which JSON's \\ud800 escapes allow);
    a Utf8Text is (its reader checked its bytes)."""
    if isinstance(text, Utf8Text):
        return True
    try:
        text.encode("utf-8")
        return True
    except UnicodeEncodeError:
        return False
