"""Retries of remote reads: a transient error is tried again with backoff until a deadline, a persistent one named in one line.

    attempt   1      2        3        4        5        6        7      8, 9, ...
    wait      -    0.1 s    0.2 s    0.4 s    0.8 s    1.6 s    3.2 s    5 s        (x a jitter in [0.5, 1])

A read is tried until it succeeds or DEADLINE_SECONDS (60 s) have passed, the wait doubling from
0.1 s and capped at 5 s: a throttling burst (S3 SlowDown, GCS 429, a 503 storm) of up to about
50 s is absorbed without ending a training epoch, and a store that is really gone is named in one
line once the deadline is spent (a refused connection: 20 to 23 tries in 60 s). A count of tries
may bound it too (PACKER_REMOTE_ATTEMPTS; none by default). These are the only retries: packer's
S3 filesystems are made with pyarrow's own retries off (packer/io/fs.py; its default, 3 tries with
its own backoff under each of these, made a persistent 503 take 39 s).

Each try has a timeout (TIMEOUT_SECONDS; a store slower than that is a failed try, not a stall:
the try runs in its own thread, left behind if it never answers). The S3 client is given the same
timeout (fs.py: its own default gave up on any answer whose first byte took over 3 s, whatever
this said). All are set by the environment, read at each read (so DataLoader workers, forked or
spawned, follow it):

    PACKER_REMOTE_DEADLINE=60   PACKER_REMOTE_TIMEOUT=30   (seconds)   PACKER_REMOTE_ATTEMPTS=  (tries; unset: no count)

Transient: any OSError (pyarrow raises OSError for network and HTTP 5xx errors; ConnectionError,
TimeoutError) except those that cannot heal by waiting: a missing object, a refused permission,
a directory. Those, and a read still failing at the deadline, raise OSError naming the file and
the byte range:

    OSError: s3://***@bucket/ds/shard-00003.bin bytes 1048576-2097152: read failed 21 times over
    58.1 s (OSError: AWS Error NETWORK_CONNECTION ...); check the store is reachable, then resume
    from the loader's state_dict

Retries do not nest: a retried call made inside a try of another (a manifest read inside a
retried open) runs once, and the outer policy decides.
"""

from __future__ import annotations

import dataclasses
import os
import random
import threading
import time

from packer.io.redact import redact, redact_text

ATTEMPTS = None  # no count of tries: the deadline bounds them
BASE_SECONDS = 0.1
MAX_WAIT_SECONDS = 5.0
TIMEOUT_SECONDS = 30.0  # one try: a 64 MiB block at ~2 MiB/s; a request that long is a stalled store
DEADLINE_SECONDS = 60.0  # all tries of one read


@dataclasses.dataclass(frozen=True)
class Policy:
    attempts: int | None = ATTEMPTS
    timeout: float = TIMEOUT_SECONDS
    deadline: float = DEADLINE_SECONDS


_ENV = (("PACKER_REMOTE_ATTEMPTS", "attempts", int), ("PACKER_REMOTE_TIMEOUT", "timeout", float),
        ("PACKER_REMOTE_DEADLINE", "deadline", float))


def policy() -> Policy:
    """The policy the environment sets (module docstring); ValueError naming a bad variable."""
    given = {}
    for var, field, kind in _ENV:
        text = os.environ.get(var)
        if text:
            try:
                value = kind(text)
            except ValueError:
                value = 0
            if not value > 0 or value != value or value == float("inf"):
                raise ValueError(f"{var}={text!r}: give a positive {'whole number' if kind is int else 'number of seconds'}")
            given[field] = value
    return Policy(**given)


class Shrunk(OSError):
    """The object itself is shorter than the range read (replaced or truncated in the store, not cut in
    transit): asking again cannot help, and a loader's replaced-dataset check should run at once."""


PERMANENT = (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError, Shrunk)


def is_transient(error: BaseException) -> bool:
    return isinstance(error, OSError) and not isinstance(error, PERMANENT)


def wait_seconds(attempt: int) -> float:
    """The wait before try `attempt + 1` (attempt 1 = the first failure): doubling, capped, jittered."""
    return min(MAX_WAIT_SECONDS, BASE_SECONDS * 2 ** (attempt - 1)) * random.uniform(0.5, 1.0)


def _cause(error: BaseException) -> str:
    text = redact_text(str(error)).splitlines()[0] if str(error) else ""
    return f"{type(error).__name__}: {text[:200]}" if text else type(error).__name__


_TRYING = threading.local()  # .active in the thread running a try: a retried call there runs once


def _timed(call, seconds: float):
    """call() in its own thread, waited for at most `seconds`: TimeoutError after that (the thread
    is left to finish or hang on its own; it holds only its own request)."""
    box: list = []

    def run():
        _TRYING.active = True
        try:
            box.append((True, call()))
        except BaseException as e:  # handed to the caller's thread
            box.append((False, e))

    thread = threading.Thread(target=run, daemon=True, name="packer-remote-read")
    thread.start()
    thread.join(seconds)
    if not box:
        raise TimeoutError(f"no answer in {seconds:.1f} s (PACKER_REMOTE_TIMEOUT)")
    ok, value = box[0]
    if ok:
        return value
    raise value


def retried(call, where, start: int | None = None, stop: int | None = None, on_error=None, reword: bool = True):
    """call() until it returns, retrying transient OSErrors (module docstring) within the
    environment's Policy (a timeout per try, a deadline for all, a count of tries if set); `where`
    (a location) and the byte range [start, stop) name what was read in the error. on_error(error),
    if given, runs after each failed try (to drop a broken file handle). A permanent error is
    raised reworded to name `where` (its type kept), or as it is with reword=False. Inside a try of
    another retried call, call() runs once: the outer policy retries."""
    if getattr(_TRYING, "active", False):
        return call()
    rule = policy()
    began = time.monotonic()
    attempt = 0
    while True:
        attempt += 1
        left = rule.deadline - (time.monotonic() - began)
        try:
            return _timed(call, max(min(rule.timeout, left), 0.001))
        except OSError as e:
            if on_error is not None:
                on_error(e)
            span = f" bytes {start}-{stop}" if start is not None else ""
            if not is_transient(e):
                if not reword:
                    raise
                error = type(e)(f"{redact(where)}{span}: {_cause(e)}; check the dataset's URI and credentials")
                error.where = redact(where)  # what a caller names: the file, never its credentials
                raise error from None
            wait = wait_seconds(attempt)
            spent = time.monotonic() - began
            if attempt == rule.attempts or spent + wait >= rule.deadline:
                tries = f"at most {rule.attempts} tries " if rule.attempts else "retried "
                raise OSError(f"{redact(where)}{span}: read failed {attempt} times over {spent:.1f} s "
                              f"({_cause(e)}; {tries}within {rule.deadline:g} s, each try at most "
                              f"{rule.timeout:g} s); check the store is reachable, then resume from the loader's "
                              "state_dict") from None
            time.sleep(wait)
