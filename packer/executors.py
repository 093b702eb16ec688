"""Where stage functions run: in this process, or in a local process pool.

An executor is `map(fn, items)` (completion in any order, results in item order) plus
`close()`. Stage functions are module-level and take small picklable arguments (paths,
units, indices); token data moves only through files.
"""

from __future__ import annotations

import multiprocessing as mp
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait


def _init_worker():
    # One tokenizer thread per process: the pool already uses every core.
    import os

    os.environ["RAYON_NUM_THREADS"] = "1"
    os.environ["TOKENIZERS_PARALLELISM"] = "false"


class InlineExecutor:
    """Runs each call in this process: one worker, no pickling, easiest to debug."""

    def map(self, fn, items, on_done=None):
        results = []
        for item in items:
            results.append(fn(*item))
            if on_done:
                on_done(results[-1])
        return results

    def close(self):
        pass


class LocalExecutor:
    """A pool of `n_workers` processes (forkserver start method: no inherited threads or locks)."""

    def __init__(self, n_workers: int):
        method = "forkserver" if "forkserver" in mp.get_all_start_methods() else "spawn"
        self._pool = ProcessPoolExecutor(
            max_workers=n_workers, mp_context=mp.get_context(method), initializer=_init_worker
        )

    def map(self, fn, items, on_done=None):
        futures = {self._pool.submit(fn, *item): i for i, item in enumerate(items)}
        results = [None] * len(futures)
        pending = set(futures)
        try:
            while pending:
                done, pending = wait(pending, return_when=FIRST_COMPLETED)
                for fut in done:
                    results[futures[fut]] = fut.result()  # re-raises a worker's exception
                    if on_done:
                        on_done(results[futures[fut]])
        except BaseException:
            for fut in pending:
                fut.cancel()
            self._stop_now = True
            raise
        return results

    def close(self):
        if getattr(self, "_stop_now", False):  # Ctrl-C or a failed item: don't finish the others
            processes = list((self._pool._processes or {}).values())
            self._pool.shutdown(wait=False, cancel_futures=True)
            for p in processes:
                p.terminate()
            for p in processes:
                p.join()
            return
        self._pool.shutdown(wait=True, cancel_futures=True)


def make_executor(n_workers: int):
    return InlineExecutor() if n_workers <= 1 else LocalExecutor(n_workers)
