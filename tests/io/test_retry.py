"""Retries of remote reads: transient errors retried with doubling waits, bounded; a permanent or a
persistent one raised once, naming the file and the byte range, never a credential."""

from __future__ import annotations

import pytest

from packer.io import fs, retry

WHERE = fs.location("s3://KEY:SECRET@bucket/ds/shard-00001.bin?region=x")


@pytest.fixture(autouse=True)
def no_waiting(monkeypatch):
    waits = []
    monkeypatch.setattr(retry.time, "sleep", waits.append)
    return waits


def _failing(n_failures, error):
    calls = []

    def call():
        calls.append(1)
        if len(calls) <= n_failures:
            raise error
        return b"data"

    return call, calls


def test_waits_double_from_a_tenth_of_a_second_and_are_capped():
    for attempt, nominal in [(1, 0.1), (2, 0.2), (3, 0.4), (4, 0.8), (5, 1.6), (10, retry.MAX_WAIT_SECONDS)]:
        waits = [retry.wait_seconds(attempt) for _ in range(200)]
        assert nominal * 0.5 <= min(waits) and max(waits) <= nominal and max(waits) - min(waits) > nominal * 0.2


def test_transient_errors_are_retried_until_the_read_succeeds(no_waiting):
    call, calls = _failing(retry.ATTEMPTS - 1, ConnectionResetError("connection reset by peer"))
    dropped = []
    assert retry.retried(call, WHERE, 0, 4, on_error=dropped.append) == b"data"
    assert len(calls) == retry.ATTEMPTS and len(dropped) == retry.ATTEMPTS - 1 and len(no_waiting) == retry.ATTEMPTS - 1
    assert sum(no_waiting) <= 3.1  # the stated bound on waiting


def test_a_persistent_error_names_file_range_attempts_and_cause(no_waiting):
    call, calls = _failing(99, OSError("AWS Error NETWORK_CONNECTION during GetObject on s3://KEY:SECRET@bucket/x"))
    with pytest.raises(OSError) as e:
        retry.retried(call, WHERE, 1048576, 2097152)
    message = str(e.value)
    assert message.startswith("s3://***@bucket/ds/shard-00001.bin?region=x bytes 1048576-2097152: read failed 6 times")
    assert "NETWORK_CONNECTION" in message and "SECRET" not in message and "\n" not in message
    assert len(calls) == retry.ATTEMPTS


@pytest.mark.parametrize("error", [FileNotFoundError("gone"), PermissionError("AccessDenied")])
def test_errors_that_waiting_cannot_heal_are_raised_at_once(error, no_waiting):
    call, calls = _failing(99, error)
    with pytest.raises(type(error), match=r"shard-00001.bin\?region=x bytes 0-8: .*check the dataset's URI") as e:
        retry.retried(call, WHERE, 0, 8)
    assert len(calls) == 1 and not no_waiting and e.value.where == "s3://***@bucket/ds/shard-00001.bin?region=x"


def test_other_exceptions_pass_through_untouched():
    call, calls = _failing(99, ValueError("not a packer index file"))
    with pytest.raises(ValueError, match="not a packer index file"):
        retry.retried(call, WHERE)
    assert len(calls) == 1
