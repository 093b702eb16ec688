"""Retries of remote reads: transient errors retried with doubling, capped, jittered waits until the
deadline; a permanent or a persistent one raised once, naming the file and the byte range, never a
credential. Time here is a fake clock that only the waits advance."""

from __future__ import annotations

import types

import pytest

from packer.io import fs, retry

WHERE = fs.location("s3://KEY:SECRET@bucket/ds/shard-00001.bin?region=x")


@pytest.fixture(autouse=True)
def no_waiting(monkeypatch):
    """The waits asked for; the clock retry reads advances by them and by nothing else."""
    waits = []
    monkeypatch.setattr(retry, "time", types.SimpleNamespace(sleep=waits.append, monotonic=lambda: sum(waits)))
    for var in ("PACKER_REMOTE_ATTEMPTS", "PACKER_REMOTE_TIMEOUT", "PACKER_REMOTE_DEADLINE"):
        monkeypatch.delenv(var, raising=False)
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
    call, calls = _failing(9, ConnectionResetError("connection reset by peer"))
    dropped = []
    assert retry.retried(call, WHERE, 0, 4, on_error=dropped.append) == b"data"
    assert len(calls) == 10 and len(dropped) == 9 and len(no_waiting) == 9
    assert sum(no_waiting) < retry.DEADLINE_SECONDS


@pytest.mark.parametrize("burst_seconds", [3.1, 10.0, 45.0])
def test_a_burst_shorter_than_the_deadline_is_absorbed(burst_seconds, no_waiting):
    """A store that throttles every request for burst_seconds (say 10 s of 503 SlowDown), then
    answers: the default policy reads it (the old one gave up after 6 tries, 3.1 s)."""
    calls = []

    def call():
        calls.append(sum(no_waiting))
        if sum(no_waiting) < burst_seconds:
            raise OSError("AWS Error SLOW_DOWN during GetObject operation: 503")
        return b"data"

    assert retry.retried(call, WHERE, 0, 4) == b"data"
    assert sum(no_waiting) >= burst_seconds and len(calls) > 6
    assert max(no_waiting) <= retry.MAX_WAIT_SECONDS
    assert sum(no_waiting[:-1]) < burst_seconds  # no wait past the one that ended the burst


def test_a_persistent_error_names_file_range_attempts_and_cause_within_the_deadline(no_waiting):
    call, calls = _failing(10**6, OSError("AWS Error NETWORK_CONNECTION during GetObject on s3://KEY:SECRET@bucket/x"))
    with pytest.raises(OSError) as e:
        retry.retried(call, WHERE, 1048576, 2097152)
    message = str(e.value)
    assert message.startswith("s3://***@bucket/ds/shard-00001.bin?region=x bytes 1048576-2097152: "
                              f"read failed {len(calls)} times")
    assert "NETWORK_CONNECTION" in message and "SECRET" not in message and "\n" not in message
    # bounded by the deadline, not a count: waits of 0.1 s doubling to 5 s fill most of the 60 s
    assert sum(no_waiting) < retry.DEADLINE_SECONDS and sum(no_waiting) > retry.DEADLINE_SECONDS - 2 * retry.MAX_WAIT_SECONDS
    assert 10 < len(calls) < 40


def test_the_environment_sets_the_deadline_and_a_count(no_waiting, monkeypatch):
    monkeypatch.setenv("PACKER_REMOTE_DEADLINE", "2")
    call, calls = _failing(10**6, ConnectionResetError("reset"))
    with pytest.raises(OSError, match="within 2 s"):
        retry.retried(call, WHERE)
    assert sum(no_waiting) < 2 and len(calls) >= 4
    monkeypatch.setenv("PACKER_REMOTE_ATTEMPTS", "3")
    monkeypatch.setenv("PACKER_REMOTE_DEADLINE", "60")
    call, calls = _failing(10**6, ConnectionResetError("reset"))
    with pytest.raises(OSError, match="read failed 3 times"):
        retry.retried(call, WHERE)
    assert len(calls) == 3
    monkeypatch.setenv("PACKER_REMOTE_DEADLINE", "soon")
    with pytest.raises(ValueError, match="PACKER_REMOTE_DEADLINE='soon'"):
        retry.retried(call, WHERE)


def test_a_retried_call_inside_a_try_runs_once_so_retries_never_multiply(no_waiting):
    inner_calls = []

    def inner():
        inner_calls.append(1)
        raise ConnectionResetError("reset")

    outer_calls = []

    def outer():
        outer_calls.append(1)
        if len(outer_calls) < 3:
            return retry.retried(inner, WHERE)
        return b"data"

    assert retry.retried(outer, WHERE) == b"data"
    assert len(inner_calls) == 2 and len(outer_calls) == 3


def test_a_permanent_error_is_raised_as_it_is_when_not_reworded(no_waiting):
    error = FileNotFoundError(2, "No such file", "bucket/ds/manifest.json")
    call, calls = _failing(99, error)
    with pytest.raises(FileNotFoundError) as e:
        retry.retried(call, WHERE, reword=False)
    assert e.value is error and len(calls) == 1


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
