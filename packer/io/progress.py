"""Progress of one build stage on stderr: a tqdm bar on a terminal, plain lines in a log, or nothing.

    terminal (stderr.isatty()):  tokenize:  43%|████▎     | 12.1M/28.0M [00:04<00:05, 2.9MB/s, 3,100 docs/s]
    log file / batch job:        tokenize: 12.1MB of 28.0MB (43%), 2.90MB/s, 3,100 docs/s, 4s
                                 (one line FIRST second in, then one every INTERVAL seconds, whether
                                 a task finished or not, and one when the stage ends)
    resumed:                     tokenize: resumed: 12.1MB of 28.0MB (3 of 7 units) done by an earlier run
    quiet:                       nothing

A job log thus gets whole lines, never tqdm's `\\r` redraws. A stage whose first task takes a while
still shows it is running: the bar's clock is redrawn every TICK and a log gets its FIRST-second line.
Rates count only what this run did (`before`: the work an earlier run finished).
"""

from __future__ import annotations

import sys
import threading
import time

INTERVAL = 5.0  # seconds between plain lines
FIRST = 1.0  # seconds to a stage's first plain line
TICK = 1.0  # seconds between redraws of a bar that saw no update


def _tqdm():
    """tqdm, imported once a bar is drawn or a line printed: a quiet build does not load it (13 ms, 2026-12-05)."""
    from tqdm import tqdm

    return tqdm


def _size(n: float, unit: str) -> str:
    """12100000, "B" -> "12.1MB"; 1200000, "tok" -> "1.20M tok"."""
    sizeof = _tqdm().format_sizeof
    return sizeof(n, "B", 1000) if unit == "B" else f"{sizeof(n, '', 1000)} {unit}"


class Progress:
    """`update(n, note)` adds n done of `total` (`unit`: "B" or "tok"); `note` is extra text (rates).
    `before`: how much of `total` an earlier run finished (`before_note` says it in its units, e.g.
    "3 of 7 units"); it shows as done, and the rates leave it out."""

    def __init__(self, desc: str, total: int, unit: str, *, mode: str = "auto", before: int = 0, before_note: str = ""):
        self.desc, self.total, self.unit, self.before, self.done, self.note = desc, total, unit, before, before, ""
        if mode == "auto":
            mode = "bar" if sys.stderr.isatty() else "lines"
        self.mode, self.started = mode, time.monotonic()
        self._lock, self._stop = threading.Lock(), threading.Event()
        if before and mode != "off":
            note = f" ({before_note})" if before_note else ""
            print(f"{desc}: resumed: {_size(before, unit)} of {_size(total, unit)}{note} done by an earlier run",
                  file=sys.stderr, flush=True)
        self.bar = None
        if mode == "bar":
            self.bar = _tqdm()(total=total, initial=before, unit=unit, unit_scale=True, desc=desc, leave=False)
        self.last_line = self.started
        self._ticker = None
        if mode in ("bar", "lines"):
            self._ticker = threading.Thread(target=self._tick, name=f"progress-{desc}", daemon=True)
            self._ticker.start()

    def elapsed(self) -> float:
        return max(time.monotonic() - self.started, 1e-9)

    def update(self, n: int, note: str = ""):
        with self._lock:
            self.done, self.note = self.done + n, note
            if self.bar is not None:
                self.bar.set_postfix_str(note, refresh=False)
                self.bar.update(n)
            elif self.mode == "lines" and time.monotonic() - self.last_line >= INTERVAL:
                self._line()

    def _tick(self):
        """Redraw a bar every TICK seconds (its clock moves while the first task runs); give a log its
        FIRST-second line, then one every INTERVAL even while no task finishes."""
        while not self._stop.wait(TICK):
            with self._lock:
                if self._stop.is_set():
                    return
                if self.bar is not None:
                    self.bar.refresh()
                else:
                    since = time.monotonic() - self.last_line
                    if since >= INTERVAL or (self.last_line == self.started and self.elapsed() >= FIRST):
                        self._line()

    def _line(self):
        self.last_line = time.monotonic()
        share = f" ({self.done / self.total:.0%})" if self.total else ""
        rate = _size((self.done - self.before) / self.elapsed(), self.unit) + "/s"
        note = f", {self.note}" if self.note else ""
        print(f"{self.desc}: {_size(self.done, self.unit)} of {_size(self.total, self.unit)}{share}, {rate}{note}, "
              f"{self.elapsed():.0f}s", file=sys.stderr, flush=True)

    def __enter__(self):
        return self

    def __exit__(self, exc_type, *_):
        with self._lock:
            self._stop.set()
        if self._ticker is not None:
            self._ticker.join()
        if self.bar is not None:
            self.bar.close()
        elif self.mode == "lines" and exc_type is None and self.done > self.before:
            self._line()  # the stage's last line: what it did in how long
