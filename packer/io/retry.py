"""Retries of remote reads: a transient error is tried again with backoff, a persistent one named in one line.

    attempt   1      2        3        4        5        6
    wait      -    0.1 s    0.2 s    0.4 s    0.8 s    1.6 s     (x a jitter in [0.5, 1])

ATTEMPTS tries in all, so at most 3.1 s of waiting before a read is given up: long enough for a
dropped connection or an object store's throttling reply (S3 SlowDown, GCS 429), short enough
that a store that is really gone stops the training step in seconds, not minutes. (pyarrow's own
S3 client retries a request 3 times underneath; these retries are per read, above it.)

Transient: any OSError (pyarrow raises OSError for network and HTTP 5xx errors; ConnectionError,
TimeoutError) except those that cannot heal by waiting: a missing object, a refused permission,
a directory. Those, and a read that fails every attempt, raise OSError naming the file and the
byte range:

    OSError: s3://***@bucket/ds/shard-00003.bin bytes 1048576-2097152: read failed 6 times over
    2.9 s (OSError: AWS Error NETWORK_CONNECTION ...); check the store is reachable, then resume
    from the loader's state_dict
"""

from __future__ import annotations

import random
import time

from packer.io import fs

ATTEMPTS = 6
BASE_SECONDS = 0.1
MAX_WAIT_SECONDS = 5.0
PERMANENT = (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError)


def is_transient(error: BaseException) -> bool:
    return isinstance(error, OSError) and not isinstance(error, PERMANENT)


def wait_seconds(attempt: int) -> float:
    """The wait before try `attempt + 1` (attempt 1 = the first failure): doubling, capped, jittered."""
    return min(MAX_WAIT_SECONDS, BASE_SECONDS * 2 ** (attempt - 1)) * random.uniform(0.5, 1.0)


def _cause(error: BaseException) -> str:
    text = fs.redact_text(str(error)).splitlines()[0] if str(error) else ""
    return f"{type(error).__name__}: {text[:200]}" if text else type(error).__name__


def retried(call, where, start: int | None = None, stop: int | None = None, on_error=None):
    """call() until it returns, retrying transient OSErrors (module docstring); `where` (a location)
    and the byte range [start, stop) name what was read in the error. on_error(error), if given,
    runs after each failed try (to drop a broken file handle)."""
    began = time.monotonic()
    for attempt in range(1, ATTEMPTS + 1):
        try:
            return call()
        except OSError as e:
            if on_error is not None:
                on_error(e)
            span = f" bytes {start}-{stop}" if start is not None else ""
            if not is_transient(e):
                error = type(e)(f"{fs.redact(where)}{span}: {_cause(e)}; check the dataset's URI and credentials")
                error.where = fs.redact(where)  # what a caller names: the file, never its credentials
                raise error from None
            if attempt == ATTEMPTS:
                raise OSError(f"{fs.redact(where)}{span}: read failed {ATTEMPTS} times over "
                              f"{time.monotonic() - began:.1f} s ({_cause(e)}); check the store is reachable, then "
                              "resume from the loader's state_dict") from None
            time.sleep(wait_seconds(attempt))
