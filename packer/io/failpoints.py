"""The one test hook: named points in a build where a test makes the process die or a write fail.

Inert unless PACKER_FAILPOINTS is set, so production code only ever calls `hit(point, n)`:

    PACKER_FAILPOINTS="write-shard:0=kill"                  SIGKILL this process at write-shard:0
    PACKER_FAILPOINTS="unit:1=exit,shard:2=exit"            os._exit(1) there (a worker dying)
    PACKER_FAILPOINTS="once=/tmp/m,unit:1=exit"             each point fires once (a marker file in /tmp/m)
    PACKER_FAILPOINTS="write:1=enospc"                      raise OSError(ENOSPC) there (a full disk)

Actions: kill (SIGKILL), term (SIGTERM), int (SIGINT), exit (os._exit(1)), enospc.
Points (n is the unit, shard or count):

    tokenize:N     driver, after N units are done        write:N        driver, after N shards are done
    plan:0         driver, after the plan is saved       finalize:0     driver, before the manifest
    planned:N      driver, after N plan groups are done
    group:K        the process planning group K, as it starts (packer/preprocess/plan_groups.py)
    bucket:K       the process shuffling bucket K into shard plans, as it starts
    unit:K         the process tokenizing unit K, as it starts
    shard:K        the process writing shard K, as it starts
    write-shard:K  the process writing shard K, after its temporary files, before the renames
    publish:N      driver, before moving the N-th file of the new dataset into OUTPUT (manifest last;
                   packer/preprocess/owned.py)
    publish-keep:N driver, before hard-linking the N-th file of the old dataset into OUTPUT/_work/previous/
                   (its manifest last; packer/preprocess/owned.py)
    remove-work:N  driver, before deleting the N-th entry of OUTPUT/_work (sorted by name; -1: the emptied
                   directory itself; packer/preprocess/owned.py remove_work)
    file:N         the process's N-th local file write (0, 1, ...: every atomic write, packer/io/atomic.py),
                   its bytes in the temporary file, before the rename: with enospc, a full disk there

Executors forward the variable to their workers (Ray tasks too), so a point fires wherever the
stage runs.
"""

from __future__ import annotations

import errno
import os
import signal

ENV = "PACKER_FAILPOINTS"
ACTIONS = ("kill", "term", "int", "exit", "enospc")


def _parse(spec: str) -> tuple[dict[str, str], str | None]:
    points, once_dir = {}, None
    for entry in filter(None, (e.strip() for e in spec.split(","))):
        name, _, action = entry.partition("=")
        if name == "once":
            once_dir = action
        elif action in ACTIONS:
            points[name] = action
        else:
            raise ValueError(f"{ENV}: {entry!r} is not POINT:N=ACTION with ACTION one of {', '.join(ACTIONS)}")
    return points, once_dir


def _first_time(once_dir: str, point: str) -> bool:
    try:
        os.close(os.open(os.path.join(once_dir, point.replace(":", "-")), os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        return True
    except FileExistsError:
        return False


def hit(point: str, n: int):
    """Fire the action set for f"{point}:{n}", if any."""
    spec = os.environ.get(ENV)
    if not spec:
        return
    points, once_dir = _parse(spec)
    name = f"{point}:{n}"
    action = points.get(name)
    if action is None or (once_dir and not _first_time(once_dir, name)):
        return
    if action == "enospc":
        raise OSError(errno.ENOSPC, f"No space left on device (failpoint {name})")
    if action == "exit":
        os._exit(1)
    os.kill(os.getpid(), {"kill": signal.SIGKILL, "term": signal.SIGTERM, "int": signal.SIGINT}[action])


_COUNTS: dict[str, int] = {}  # point -> calls of hit_next in this process


def hit_next(point: str):
    """hit(point, n) for the n-th call in this process (n = 0, 1, ...); nothing is counted when inert."""
    if not os.environ.get(ENV):
        return
    n = _COUNTS.get(point, 0)
    _COUNTS[point] = n + 1
    hit(point, n)


def environment() -> dict[str, str]:
    """The variables a worker on another machine needs to see the same points ({} when inert)."""
    spec = os.environ.get(ENV)
    return {ENV: spec} if spec else {}
