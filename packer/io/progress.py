"""Progress of one build stage on stderr: a tqdm bar on a terminal, plain lines in a log, or nothing.

    terminal (stderr.isatty()):  tokenize:  43%|████▎     | 12.1M/28.0M [00:04<00:05, 2.9MB/s, 3,100 docs/s]
    log file / batch job:        tokenize: 12.1MB of 28.0MB (43%), 2.90MB/s, 3,100 docs/s, 4s
                                 (one line every INTERVAL seconds, and one when the stage ends)
    quiet:                       nothing

A job log thus gets whole lines, never tqdm's `\\r` redraws.
"""

from __future__ import annotations

import sys
import time

from tqdm import tqdm

INTERVAL = 5.0  # seconds between plain lines


def _size(n: float, unit: str) -> str:
    """12100000, "B" -> "12.1MB"; 1200000, "tok" -> "1.20M tok"."""
    return tqdm.format_sizeof(n, "B", 1000) if unit == "B" else f"{tqdm.format_sizeof(n, '', 1000)} {unit}"


class Progress:
    """`update(n, note)` adds n done of `total` (`unit`: "B" or "tok"); `note` is extra text (rates)."""

    def __init__(self, desc: str, total: int, unit: str, *, mode: str = "auto"):
        self.desc, self.total, self.unit, self.done, self.note = desc, total, unit, 0, ""
        if mode == "auto":
            mode = "bar" if sys.stderr.isatty() else "lines"
        self.mode, self.started = mode, time.monotonic()
        self.last_line = self.started
        self.bar = tqdm(total=total, unit=unit, unit_scale=True, desc=desc, leave=False) if mode == "bar" else None

    def elapsed(self) -> float:
        return max(time.monotonic() - self.started, 1e-9)

    def update(self, n: int, note: str = ""):
        self.done, self.note = self.done + n, note
        if self.bar is not None:
            self.bar.set_postfix_str(note, refresh=False)
            self.bar.update(n)
        elif self.mode == "lines" and time.monotonic() - self.last_line >= INTERVAL:
            self._line()

    def _line(self):
        self.last_line = time.monotonic()
        share = f" ({self.done / self.total:.0%})" if self.total else ""
        rate = _size(self.done / self.elapsed(), self.unit) + "/s"
        note = f", {self.note}" if self.note else ""
        print(f"{self.desc}: {_size(self.done, self.unit)} of {_size(self.total, self.unit)}{share}, {rate}{note}, "
              f"{self.elapsed():.0f}s", file=sys.stderr, flush=True)

    def __enter__(self):
        return self

    def __exit__(self, exc_type, *_):
        if self.bar is not None:
            self.bar.close()
        elif self.mode == "lines" and exc_type is None and self.done:
            self._line()  # the stage's last line: what it did in how long
