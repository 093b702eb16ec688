"""The threads an engine encodes on: how many (the cores rule) and a pool owned by one process.

The rule: a build's workers x each worker's engine threads never exceed the usable cores.

    usable cores   os.sched_getaffinity (taskset, cpusets), lowered by a cgroup CPU quota
                   (cgroup v2 cpu.max, v1 cpu.cfs_quota_us / cpu.cfs_period_us, rounded up)
    per worker     max(1, cores // workers) engine threads (packer/preprocess/executors.py
                   tokenizer_threads sets RAYON_NUM_THREADS, TOKENIZERS_PARALLELISM in each worker);
                   a RAYON_NUM_THREADS the user set is taken as a cap, never raised above that
    an engine      reads the setting through engine_threads(): tiktoken's pool, tokenizers' Rayon
                   pool (hf, fastokens); hf's own thread runs encode_batch_fast, which with one
                   engine thread encodes on that thread (no Rayon pool) and else waits on the pool

    2 cores, --workers 2   2 x 1: tiktoken encodes on the worker's thread, hf on its one thread
    2 cores, --workers 1   1 x 2
    64 cores, cgroup quota 8, --workers 4   4 x 2
    --workers above the cores (asked for): each worker 1 thread, never more

(A worker's reading thread parses JSON while its engine encodes: that is the worker's own work,
not an engine thread; tests/preprocess/test_threads.py counts the threads each engine starts.)

A forked child (a DataLoader worker over online packing, after the parent encoded) inherits the
parent's encoder but not its threads: a ThreadPoolExecutor copied into it believes its threads are
there and idle, so work submitted in the child would wait forever. Each process gets its own pool.
"""

from __future__ import annotations

import functools
import math
import os
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")


def usable_cores() -> int:
    """Cores this process may run on: its affinity (taskset, cpusets; os.cpu_count sees neither),
    lowered by a cgroup CPU quota where one is set (a container given 2 CPUs of a 64-core host)."""
    try:
        cores = len(os.sched_getaffinity(0)) or 1
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    quota = cgroup_quota_cores()
    return max(1, min(cores, quota)) if quota else cores


@functools.lru_cache(maxsize=1)
def cgroup_quota_cores() -> int | None:
    """The CPU quota of this process's cgroup in whole cores (rounded up), or None (no quota, not
    Linux, or unreadable): a few small files read once per process."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    return quota_cores(lines, CGROUP_ROOT)


def quota_cores(cgroup_lines: list[str], root: Path) -> int | None:
    """The lowest CPU quota, in cores, of the cgroup `cgroup_lines` (/proc/self/cgroup) names and
    its parents under `root`, v2 (cpu.max "200000 100000" -> 2) or v1 (cpu.cfs_quota_us -1: none)."""
    found = []
    for line in cgroup_lines:
        hierarchy, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if hierarchy == "0" and not controllers:  # v2 (unified)
            for d in _up(root, path):
                found.append(_v2_quota(d / "cpu.max"))
        elif "cpu" in controllers.split(","):  # v1; the controller mounted alone or with cpuacct
            for mount in (root / "cpu", root / "cpu,cpuacct", root / "cpuacct,cpu"):
                if mount.is_dir():
                    for d in _up(mount, path):
                        found.append(_v1_quota(d))
                    break
    quotas = [q for q in found if q]
    return max(1, math.ceil(min(quotas))) if quotas else None


def _up(base: Path, path: str):
    """base/path and each of its parents up to base (a process may sit below the limited group)."""
    parts = [p for p in path.strip("/").split("/") if p and p != ".."]
    for i in range(len(parts), -1, -1):
        yield base.joinpath(*parts[:i])


def _v2_quota(path: Path) -> float | None:
    try:
        quota, period = path.read_text().split()[:2]
        return int(quota) / int(period) if quota != "max" and int(period) > 0 else None
    except (OSError, ValueError):  # no such file, or not two fields
        return None


def _v1_quota(d: Path) -> float | None:
    try:
        quota, period = int((d / "cpu.cfs_quota_us").read_text()), int((d / "cpu.cfs_period_us").read_text())
    except (OSError, ValueError):
        return None
    return quota / period if quota > 0 and period > 0 else None


def threads_per_worker(n_workers: int) -> int:
    """The rule: engine threads for each of `n_workers` workers, so that workers x threads <= the
    usable cores (1 when the workers alone are more); RAYON_NUM_THREADS, where the user set it, caps it."""
    threads = max(1, usable_cores() // max(n_workers, 1))
    user = os.environ.get("RAYON_NUM_THREADS", "")
    return min(threads, int(user)) if user.isdigit() and int(user) > 0 else threads


def engine_threads() -> int:
    """The threads an engine of this process may encode on: what the executor set for it
    (RAYON_NUM_THREADS; TOKENIZERS_PARALLELISM=false: one), else the process's usable cores (a
    process no executor configured: `packer stats`, a notebook), never more than those."""
    if os.environ.get("TOKENIZERS_PARALLELISM", "").lower() == "false":
        return 1
    threads = os.environ.get("RAYON_NUM_THREADS", "")
    cores = usable_cores()
    return min(int(threads), cores) if threads.isdigit() and int(threads) > 0 else cores


class OwnThreads:
    """submit(fn, *args) on `n` threads of this process's own (made on first use, again after a fork)."""

    def __init__(self, n: int, name: str):
        self.n, self._name = n, name
        self._pool, self._pid = None, None

    def submit(self, fn, *args) -> Future:
        if self._pid != os.getpid():
            self._pool, self._pid = ThreadPoolExecutor(self.n, thread_name_prefix=self._name), os.getpid()
        return self._pool.submit(fn, *args)
