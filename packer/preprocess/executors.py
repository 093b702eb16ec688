"""Where stage functions run: in this process, in a local process pool, or as Ray tasks (EXECUTORS: name -> factory).

An executor is `map(fn, items, on_done=None, sizes=None)` (completion in any order, results in
item order, `on_done(result)` on the driver as each finishes; `sizes`: each call's rough cost, so a
pool starts the largest first) plus `close()`. Stage functions
are module-level and take small picklable arguments (paths, units, indices); token data
moves only through files, so where a call runs never changes the bytes it writes.

    items    [(unit0, info, config, dir), (unit1, ...), ...]    one tuple of arguments per call
    results  [fn(*items[0]), fn(*items[1]), ...]                 same order, whatever finished first
"""

from __future__ import annotations

import contextlib
import inspect
import multiprocessing as mp
import multiprocessing.connection as mp_connection
import os
import signal
import sys
import threading
import warnings
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass

from packer.encode.engines import threads
from packer.io import failpoints
from packer.io.fs import redact, redact_text

RAY_INSTALL_HINT = 'pip install "packer[ray]"'
RAY_MAX_RETRIES = 3  # a task whose worker process dies is rerun this many times, then the build fails
RAY_STALL_SECONDS: float | None = None  # fail when no task finishes for this long (None: wait forever)
# What a local pool's forkserver imports once, so that each worker it forks has it: the tokenize task's
# modules (numpy, the readers, the engines; ~0.2 s a worker otherwise spends importing them); the later
# stages' modules are imported by the workers that run them.
PRELOAD = ("packer.preprocess.tokenize", "tokenizers", "tiktoken")


def usable_cores() -> int:
    """Cores this process may run on: affinity (taskset, cpusets) and a cgroup CPU quota
    (packer/encode/engines/threads.py; os.cpu_count sees neither)."""
    return threads.usable_cores()


def tokenizer_threads(n_workers: int) -> int:
    """The rule (packer/encode/engines/threads.py, docs/engines.md): workers x engine threads <= the
    usable cores. Each of n workers gets cores // n engine threads (at least one): tiktoken's pool,
    tokenizers' Rayon pool (RAYON_NUM_THREADS) or hf's one thread; a RAYON_NUM_THREADS the user set
    caps it. 2 cores: 1 worker x 2 threads or 2 x 1; 64 cores, --workers 64: 64 x 1, not 64 x 64
    (benchmarks/bench_cores.py); tests/preprocess/test_threads.py counts the threads started."""
    return threads.threads_per_worker(n_workers)


def _set_threads(threads: int):
    """Before the first encode in this process (Rayon builds its pool once): `threads` tokenizer
    threads; TOKENIZERS_PARALLELISM=false would make encode_batch_fast run on one whatever the pool."""
    os.environ["RAYON_NUM_THREADS"] = str(threads)
    os.environ["TOKENIZERS_PARALLELISM"] = "true" if threads > 1 else "false"


def _init_worker(threads: int = 1, warm=None):
    _set_threads(threads)
    _exit_with_driver()
    if warm is not None:
        fn, args = warm
        try:
            fn(*args)
        except Exception:  # the first task that needs it loads it again and reports what is wrong
            pass


def _exit_with_driver():
    """End this worker as soon as the driver process is gone (kill -9, OOM killer, preemption),
    rather than let it finish a task nobody will collect. The pool does not: a busy worker of a
    killed driver runs on to its task's end. The parent's sentinel becomes ready when it dies."""
    parent = mp.parent_process()
    if parent is None or parent.sentinel is None:
        return

    def watch():
        mp_connection.wait([parent.sentinel])
        os._exit(1)

    threading.Thread(target=watch, name="packer-driver-watch", daemon=True).start()


def largest_first(n: int, sizes=None) -> list[int]:
    """The order a pool starts n calls in: by `sizes` (each call's rough cost), largest first, ties in
    item order (none given: item order). The last calls to start are then the smallest, and the
    workers finish together: 16 units of 3.9 MB and a remainder of 0.1 MB in item order left one of 2
    workers idle for the last 0.28 s of a 2.2 s stage; the remainder last, 0.03 s (2026-12-06)."""
    if sizes is None:
        return list(range(n))
    return sorted(range(n), key=lambda i: -sizes[i])


def describe_call(fn, item, index: int) -> str:
    """Name a call for error messages by its domain arguments: 'tokenize_unit, unit 3 (a.jsonl bytes
    0-65536)' ('... (a.jsonl.gz whole file)'), 'write_shard, shard 2', else 'fn, item 5'."""
    try:
        args = inspect.signature(fn).bind(*item).arguments
    except (TypeError, ValueError):
        args = {}
    unit = args.get("unit")
    if unit is not None and hasattr(unit, "index"):
        span = getattr(unit, "span", None) or f"bytes {unit.start}-{unit.end}"
        return f"{fn.__name__}, unit {unit.index} ({redact(unit.path)} {span})"
    if "shard" in args:
        return f"{fn.__name__}, shard {args['shard']}"
    return f"{getattr(fn, '__name__', fn)}, item {index}"


