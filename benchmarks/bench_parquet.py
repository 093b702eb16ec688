"""Does the cost of a Parquet input grow with its rows, not with its row groups?

    python benchmarks/bench_parquet.py                     # 200k short texts as 10, 1k and 10k row groups
    python benchmarks/bench_parquet.py --code /work/main   # the same files through another checkout (before/after)

The same 200k texts (sample_data sentences, 20-200 characters) written as Parquet files of
10, 1,000 and 10,000 row groups; for each file, timed in this run:

    read_table   pq.read_table(file, columns=["text"]), best of 3: the baseline
    +to_pylist   the same, then .to_pylist(): the least any reader of Python str pays
    reader       the readers alone (plan_units + read_unit over every unit, texts counted), in a subprocess
    build        `packer build FILE --workers 1` (manifest build_seconds: plan, tokenize, pack, write, finalize)
    cpu          the build process's CPU seconds, start to exit (steadier than wall time on a shared machine)
    encode       Tokenizer.encode_batch_fast over the same texts in memory, ~1 MiB batches (the build's floor)

"reader x" and "build x" are those times over read_table's; "ms/1k rg" is the build's extra time per
1,000 row groups over the 10-group file: flat when the cost is linear in rows, growing when it is not.

Measured 2026-12-01 (shared 2-core machine, pyarrow 26, 200k texts; encode floor 6.4-7.8 s in these
runs, 3.2 s on a quiet machine: builds are tokenizer-bound and their wall times noisy, cpu s steadier):

    row groups   units   reader s   build s   cpu s   read_table s   (main, one unit per row group: units, reader s, build s, cpu s)
    10           1       0.43       6.6       5.8     0.040          10       0.75     9.4    6.5
    1,000        1       0.23       5.7       5.8     0.10           1,000    1.9     11.7    8.8
    10,000       1       0.36       6.1       5.9     0.82           10,000   155     137    107

The reader is 0.4-11x read_table (it makes a Python str per row: read_table + to_pylist is 0.11-0.72 s),
and the build's cpu s no longer grow with the row groups (main: +10 s per 1,000 row groups at 10k).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import resource
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TOKENIZER = str(ROOT / "sample_data" / "tokenizer.json")
SEED = 0
ROWS = 200_000
GROUPS = (10, 1_000, 10_000)

READER = textwrap.dedent("""
    import json, sys, time
    from packer.preprocess.readers import SkipLog, plan_units, read_unit
    t = time.perf_counter()
    units = plan_units([sys.argv[1]], 64 * 2**20)
    skips = SkipLog.empty()
    n = sum(1 for u in units for _ in read_unit(u, skips))
    print(json.dumps({"seconds": time.perf_counter() - t, "units": len(units), "texts": n}))
""")


def make_texts(n: int) -> list[str]:
    """n short texts: sample_data sentences, cut to 20-200 characters, numbered so none repeats."""
    rng = random.Random(SEED)
    sentences = []
    for name in ("prose.jsonl", "code.jsonl"):
        with open(ROOT / "sample_data" / name, encoding="utf-8") as f:
            for line in f:
                sentences += [s.strip() for s in json.loads(line)["text"].split(". ") if len(s.strip()) > 20]
    return [f"{i}: {rng.choice(sentences)[:rng.randint(20, 200)]}" for i in range(n)]


def best_of(fn, repeat: int = 3) -> float:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def encode_seconds(texts: list[str]) -> float:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(TOKENIZER)
    t = time.perf_counter()
    batch, chars = [], 0
    for text in texts:
        batch.append(text)
        chars += len(text)
        if len(batch) >= 1024 or chars >= 1 << 20:
            tok.encode_batch_fast(batch, add_special_tokens=False)
            batch, chars = [], 0
    tok.encode_batch_fast(batch, add_special_tokens=False)
    return time.perf_counter() - t


def run_reader(code: Path, path: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": str(code)}
    # cwd too: `python -c` puts the working directory before PYTHONPATH on sys.path
    done = subprocess.run([sys.executable, "-c", READER, str(path)], env=env, cwd=code, capture_output=True, text=True,
                          check=True)
    return json.loads(done.stdout)


def run_build(code: Path, path: Path, out: Path) -> tuple[float, float]:
    """(build_seconds from the manifest, CPU seconds of the whole process: steadier on a shared machine)."""
    env = {**os.environ, "PYTHONPATH": str(code)}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    cmd = [sys.executable, "-c", "from packer.cli import main; main()", "build", str(path), "--tokenizer", TOKENIZER,
           "--output", str(out), "--workers", "1", "--context-length", "2048"]
    done = subprocess.run(cmd, env=env, cwd=code, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"build failed: {done.stderr[-2000:]}")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    return json.loads((out / "manifest.json").read_text())["build_seconds"], cpu


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--code", type=Path, default=ROOT, help="checkout whose packer is timed (default: this one)")
    ap.add_argument("--rows", type=int, default=ROWS)
    ap.add_argument("--groups", default=",".join(map(str, GROUPS)), help="row-group counts, comma separated")
    ap.add_argument("--smoke", action="store_true", help="the smallest run (seconds; tests/test_benchmarks.py runs it)")
    a = ap.parse_args()
    if a.smoke:
        a.rows, a.groups = 2_000, "2,10"
    import pyarrow as pa
    import pyarrow.parquet as pq
    import tokenizers

    commit = subprocess.run(["git", "-C", str(a.code), "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    print(f"# {platform.platform()}, {os.cpu_count()} cpus, python {platform.python_version()}, pyarrow {pa.__version__}, "
          f"tokenizers {tokenizers.__version__}; packer from {a.code} ({commit}); {a.rows:,} texts, seed {SEED}")
    texts = make_texts(a.rows)
    table = pa.table({"text": texts})
    print(f"# encode_batch_fast over the texts in memory: {encode_seconds(texts):.2f} s (the build's floor)")
    tmp = Path(tempfile.mkdtemp(prefix="packer-bench-parquet-"))
    base = None
    print(f"{'case':<8} {'row groups':>10} {'units':>6} {'reader s':>9} {'build s':>8} {'cpu s':>6} {'read_table s':>12} "
          f"{'+to_pylist s':>12} {'reader x':>9} {'build x':>8} {'ms/1k rg':>9}")
    for n_groups in map(int, a.groups.split(",")):
        path = tmp / f"g{n_groups}.parquet"
        pq.write_table(table, path, row_group_size=-(-a.rows // n_groups))
        n_groups = pq.ParquetFile(path).metadata.num_row_groups
        read = best_of(lambda: pq.read_table(path, columns=["text"]))
        pylist = best_of(lambda: pq.read_table(path, columns=["text"]).column("text").to_pylist())
        reader = run_reader(a.code, path)
        assert reader["texts"] == a.rows, reader
        build, cpu = run_build(a.code, path, tmp / f"out{n_groups}")
        base = base or (n_groups, build)
        per_1k = (build - base[1]) / (n_groups - base[0]) * 1000 if n_groups > base[0] else 0.0
        print(f"{'rg' + str(n_groups):<8} {n_groups:>10,} {reader['units']:>6,} {reader['seconds']:>9.2f} {build:>8.2f} {cpu:>6.1f} "
              f"{read:>12.3f} {pylist:>12.3f} {reader['seconds'] / read:>9.1f} {build / read:>8.1f} {per_1k:>9.1f}",
              flush=True)


if __name__ == "__main__":
    main()
