"""How close is the tokenize stage (files -> unit files on disk) to the tokenizer's own speed?

    python benchmarks/bench_tokenize.py            # >= 50 MB of JSONL, the issue's figure
    python benchmarks/bench_tokenize.py --mb 10    # quicker, on a busy machine

Rows, each timed in this run on the same generated corpus (sample_data repeated with
variation, written as several JSONL files so that two workers both get units):

    ceiling        Tokenizer.encode_batch / encode_batch_fast over the texts already in memory,
                   RAYON_NUM_THREADS = the number of cores the stage row uses
    read only      the stage's readers (file -> texts, JSON parsed, skips counted), no tokenizer
    stage          pipeline tokenize stage with --workers N: plan units, read, encode, write unit files
                   (with N > 1 it includes starting the pool, timed alone on the line below it)
    datasets       Dataset.map(batched=True, num_proc=2), when HF datasets is importable

"ratio" is throughput / the encode_batch_fast ceiling (the faster of the two) for the same
cores, target >= 0.90; "cpu ratio" the same in CPU seconds, steadier on a shared machine.
Peak RSS is the largest single process (a worker, or the driver with --workers 1).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TOKENIZER = str(ROOT / "sample_data" / "tokenizer.json")
SEED = 0
N_FILES = 8
BATCH_CHARS = 1 << 20  # the ceiling encodes in the same ~1 MiB batches the stage uses (bounded memory)


def make_corpus(directory: Path, target_bytes: int) -> list[str]:
    """sample_data documents, repeated; each repetition varies words (shuffled sentences, numbers)."""
    rng = random.Random(SEED)
    base = []
    for name in ("prose.jsonl", "code.jsonl"):
        with open(ROOT / "sample_data" / name, encoding="utf-8") as f:
            base.extend(json.loads(line)["text"] for line in f)
    files = [open(directory / f"part-{i:02d}.jsonl", "w", encoding="utf-8") for i in range(N_FILES)]
    written, k = 0, 0
    while written < target_bytes:
        text = base[k % len(base)]
        if k >= len(base):  # later rounds: swap two lines and append a varying number
            lines = text.split("\n")
            if len(lines) > 2:
                i, j = rng.randrange(len(lines)), rng.randrange(len(lines))
                lines[i], lines[j] = lines[j], lines[i]
            text = "\n".join(lines) + f" ({rng.randrange(10**6)})"
        line = json.dumps({"text": text, "id": k}) + "\n"
        files[k % N_FILES].write(line)
        written += len(line.encode())
        k += 1
    for f in files:
        f.close()
    return [str(p) for p in sorted(directory.glob("*.jsonl"))]


CEILING = textwrap.dedent("""
    import json, resource, sys, time
    from tokenizers import Tokenizer
    files, batch_chars = json.loads(sys.argv[1]), int(sys.argv[2])
    texts = [json.loads(line)["text"] for f in files for line in open(f, encoding="utf-8")]
    batches, cur, n = [], [], 0
    for t in texts:
        cur.append(t); n += len(t)
        if n >= batch_chars or len(cur) >= 1024:
            batches.append(cur); cur, n = [], 0
    batches.append(cur)
    tok = Tokenizer.from_file(sys.argv[3])
    out = {}
    for name in ("encode_batch_fast", "encode_batch"):
        fn = getattr(tok, name)
        t, c = time.perf_counter(), time.process_time()
        n_tokens = 0
        for b in batches:  # encode only: ids not even read; each batch freed before the next
            n_tokens += sum(map(len, fn(b, add_special_tokens=False)))
        out[name] = (time.perf_counter() - t, time.process_time() - c)
    out["tokens"] = n_tokens
    out["rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps(out))
""")

STAGE = textwrap.dedent("""
    import json, os, resource, shutil, sys, tempfile, time
    from pathlib import Path
    from packer.preprocess import readers
    from packer.config import BuildConfig
    from packer.preprocess.executors import make_executor
    from packer.preprocess.pipeline import _tokenize_stage
    from packer.encode.tokenizer import tokenizer_info
    files, workers, mode = json.loads(sys.argv[1]), int(sys.argv[2]), sys.argv[4]
    config = BuildConfig(unit_bytes=int(sys.argv[5]))
    def cpu():
        return sum(getattr(resource.getrusage(who), f) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)
                   for f in ("ru_utime", "ru_stime"))
    t, c = time.perf_counter(), cpu()
    units = readers.plan_units(files, config.unit_bytes)
    if mode == "startup":  # the fixed cost: pool start, imports and tokenizer load in each worker
        executor = make_executor(workers)
        executor.map(tokenizer_info, [(sys.argv[3], config)] * workers)
        executor.close()
        out = {"seconds": time.perf_counter() - t, "cpu": cpu() - c, "tokens": 0}
    elif mode == "read":
        skips = readers.SkipLog.empty()
        n = sum(1 for u in units for _ in readers.read_unit(u, skips, max_doc_bytes=config.max_doc_bytes))
        out = {"seconds": time.perf_counter() - t, "cpu": cpu() - c, "tokens": 0}
    else:
        work = Path(tempfile.mkdtemp())
        info = tokenizer_info(sys.argv[3], config)
        executor = make_executor(workers)
        try:
            counters = _tokenize_stage(units, info, config, work, executor)
            seconds = time.perf_counter() - t
            # Pool workers are the forkserver's children, not ours: read their CPU and peak RSS
            # from /proc before the pool closes (Linux).
            pids = [p.pid for p in (getattr(executor, "_pool", None) and executor._pool._processes or {}).values()]
            worker_cpu = sum(sum(int(x) for x in open(f"/proc/{p}/stat").read().rsplit(")", 1)[1].split()[11:13])
                             for p in pids) / os.sysconf("SC_CLK_TCK")
            worker_rss = [int(line.split()[1]) for p in pids for line in open(f"/proc/{p}/status")
                          if line.startswith("VmHWM")]
        finally:
            executor.close()
        out = {"seconds": seconds, "cpu": cpu() - c + worker_cpu, "tokens": sum(u["tokens"] for u in counters)}
        shutil.rmtree(work)
    rss = [resource.getrusage(resource.RUSAGE_SELF).ru_maxrss] + (worker_rss if mode == "stage" else [])
    out["rss_mb"] = max(rss) / 1024
    print(json.dumps(out))