class WorkerDied(RuntimeError):
    """A worker process ended abruptly (killed, out of memory) while running a task."""


def _labelled(exc: BaseException, label: str) -> BaseException:
    """The same kind of exception with the call's label in front of its message (so the CLI's
    one-line error still names the unit), or a RuntimeError if the type cannot be rebuilt."""
    for cls in type(exc).__mro__:  # the exception's own type, else its nearest built-in base
        if cls is type(exc) or cls.__module__ == "builtins":
            try:
                return cls(redact_text(f"{label}: {exc}"))
            except Exception:
                continue
    return RuntimeError(redact_text(f"{label}: {type(exc).__name__}: {exc}"))


@contextlib.contextmanager
def _main_hidden():
    """Hide __main__'s __file__ while pool workers start, so that none runs the parent's main script
    again: forkserver and spawn workers import it (as __mp_main__) to find what a task names there,
    and packer's tasks name nothing there (stage functions and their arguments live in packer). So a
    script with no `if __name__ == "__main__":` guard builds once, `python - < build.py` (__file__
    '<stdin>', no file to run) works, and a worker of the `packer` command does not import packer.cli
    (0.06 s before it can start, 2026-12-06)."""
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    if path is None:
        yield
        return
    del main.__file__
    try:
        yield
    finally:
        main.__file__ = path


class InlineExecutor:
    """Runs each call in this process: one worker, no pickling, easiest to debug. Its tokenizer
    threads follow the same policy as a pool's (every usable core for the one worker), set in
    this process unless it already encoded something (then its pool is as it was). close() puts
    the variables back, so processes this one starts later do not take them for the user's."""

    def __init__(self):
        self._saved = {k: os.environ.get(k) for k in ("RAYON_NUM_THREADS", "TOKENIZERS_PARALLELISM")}
        _set_threads(tokenizer_threads(1))

    def map(self, fn, items, on_done=None, sizes=None):  # one call at a time: the order costs nothing
        return self.run(fn, items, on_done)

    @staticmethod
    def run(fn, items, on_done=None, labelled: bool = False):
        """Each call in turn here; `labelled`: an error names its call as a pool's does (describe_call)."""
        results = []
        for i, item in enumerate(items):
            try:
                results.append(fn(*item))
            except Exception as e:
                if not labelled:
                    raise
                raise _labelled(e, describe_call(fn, item, i)) from e
            if on_done:
                on_done(results[-1])
        return results

    def close(self):
        for k, v in self._saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


