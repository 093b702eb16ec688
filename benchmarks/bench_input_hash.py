"""What does hashing each unit's input cost the tokenize stage, and what does the re-check cost?

    python benchmarks/bench_input_hash.py               # sample_data repeated to 20 MB, 5 rounds
    python benchmarks/bench_input_hash.py --mb 5 --repeat 3

Rows, timed in this process, one core (inline executor, RAYON_NUM_THREADS=1), rounds interleaved
(off, on, off, on, ...) and each row's best kept, so a busy machine moves both rows alike:

    tokenize, hashing off   the pipeline's tokenize stage with packer.preprocess.changed.ENABLED = False
    tokenize, hashing on    the same stage, each unit hashing what it reads (the default)
    re-check                changed.refuse_changed over the finished units (what a build does before
                            resuming and before its manifest): every input read again and hashed
    hash alone              the records' hash (changed.HASH) over the corpus bytes in memory (the floor of both)

"ratio" is the row's CPU seconds over the "hashing off" row's. Target: hashing on within ~2%.

2026-12-01, busy shared 2-core box (wall times 5x the CPU times), --mb 10 --repeat 3:

    JSONL 10.0 MB, 8 units     cpu s   ratio        JSONL.gz 2.9 MB    cpu s   ratio
    tokenize, hashing off      2.913  1.0000        hashing off        2.813  1.0000
    tokenize, hashing on       2.797  0.9602        hashing on         2.927  1.0406
    re-check                   0.014  0.0047        re-check           0.004  0.0013
    hash alone                 0.010  0.0035        hash alone         0.003  0.0010
    per-round on/off 0.960, 0.973, 1.036            per-round 0.925, 0.981, 1.064

The on/off ratio is noise either way (its spread is +-5%); what hashing adds is the hash itself,
0.35% of the stage's CPU on JSONL.
Corpora: JSONL files (byte-range units) and the same as .jsonl.gz (one unit per file, hashed
below the decompressor).
"""

from __future__ import annotations

import os

os.environ.setdefault("RAYON_NUM_THREADS", "1")  # before tokenizers is imported: one core, steadier times
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import argparse  # noqa: E402
import gzip  # noqa: E402
import platform  # noqa: E402
import shutil  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
TOKENIZER = str(ROOT / "sample_data" / "tokenizer.json")

from packer.preprocess import changed  # noqa: E402


def _stage(files, enabled: bool, keep: Path | None = None) -> dict:
    from packer.config import BuildConfig
    from packer.encode.tokenizer import tokenizer_info
    from packer.preprocess import changed, readers
    from packer.preprocess.executors import make_executor
    from packer.preprocess.pipeline import _tokenize_stage

    config = BuildConfig(unit_bytes=4 << 20)
    info = tokenizer_info(TOKENIZER, config)
    units = readers.plan_units(files, config.unit_bytes)
    work = Path(tempfile.mkdtemp())
    changed.ENABLED = enabled
    executor = make_executor(1)
    try:
        t, c = time.perf_counter(), time.process_time()
        counters = _tokenize_stage(units, info, config, work, executor, progress="off")
        out = {"seconds": time.perf_counter() - t, "cpu": time.process_time() - c,
               "tokens": sum(u["tokens"] for u in counters), "units": units, "work": work}
    finally:
        changed.ENABLED = True
        executor.close()
    if keep is None:
        shutil.rmtree(work)
    return out


def _recheck(units, work: Path) -> dict:
    from packer.preprocess import changed
    from packer.preprocess.executors import make_executor
    from packer.preprocess.tokenize import unit_paths

    executor = make_executor(1)
    t, c = time.perf_counter(), time.process_time()
    changed.refuse_changed([(u, unit_paths(work, u.index)["json"]) for u in units], executor, stage="finalize")
    return {"seconds": time.perf_counter() - t, "cpu": time.process_time() - c}


def _hash_alone(files) -> dict:
    data = [Path(f).read_bytes() for f in files]
    t, c = time.perf_counter(), time.process_time()
    for d in data:
        h = changed.HASHERS[changed.HASH]()
        view = memoryview(d)
        for i in range(0, len(view), 4 << 20):
            h.update(view[i:i + (4 << 20)])
        h.hexdigest()
    return {"seconds": time.perf_counter() - t, "cpu": time.process_time() - c}


def _best(rows: list[dict]) -> dict:
    return {**rows[0], "seconds": min(r["seconds"] for r in rows), "cpu": min(r["cpu"] for r in rows)}


def _compare(name: str, files, repeat: int):
    size = sum(os.path.getsize(f) for f in files)
    off, on, recheck = [], [], []
    for _ in range(repeat):
        off.append(_stage(files, False))
        run = _stage(files, True, keep=Path("."))
        on.append(run)
        recheck.append(_recheck(run["units"], run["work"]))
        shutil.rmtree(run["work"])
    assert len({r["tokens"] for r in off + on}) == 1, "hashing changed the tokens"
    base = _best(off)
    rows = [("tokenize, hashing off", base), ("tokenize, hashing on", _best(on)), ("re-check", _best(recheck)),
            ("hash alone", _hash_alone(files))]
    print(f"\n{name}: {size / 1e6:.1f} MB in {len(files)} files, {len(base['units'])} units")
    print(f"{'case':<24}{'seconds':>9}{'cpu s':>8}{'MB/s':>9}{'ratio':>8}")
    for label, r in rows:
        print(f"{label:<24}{r['seconds']:>9.3f}{r['cpu']:>8.3f}{size / r['seconds'] / 1e6:>9.1f}{r['cpu'] / base['cpu']:>8.4f}")
    ratios = sorted(b["cpu"] / a["cpu"] for a, b in zip(off, on))
    print(f"per-round cpu ratio on/off: {', '.join(f'{x:.3f}' for x in ratios)} (median {ratios[len(ratios) // 2]:.3f})")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mb", type=float, default=20, help="corpus size in MB (default 20)")
    parser.add_argument("--repeat", type=int, default=5, help="rounds of each row (default 5; the best is kept)")
    parser.add_argument("--smoke", action="store_true", help="the smallest run (seconds; tests/test_benchmarks.py runs it)")
    args = parser.parse_args()
    if args.smoke:
        args.mb, args.repeat = 1.0, 1
    import numpy
    import tokenizers
    from bench_tokenize import make_corpus

    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, {platform.platform()}")
    print(f"python {platform.python_version()}, tokenizers {tokenizers.__version__}, numpy {numpy.__version__}, "
          f"hash {changed.HASH}, RAYON_NUM_THREADS={os.environ['RAYON_NUM_THREADS']}")
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        (tmp / "jsonl").mkdir()
        files = make_corpus(tmp / "jsonl", int(args.mb * 1e6))
        _compare("JSONL", files, args.repeat)
        (tmp / "gz").mkdir()
        gz = []
        for f in files:
            gz.append(str(tmp / "gz" / (Path(f).name + ".gz")))
            Path(gz[-1]).write_bytes(gzip.compress(Path(f).read_bytes(), compresslevel=6, mtime=0))
        _compare("JSONL.gz", gz, args.repeat)
    print("\nratio = CPU seconds / 'tokenize, hashing off' CPU seconds (target for hashing on: < ~1.02)")


if __name__ == "__main__":
    main()
