"""Is the default thread policy (packer/build/executors.py: cores // workers tokenizer threads each)
ever slower than a hand-picked RAYON_NUM_THREADS? Whole `packer build` runs, in one run of this script.

    python benchmarks/bench_cores.py                 # sample corpus x 4 (13 MB), best of 2, ~5 minutes

For each core set (all usable cores, and `taskset -c 0`: one core) and each --workers (1, 2, 4),
the build runs with the policy (RAYON_NUM_THREADS unset) and with every hand-picked thread count
(1, 2; RAYON_NUM_THREADS set, which the policy leaves alone), plus `--workers 0` (the default: one
worker per usable core). Ratio: policy time / the best hand-picked time at that worker count
(<= 1.0 plus noise: never slower), and default / the best of all.

2026-12-01, shared 2-core box at load 12-17 (others' tests): see docs/scale.md. That run was noise
(the same setting, measured twice, differed by up to 3x); its one steady signal, 1 worker x 2
threads well ahead of 2 x 1 and 4 x 1 on 2 cores, set the default of one worker per 2 cores.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
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


def _build(inputs, out: Path, workers: int, threads: int | None, one_core: bool, repeat: int) -> float:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("RAYON_NUM_THREADS", None)
    env.pop("TOKENIZERS_PARALLELISM", None)
    if threads is not None:
        env["RAYON_NUM_THREADS"] = str(threads)
    cmd = [*(["taskset", "-c", "0"] if one_core else []), sys.executable, "-m", "packer", "build", *inputs,
           "--tokenizer", str(SAMPLE / "tokenizer.json"), "--output", str(out), "--workers", str(workers),
           "--unit-bytes", str(2 * 2**20), "--quiet"]
    best = float("inf")
    for _ in range(repeat):
        shutil.rmtree(out, ignore_errors=True)
        t = time.perf_counter()
        subprocess.run(cmd, env=env, check=True, capture_output=True)
        best = min(best, time.perf_counter() - t)
    return best


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--copies", type=int, default=4, help="copies of the sample corpus (3.3 MB each)")
    ap.add_argument("--repeat", type=int, default=2)
    a = ap.parse_args()
    print(f"python {platform.python_version()}, {os.cpu_count()} cores ({len(os.sched_getaffinity(0))} usable), "
          f"load {os.getloadavg()[0]:.1f}, {a.copies} x sample corpus, best of {a.repeat}")
    tmp = Path(tempfile.mkdtemp(prefix="packer-cores-"))
    try:
        inputs = _corpus(tmp, a.copies)
        print(f"{'cores':<6} {'workers':>7} {'policy s':>9} " + " ".join(f"{f'{t} thr s':>8}" for t in THREADS)
              + f" {'policy/best':>11}")
        for one_core in (False, True):
            cores = "1" if one_core else "all"
            hand_best = float("inf")
            for w in WORKERS:
                policy = _build(inputs, tmp / "out", w, None, one_core, a.repeat)
                hand = [_build(inputs, tmp / "out", w, t, one_core, a.repeat) for t in THREADS]
                hand_best = min(hand_best, *hand)
                print(f"{cores:<6} {w:>7} {policy:>9.2f} " + " ".join(f"{h:>8.2f}" for h in hand)
                      + f" {policy / min(hand):>11.2f}")
            default = _build(inputs, tmp / "out", 0, None, one_core, a.repeat)
            print(f"{cores:<6} {'default':>7} {default:>9.2f} {'':>17} {default / hand_best:>11.2f}  (vs the best of all)")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