class LocalExecutor:
    """A pool of `n_workers` processes (forkserver start method: no inherited threads or locks),
    each with tokenizer_threads(n_workers) tokenizer threads.

    A map of one call (or none) runs it in this process, as InlineExecutor would, with the one
    worker's threads: a pool started for one call only adds its start (a forkserver, then a worker
    importing packer and loading the tokenizer the driver has loaded already: 0.6-0.8 s of a tiny
    build's 1.5 s, 2026-12-05, loaded machine). The pool starts on the first map of two calls or
    more, or at start(): a build that knows it will need the pool starts it before it loads its
    own tokenizer, each worker running `warm` = (fn, args) once as it starts (the tokenizer and
    engine its tasks will use), so the workers' start overlaps the driver's; where a call runs
    never changes the bytes it writes (module docstring)."""

    def __init__(self, n_workers: int, warm=None):
        self._n, self._warm = n_workers, warm
        self._starting = None
        self._made = None  # the ProcessPoolExecutor, made on first use: its queues start a resource-tracker process

    @property
    def _pool(self) -> ProcessPoolExecutor:
        if self._made is None:
            method = "forkserver" if "forkserver" in mp.get_all_start_methods() else "spawn"
            context = mp.get_context(method)
            if method == "forkserver":  # imported once in the server, not again in each worker it forks
                context.set_forkserver_preload(list(PRELOAD))  # not __main__: _main_hidden
            self._made = ProcessPoolExecutor(
                max_workers=self._n, mp_context=context, initializer=_init_worker,
                initargs=(tokenizer_threads(self._n), self._warm),
            )
        return self._made

    def start(self):
        """Start the workers now, from a thread, and return at once: each submit of a no-op starts a
        process while none is idle (concurrent.futures spawns forkserver workers on demand)."""
        pool = self._pool

        def spawn():
            with _main_hidden():
                for _ in range(self._n):
                    pool.submit(os.getpid)

        self._starting = threading.Thread(target=spawn, name="packer-pool-start", daemon=True)
        self._starting.start()

    def _started(self):
        if self._starting is not None:  # map and close wait for start's submits (they touch __main__)
            self._starting.join()
            self._starting = None

    def map(self, fn, items, on_done=None, sizes=None):
        items = list(items)
        if len(items) <= 1:
            return self._map_here(fn, items, on_done)
        self._started()
        with _main_hidden():  # the pool starts its processes inside submit
            futures = {self._pool.submit(fn, *items[i]): i for i in largest_first(len(items), sizes)}
        results = [None] * len(futures)
        pending = set(futures)
        try:
            while pending:
                done, pending = wait(pending, return_when=FIRST_COMPLETED)
                for fut in done:
                    i = futures[fut]
                    try:
                        results[i] = fut.result()
                    except BrokenProcessPool as e:  # which task's worker died is not known: every pending one fails
                        raise _died(fn) from e
                    except Exception as e:
                        raise _labelled(e, describe_call(fn, items[i], i)) from e
                    if on_done:
                        on_done(results[i])
        except BaseException:
            for fut in pending:
                fut.cancel()
            self._stop_now = True
            raise
        return results

    def call(self, fn, *args):
        """fn(*args) on a worker (the pool started if it is not), returned, raised and warned as if it
        ran here: what the driver asks of work a worker has done already (the build's tokenizer_info,
        from the tokenizer and engine its warm-up loaded), so that the driver does not do it too."""
        self._started()
        with _main_hidden():
            future = self._pool.submit(_warned, fn, args)
        try:
            result, caught = future.result()
        except BrokenProcessPool as e:
            raise _died(fn) from e
        for message, category in caught:
            warnings.warn(message, category, stacklevel=2)
        return result

    @staticmethod
    def _map_here(fn, items, on_done):
        """map in this process (one call at most), labelled as a pool's call is, on one worker's threads."""
        inline = InlineExecutor()
        try:
            return inline.run(fn, items, on_done, labelled=True)
        finally:
            inline.close()

    def close(self, now: bool = False):
        """Wait for the workers to finish and end (a second close does nothing); `now`: end them at
        once, what they were doing dropped (a pool started for a build that turned out to need none)."""
        self._started()
        if self._made is None:  # every map ran here: no pool was made
            return
        if now or getattr(self, "_stop_now", False):  # Ctrl-C or a failed item: don't finish the others
            processes = list((self._pool._processes or {}).values())
            self._pool.shutdown(wait=False, cancel_futures=True)
            for p in processes:
                p.terminate()
            for p in processes:
                p.join()
            return
        self._pool.shutdown(wait=True, cancel_futures=True)


def _died(fn) -> WorkerDied:
    return WorkerDied(f"{fn.__name__}: a worker process died (killed, or out of memory?) with tasks in flight; "
                      "finished work is kept: run the same command again to resume (with fewer --workers "
                      "if memory ran out)")


def _warned(fn, args):
    """A worker's body for LocalExecutor.call: (fn's result, the warnings it gave as (message, category)),
    for the driver to give again (a worker's own stderr is not where the build's warnings go)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = fn(*args)
    return result, [(str(w.message), w.category) for w in caught]


def _run_task(fn, args, cwd: str, env: dict):
    """Body of every Ray task: the driver's packer variables (`env`, e.g. failpoints), its
    directory (relative paths mean the same on every node of a shared mount), one tokenizer
    thread (a task holds one CPU), then the stage function."""
    os.environ.update(env)
    _init_worker()
    if os.getcwd() != cwd:
        try:
            os.chdir(cwd)
        except OSError:
            raise FileNotFoundError(
                f"the driver's working directory {cwd} does not exist on this Ray node; run packer "
                "from a directory on a mount every node shares, or give absolute shared paths"
            ) from None
    return fn(*args)


@contextlib.contextmanager
def _signal_handlers_kept():
    """ray.init installs its own SIGTERM/SIGINT handlers in the driver (SIGTERM: exit 15 at once);
    put the CLI's back, so SIGTERM stops a Ray build with the same one line as a local one."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    kept = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, handler in kept.items():
            if handler is not None:
                signal.signal(sig, handler)


def import_ray():
    """Ray, imported on first use; without it, one line that says how to install it."""
    try:
        import ray
    except ImportError:
        raise ValueError(f"the ray executor needs Ray, which is not installed: {RAY_INSTALL_HINT}") from None
    return ray


