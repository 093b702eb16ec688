"""Is the default thread policy (packer/preprocess/executors.py: cores // workers tokenizer threads each)
ever slower than a hand-picked RAYON_NUM_THREADS? Whole `packer build` runs, in one run of this script.

    python benchmarks/bench_cores.py                 # the sample corpus (3.3 MB), 5 rounds, ~10 minutes
    python benchmarks/bench_cores.py --copies 3 --rounds 3

Settings: each core set (all usable cores, and `taskset -c 0`: one core) x each --workers (1, 2, 4)
x the policy (RAYON_NUM_THREADS unset) and every hand-picked thread count (1, 2; RAYON_NUM_THREADS
set, which the policy leaves alone), plus `--workers 0` (the default count: one worker per two
usable cores). Every round runs every setting once, in a shuffled order, so a slow spell of a
shared machine falls on different settings each round. Ratio: in each round, policy time / the
best hand-picked time at that worker count (<= 1.0 plus noise: never slower), and default / the
best of all the settings; printed as the median over the rounds, with the range.

2026-12-01, 2 cores, load 0.7-2.4, `--copies 3 --rounds 3` (docs/scale.md has the table):
    policy / best hand-picked 0.97-1.01 at 1, 2 and 4 workers on 2 cores and on 1 (taskset);
    the default (1 worker x 2 threads here) 1.01 of the best of all settings.
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "sample_data"
WORKERS = (1, 2, 4)
THREADS = (1, 2)


def _corpus(d: Path, copies: int) -> list[str]:
    text = "".join((SAMPLE / p).read_text(encoding="utf-8") for p in ("prose.jsonl", "code.jsonl"))
    paths = []
    for i in range(copies):
        (d / f"part-{i}.jsonl").write_text(text, encoding="utf-8")
        paths.append(str(d / f"part-{i}.jsonl"))
    return paths


def _build(inputs, out: Path, workers: int, threads: int | None, one_core: bool) -> float:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("RAYON_NUM_THREADS", None)
    env.pop("TOKENIZERS_PARALLELISM", None)
    if threads is not None:
        env["RAYON_NUM_THREADS"] = str(threads)
    cmd = [*(["taskset", "-c", "0"] if one_core else []), sys.executable, "-m", "packer", "build", *inputs,
           "--tokenizer", str(SAMPLE / "tokenizer.json"), "--output", str(out), "--workers", str(workers),
           "--unit-bytes", str(2 * 2**20), "--quiet"]
    shutil.rmtree(out, ignore_errors=True)
    t = time.perf_counter()
    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"build failed (workers {workers}, threads {threads}): {done.stderr[-2000:]}")
    return time.perf_counter() - t


def _settings() -> list[tuple[bool, int, int | None]]:
    """(one core, workers, threads): None threads = the policy; workers 0 = the default count."""
    return [(one, w, t) for one in (False, True) for w in WORKERS for t in (None, *THREADS)] + \
        [(one, 0, None) for one in (False, True)]


def main():
    global WORKERS, THREADS
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--copies", type=int, default=1, help="copies of the sample corpus (3.3 MB each)")
    ap.add_argument("--rounds", type=int, default=5, help="rounds: every setting once per round, in a shuffled order")
    ap.add_argument("--smoke", action="store_true", help="the smallest run (seconds; tests/test_benchmarks.py runs it)")
    a = ap.parse_args()
    if a.smoke:
        a.copies, a.rounds, WORKERS, THREADS = 1, 1, (1,), (1,)
    print(f"python {platform.python_version()}, {os.cpu_count()} cores ({len(os.sched_getaffinity(0))} usable), "
          f"load {os.getloadavg()[0]:.1f}, {a.copies} x sample corpus, {a.rounds} rounds")
    tmp = Path(tempfile.mkdtemp(prefix="packer-cores-"))
    rng = random.Random(0)
    times: dict = {s: [] for s in _settings()}
    try:
        inputs = _corpus(tmp, a.copies)
        for r in range(a.rounds):
            order = list(times)
            rng.shuffle(order)  # a slow spell of the machine falls on different settings each round
            for s in order:
                times[s].append(_build(inputs, tmp / "out", s[1], s[2], s[0]))
            print(f"round {r + 1}: load {os.getloadavg()[0]:.1f}", flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    _table(times, a.rounds)


def _table(times: dict, rounds: int):
    """Medians, and ratios taken within each round (settings of one round share the machine's state)."""
    med = {s: statistics.median(v) for s, v in times.items()}
    print(f"\n{'cores':<6} {'workers':>7} {'policy s':>9} " + " ".join(f"{f'{t} thr s':>8}" for t in THREADS)
          + f" {'policy/best':>11}  (median of the per-round ratios; range)")
    worst = 0.0
    for one in (False, True):
        cores = "1" if one else "all"
        for w in WORKERS:
            ratios = [times[one, w, None][r] / min(times[one, w, t][r] for t in THREADS) for r in range(rounds)]
            worst = max(worst, statistics.median(ratios))
            print(f"{cores:<6} {w:>7} {med[one, w, None]:>9.2f} " + " ".join(f"{med[one, w, t]:>8.2f}" for t in THREADS)
                  + f" {statistics.median(ratios):>11.2f}  ({min(ratios):.2f}-{max(ratios):.2f})")
        ratios = [times[one, 0, None][r] / min(times[one, w, t][r] for w in WORKERS for t in (None, *THREADS))
                  for r in range(rounds)]
        print(f"{cores:<6} {'default':>7} {med[one, 0, None]:>9.2f} {'':>17} {statistics.median(ratios):>11.2f}  "
              f"({min(ratios):.2f}-{max(ratios):.2f}; vs the best of all settings)")
    print(f"cores: worst policy/best-hand-picked median {worst:.2f}")


if __name__ == "__main__":
    main()
