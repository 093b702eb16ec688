"""A huge JSON line's long strings decoded in place: its object with each long string a Utf8Text over the line's own bytes.

    line  {"id": 7, "text": "<200 MB, escaped: \\n \\" \\u00e9 ...>"}        (a bytearray, the only copy)
      -> {"id": 7, "text": Utf8Text(line[10:10 + n])}    the string's JSON escapes undone where it lies

A long string nested in the object (a chat's message content: {"messages": [{"content": "<...>"}]})
is decoded in place the same way.

The object's structure is parsed by json from a skeleton of the line in which each string over
LONG_STRING_BYTES stands as a short placeholder; each long string is then decoded by json too, a
window at a time, and written back over its own escaped bytes (never longer than them), so the
document costs its line and nothing more: no Python str of it, no second copy.

Anything unusual is left to the reader's ordinary path (None is returned and the line is left as
it came): a line that does not start with "{", is not strict UTF-8, holds a \\ud800-\\udfff escape
(surrogate pairs, lone surrogates) or \\u0000 (the placeholders' mark), a long string used as a
key, or any line json would refuse. So what comes back is exactly what
json.loads gives for the line, long strings as their UTF-8 bytes.
"""

from __future__ import annotations

import json

from packer.io.utf8 import HugeRecord, Utf8Text, valid_utf8

LONG_STRING_BYTES = 1 << 20  # a string this long is decoded in place (smaller ones go through the skeleton)
WINDOW_BYTES = 1 << 22  # decoded this much at a time
_MARK = "\x00"  # a placeholder's first character: no decoded string holds one without a \u0000 escape


def huge_record(line: bytearray, keys=None) -> HugeRecord | None:
    """The JSON object on `line` (one line, optionally ending in a newline) with its long strings, at
    any depth, as Utf8Text decoded in place, or None, the line untouched, where the ordinary path
    must decide (module docstring). `keys`: decode only the long strings under these top-level keys
    (others keep a placeholder: a texts reader wants one field); None: every one."""
    if not isinstance(line, bytearray) or line[:1] != b"{":
        return None
    n = len(line) - line.endswith(b"\n")
    if b"\\ud" in line or b"\\uD" in line or b"\\u0000" in line or not (line.isascii() or valid_utf8(line)):
        return None
    spans = [(start, end) for start, end in _strings(line, n) if end - start - 2 > LONG_STRING_BYTES]
    if not spans:
        return None
    record = _parse_skeleton(line, n, spans)
    if record is None:
        return None
    if not all(_decode(line, start + 1, end - 1, write=False) is not None for start, end in spans):
        return None  # json would refuse the line (a bad escape, a raw control character)
    for key, value in record.items():
        if keys is None or key in keys:
            record[key] = _decoded(value, line, spans)
    return HugeRecord(record)


def _decoded(value, line: bytearray, spans):
    """`value` with each placeholder in it, at any depth, replaced by its string decoded in place."""
    if isinstance(value, str):
        if not value.startswith(_MARK):
            return value
        start, end = spans[int(value[1:])]
        return Utf8Text(memoryview(line)[start + 1:_decode(line, start + 1, end - 1, write=True)])
    if isinstance(value, dict):
        return {k: _decoded(v, line, spans) for k, v in value.items()}
    if isinstance(value, list):
        return [_decoded(v, line, spans) for v in value]
    return value


def _strings(line: bytearray, n: int):
    """(start, end) of each JSON string token of line[:n], quotes included, in order: a quote outside a
    string opens one, the next quote not escaped (after an even run of backslashes) closes it. A
    find per string and per escaped quote (an unterminated string ends the scan: json refuses it)."""
    p = 0
    while (start := line.find(b'"', p, n)) >= 0:
        q = start
        while True:
            q = line.find(b'"', q + 1, n)
            if q < 0:
                return
            b = q
            while line[b - 1] == 0x5C:  # the backslashes before it (the opening quote stops the walk)
                b -= 1
            if (q - b) % 2 == 0:
                break
        yield start, q + 1
        p = q + 1


def _parse_skeleton(line: bytearray, n: int, spans) -> dict | None:
    """json's object of the line with long string k replaced by the string "\\x00k", or None where json
    refuses it, it is no object, or a placeholder is a key."""
    parts, at = [], 0
    for k, (start, end) in enumerate(spans):
        parts += [bytes(line[at:start]), b'"\\u0000%d"' % k]
        at = end
    parts.append(bytes(line[at:n]))
    try:
        record = json.loads(b"".join(parts).decode("utf-8"))
    except (json.JSONDecodeError, RecursionError):
        return None
    if not isinstance(record, dict):
        return None
    todo = [record]
    while todo:  # no placeholder as a key
        item = todo.pop()
        if isinstance(item, dict) and any(k.startswith(_MARK) for k in item):
            return None
        todo += [v for v in (item.values() if isinstance(item, dict) else item) if isinstance(v, (dict, list))]
    return record


def _decode(line: bytearray, start: int, end: int, write: bool) -> int | None:
    """Decode the JSON string body line[start:end] a window at a time; with `write`, each window's
    UTF-8 is written back at the decoded end so far (it never passes the window it came from).
    The end of the decoded bytes, or None where json refuses a window."""
    view, w, r = memoryview(line), start, start
    while r < end:
        cut = _cut(line, r, end)
        try:
            data = json.loads('"' + str(view[r:cut], "utf-8") + '"').encode("utf-8")
        except (json.JSONDecodeError, UnicodeError):
            return None
        if write and (w != r or len(data) != cut - r):  # else the bytes are already what they decode to
            view[w:w + len(data)] = data
        w, r = w + len(data), cut
    return w


def _cut(line: bytearray, r: int, end: int) -> int:
    """Where the window from r ends: about WINDOW_BYTES on, never inside an escape (at most 6 bytes,
    \\uXXXX) nor inside a UTF-8 character."""
    cut = min(r + WINDOW_BYTES, end)
    if cut == end:
        return end
    while cut > r + 1 and (line[cut] & 0xC0) == 0x80:  # a continuation byte: back to its character's start
        cut -= 1
    last = line.rfind(b"\\", max(r, cut - 6), cut)
    if last >= 0:
        first = last
        while first > r and line[first - 1] == 0x5C:  # the run of backslashes it ends
            first -= 1
        if (last - first) % 2 == 0:  # an odd run: `last` starts an escape, which may reach past the cut
            cut = last
    return cut