class RayExecutor:
    """Ray core tasks (one per call, 1 CPU each): at most `n_workers` in flight, or 2x the
    cluster's CPUs when n_workers is 0. A task whose worker dies is retried by Ray up to
    `max_retries` times; an exception raised by the stage function is not retried (it would
    fail again) and fails the build naming the unit or shard.

    An already-initialized Ray session (say, a test's) is used as it is and left running;
    otherwise `ray.init(address)` connects to `address`, or with None to $RAY_ADDRESS or a
    cluster running on this machine, else starts a local one, which close() stops.
    """

    def __init__(self, n_workers: int = 0, address: str | None = None, max_retries: int | None = None):
        ray = self._ray = import_ray()
        self._owns_session = not ray.is_initialized()
        if self._owns_session:
            with _signal_handlers_kept():
                ray.init(address=address)
        self.max_retries = RAY_MAX_RETRIES if max_retries is None else max_retries
        cpus = int(ray.cluster_resources().get("CPU", 1))
        self.max_in_flight = n_workers if n_workers > 0 else 2 * max(cpus, 1)
        self._task = ray.remote(num_cpus=1, max_retries=self.max_retries, retry_exceptions=False)(_run_task)

    def map(self, fn, items, on_done=None, sizes=None):
        ray, items, cwd, env = self._ray, list(items), os.getcwd(), failpoints.environment()
        results = [None] * len(items)
        in_flight: dict = {}  # ObjectRef -> item index
        order = iter(largest_first(len(items), sizes))
        submitted = 0
        try:
            while submitted < len(items) or in_flight:
                while submitted < len(items) and len(in_flight) < self.max_in_flight:
                    i = next(order)
                    ref = self._task.remote(fn, items[i], cwd, env)
                    in_flight[ref] = i
                    submitted += 1
                ready, _ = ray.wait(list(in_flight), num_returns=1, timeout=RAY_STALL_SECONDS)
                if not ready:
                    raise TimeoutError(self._stalled(fn, items, in_flight))
                i = in_flight.pop(ready[0])
                results[i] = self._result(ready[0], describe_call(fn, items[i], i))
                if on_done:
                    on_done(results[i])
        except BaseException:
            for ref in in_flight:
                ray.cancel(ref)
            raise
        return results

    @staticmethod
    def _stalled(fn, items, in_flight) -> str:
        pending = sorted(in_flight.values())
        names = "; ".join(describe_call(fn, items[i], i) for i in pending[:3])
        return (
            f"no Ray task finished in {RAY_STALL_SECONDS} s ({len(pending)} in flight: {names}); "
            "workers may be failing to start: see `ray status` and the worker logs in /tmp/ray/session_latest/logs"
        )

    def _result(self, ref, label: str):
        ray = self._ray
        try:
            return ray.get(ref)
        except ray.exceptions.RayTaskError as e:  # the stage function raised: same type, labelled
            cause = getattr(e, "cause", None) or e
            raise _labelled(cause, label) from e
        except ray.exceptions.RayError as e:  # worker or node died more than max_retries times
            first_line = redact_text(str(e).strip().splitlines()[0]) if str(e).strip() else type(e).__name__
            raise RuntimeError(
                f"{label}: the Ray task failed on all {self.max_retries + 1} attempts "
                f"(max_retries={self.max_retries}) because its worker died: {type(e).__name__}: {first_line}"
            ) from e

    def close(self):
        if self._owns_session:
            with _signal_handlers_kept():  # (ray.shutdown puts its own back too)
                self._ray.shutdown()


def _local(job):
    """Processes on this machine: `n_workers` of them; one worker runs inline (no pool to start)."""
    return InlineExecutor() if job.n_workers <= 1 else LocalExecutor(job.n_workers)


def _ray(job):
    """Ray tasks: `workers` in flight (0: 2x the cluster's CPUs), on the cluster at `ray_address`."""
    return RayExecutor(n_workers=job.workers, address=job.ray_address)


# The executors a Job names (config.choices("executor") reads the keys, for Job, the CLI and TOML):
# name -> factory(job) reading job.workers, job.n_workers and job.ray_address.
EXECUTORS = {
    "local": _local,
    "ray": _ray,
}


@dataclass(frozen=True)
class _Workers:
    """make_executor(n)'s stand-in for a Job: exactly n local workers."""

    workers: int
    ray_address: None = None
    executor: str = "local"

    @property
    def n_workers(self) -> int:
        return self.workers


def runs_inline(job) -> bool:
    """Every stage call of the job runs in this process (the local executor with one worker): only
    then do the calls see what lives in this process's memory (a memory:// output)."""
    return job.executor == "local" and job.n_workers <= 1


def make_executor(job_or_workers, warm=None):
    """The executor a Job asks for (`executor`, `workers`, `ray_address`); an int n means local
    with n workers (1 = inline). `warm`: (fn, args) a local pool's workers run as they start."""
    if isinstance(job_or_workers, int):
        job_or_workers = _Workers(job_or_workers)
    if warm is not None and job_or_workers.executor == "local" and job_or_workers.n_workers > 1:
        return LocalExecutor(job_or_workers.n_workers, warm)
    return EXECUTORS[job_or_workers.executor](job_or_workers)