""")


def _run(code: str, args: list[str], threads: int) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "RAYON_NUM_THREADS": str(threads),
           "TOKENIZERS_PARALLELISM": "true" if threads > 1 else "false"}
    proc = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=env)
    if proc.returncode:
        raise SystemExit(proc.stderr)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _datasets_row(files, workers: int):
    try:
        import datasets  # noqa: F401
    except ImportError:
        return None
    code = textwrap.dedent("""
        import json, sys, time
        import datasets
        from tokenizers import Tokenizer
        files, workers, path = json.loads(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
        datasets.disable_progress_bars()
        t, c = time.perf_counter(), time.process_time()
        ds = datasets.load_dataset("json", data_files=files, split="train", cache_dir=sys.argv[4])
        tok = Tokenizer.from_file(path)
        def enc(batch):
            return {"ids": [e.ids for e in tok.encode_batch_fast(batch["text"], add_special_tokens=False)]}
        ds = ds.map(enc, batched=True, num_proc=workers, remove_columns=ds.column_names)
        seconds = time.perf_counter() - t
        import resource
        cpu = time.process_time() - c + sum(getattr(resource.getrusage(resource.RUSAGE_CHILDREN), f) for f in ("ru_utime", "ru_stime"))
        rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
        print(json.dumps({"seconds": seconds, "cpu": cpu, "tokens": sum(map(len, ds["ids"])), "rss_mb": rss}))
    """)
    with tempfile.TemporaryDirectory() as cache:
        return _run(code, [json.dumps(files), str(workers), TOKENIZER, cache], 1)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mb", type=float, default=50, help="corpus size in MB (default 50)")
    parser.add_argument("--workers", default="1,2", help="worker counts to time (default 1,2)")
    parser.add_argument("--repeat", type=int, default=1, help="time ceiling and stage this many times, "
                        "interleaved, and keep each one's best (steadier on a busy machine)")
    parser.add_argument("--smoke", action="store_true", help="the smallest run (seconds; tests/test_benchmarks.py runs it)")
    args = parser.parse_args()
    if args.smoke:
        args.mb, args.workers, args.repeat = 0.5, "1", 1
    import numpy
    import pyarrow
    import tokenizers

    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, {platform.platform()}")
    print(f"python {platform.python_version()}, tokenizers {tokenizers.__version__}, "
          f"pyarrow {pyarrow.__version__}, numpy {numpy.__version__}")
    with tempfile.TemporaryDirectory() as tmp:
        files = make_corpus(Path(tmp), int(args.mb * 1e6))
        size = sum(os.path.getsize(f) for f in files)
        unit_bytes = max(size // (4 * N_FILES), 1 << 20)  # several units per worker, as on a real corpus
        print(f"corpus: {size / 1e6:.1f} MB JSONL in {len(files)} files, units of {unit_bytes / 1e6:.1f} MB, "
              f"tokenizer {Path(TOKENIZER).name}")
        print(f"{'case':<34}{'cores':>6}{'seconds':>9}{'MB/s':>8}{'Mtok/s':>8}{'ratio':>7}"
              f"{'cpu s':>8}{'cpu ratio':>10}{'peak RSS MB':>13}")

        def row(name, cores, r, ceiling=None):
            ratio = f"{ceiling['seconds'] / r['seconds']:.3f}" if ceiling else "-"
            cpu_ratio = f"{ceiling['cpu'] / r['cpu']:.3f}" if ceiling else "-"
            print(f"{name:<34}{cores:>6}{r['seconds']:>9.2f}{size / r['seconds'] / 1e6:>8.2f}"
                  f"{r['tokens'] / r['seconds'] / 1e6:>8.3f}{ratio:>7}{r['cpu']:>8.1f}{cpu_ratio:>10}"
                  f"{r['rss_mb']:>13.0f}", flush=True)

        read = _run(STAGE, [json.dumps(files), "1", TOKENIZER, "read", str(unit_bytes)], 1)
        row("read + JSON parse only", 1, read)
        for workers in map(int, args.workers.split(",")):
            ceilings, stages = [], []
            for _ in range(args.repeat):
                ceilings.append(_run(CEILING, [json.dumps(files), str(BATCH_CHARS), TOKENIZER], workers))
                stages.append(_run(STAGE, [json.dumps(files), str(workers), TOKENIZER, "stage", str(unit_bytes)], 1))
            ceiling = ceilings[0]
            fast = _best([{**c, "seconds": c["encode_batch_fast"][0], "cpu": c["encode_batch_fast"][1]} for c in ceilings])
            slow = _best([{**c, "seconds": c["encode_batch"][0], "cpu": c["encode_batch"][1]} for c in ceilings])
            stage = _best(stages)
            row("ceiling: encode_batch_fast", workers, fast, fast)
            row("ceiling: encode_batch", workers, slow, fast)
            row(f"stage --workers {workers}", workers, stage, fast)
            if workers > 1:
                startup = _run(STAGE, [json.dumps(files), str(workers), TOKENIZER, "startup", str(unit_bytes)], 1)
                print(f"  of which pool start-up (workers started, tokenizer loaded): {startup['seconds']:.2f} s")
            assert stage["tokens"] == ceiling["tokens"] + len_docs(files), "stage and ceiling disagree"
        hf = _datasets_row(files, 2)
        if hf is None:
            print("datasets: not importable, row skipped (pip install datasets to add it)")
        else:
            row("datasets Dataset.map num_proc=2", 2, hf, fast)
        print("ratio = ceiling seconds / row seconds, ceiling = encode_batch_fast on the same cores (target >= 0.90);")
        print("cpu ratio = the same in CPU seconds (process + children), steadier on a shared machine")


def _best(runs: list[dict]) -> dict:
    return {**runs[0], "seconds": min(r["seconds"] for r in runs), "cpu": min(r["cpu"] for r in runs),
            "rss_mb": max(r["rss_mb"] for r in runs)}


def len_docs(files) -> int:
    """One eos per document: the stage's token count exceeds the ceiling's by this."""
    return sum(1 for f in files for _ in open(f, encoding="utf-8"))


if __name__ == "__main__":
    main()
