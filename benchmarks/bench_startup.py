"""Where a tiny build's time goes: `packer build` of three documents, each run a fresh interpreter, its
wall time split into the pieces every packer process pays before it encodes (issue 38 item 4).

    python benchmarks/bench_startup.py                      # sample tokenizer, 7 runs
    python benchmarks/bench_startup.py --tokenizer PATH --runs 11 --workers 2

Each run is `python -c CHILD`: the child wraps the named functions with perf_counter, runs the CLI's
build, and prints what each took; the parent times the whole process from outside, and a bare
`python -c pass` alongside, in turn. A single-unit build runs in the driver, so the figures are one
process's: a pool worker pays the same imports, tokenizer load, ranks, encoder and probe again.

2026-12-06, this box (2 cores shared with other work, load 2.6), 50,000-token GPT-2-style tokenizer,
bytecode cached, medians of 9, two runs each: whole process 0.56 / 0.59 s (min 0.50) against 0.81 / 0.82
for the code before the issue-38 start-up work (3e41ff1: the probe's get_vocab, three passes over the
merges, three reads of tokenizer.json, tqdm and pyarrow.parquet imported, the interpreter's teardown at
exit). What is left, in that run: imports 0.19, tokenizer load 0.09, ranks 0.09, encoder 0.02, probe
0.015, the stages 0.06, interpreter start 0.04. With PYTHONDONTWRITEBYTECODE=1 (this workplace sets it)
every packer module is compiled at each start, about 0.1 s more; the table's first line says which.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "sample_data"
RUNS, WORKERS, CONTEXT, DOCS = 7, 2, 128, 3

# (label, module, attribute): what the child times, each the whole call (nested calls included)
PIECES = (
    ("tokenizer load", "packer.encode.tokenizer", "_loaded"),
    ("engine ranks (parse, merges, ranks)", "packer.encode.engines.byte_level", "ranked_vocab_at"),
    ("probe", "packer.encode.engines", "probe_difference"),
    ("tokenizer_info (all four)", "packer.preprocess.pipeline", "tokenizer_info"),
    ("tokenize stage", "packer.preprocess.pipeline", "_tokenize_stage"),
    ("plan stage", "packer.preprocess.pipeline", "_plan_stage"),
    ("write stage", "packer.preprocess.pipeline", "_write_stage"),
    ("finalize", "packer.preprocess.pipeline", "_finalize"),
    ("build() (all)", "packer.preprocess.pipeline", "build"),
)

CHILD = r'''
import functools, importlib, json, sys, time
T0 = time.perf_counter()
took = {}
t = time.perf_counter(); import packer.cli, packer.preprocess.pipeline; took["imports"] = time.perf_counter() - t

def timed(label, f):
    @functools.wraps(f)
    def run(*a, **k):
        t = time.perf_counter()
        try:
            return f(*a, **k)
        finally:
            took[label] = took.get(label, 0) + time.perf_counter() - t
    if hasattr(f, "cache_clear"):
        run.cache_clear = f.cache_clear
    return run

for label, module, name in PIECES:
    mod = importlib.import_module(module)
    if hasattr(mod, name):  # a renamed stage is left out, not an error
        setattr(mod, name, timed(label, getattr(mod, name)))
import packer.encode.engines.tiktoken_bpe as tb
init = tb.Encoder.__init__
def encoder_init(self, *a, **k):
    t = time.perf_counter(); init(self, *a, **k); took["encoder (tiktoken CoreBPE)"] = time.perf_counter() - t
tb.Encoder.__init__ = encoder_init
import atexit
atexit.register(lambda: print("TIMES " + json.dumps({**took, "in process (all)": time.perf_counter() - T0}), flush=True))
sys.argv = ARGV
packer.cli.main()  # as `packer build ...` runs it: the process may end in it (cli._end_process runs atexit)
'''


def _child(argv: list[str]) -> str:
    return f"PIECES = {PIECES!r}\nARGV = {argv!r}\n" + CHILD


def _run(cmd: list[str], env: dict) -> tuple[float, str]:
    t = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
    wall = time.perf_counter() - t
    if done.returncode:
        raise SystemExit(f"{' '.join(cmd[:2])}... failed:\n{done.stderr[-2000:]}")
    return wall, done.stdout


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokenizer", default=str(SAMPLE / "tokenizer.json"))
    ap.add_argument("--runs", type=int, default=RUNS)
    ap.add_argument("--workers", type=int, default=WORKERS)
    ap.add_argument("--smoke", action="store_true", help="one run (seconds)")
    a = ap.parse_args()
    runs = 1 if a.smoke else a.runs
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cached = not (env.get("PYTHONDONTWRITEBYTECODE") or sys.flags.dont_write_bytecode)
    print(f"# {platform.python_implementation()} {platform.python_version()}, {os.cpu_count()} cores, load "
          f"{os.getloadavg()[0]:.2f}; tokenizer {a.tokenizer}; {DOCS} documents, --workers {a.workers}, "
          f"--context-length {CONTEXT}, --quiet; bytecode {'cached' if cached else 'compiled at each start (PYTHONDONTWRITEBYTECODE)'}")
    with tempfile.TemporaryDirectory(prefix="packer-startup-") as tmp:
        docs = Path(tmp) / "three.jsonl"
        docs.write_text("".join((SAMPLE / "prose.jsonl").read_text(encoding="utf-8").splitlines(True)[:DOCS]),
                        encoding="utf-8")
        walls, bare, pieces = [], [], {}
        for i in range(runs + 1):  # the first is a warm-up (page cache, bytecode), not counted
            out = str(Path(tmp) / f"out-{i}")
            argv = ["packer", "build", str(docs), "-o", out, "--tokenizer", a.tokenizer, "--context-length", str(CONTEXT),
                    "--workers", str(a.workers), "--quiet"]
            wall, stdout = _run([sys.executable, "-c", _child(argv)], env)
            start, _ = _run([sys.executable, "-c", "pass"], env)
            if i == 0:
                continue
            walls.append(wall)
            bare.append(start)
            took = json.loads(next(line for line in stdout.splitlines() if line.startswith("TIMES "))[6:])
            for k, v in took.items():
                pieces.setdefault(k, []).append(v)
    whole = statistics.median(walls)
    rows = [("whole process (wall, from outside)", walls), ("interpreter start (python -c pass)", bare),
            *((k, v) for k, v in pieces.items())]
    print(f"{'piece':<40} {'median s':>9} {'min s':>7} {'share':>6}")
    for label, values in rows:
        print(f"{label:<40} {statistics.median(values):9.3f} {min(values):7.3f} {statistics.median(values) / whole:6.0%}")
    print("(nested pieces are inside the one below them: tokenizer_info holds the load, ranks, encoder and probe;"
          " build() holds tokenizer_info and the stages)")


if __name__ == "__main__":
    main()
