"""How much memory does one huge document cost a build? Peak RSS against the document's size.

    python benchmarks/bench_huge_doc.py             # one 200 MB JSONL line, the issue's figure
    python benchmarks/bench_huge_doc.py --mb 20     # quicker

The document is sample_data text (prose and code, JSON-escaped newlines and quotes), repeated
with a varying number until it is --mb MB, on one line of a JSONL file between two small
documents. `packer build --workers 1 --max-doc-bytes <above it>` runs in a fresh subprocess
(so its peak is its own), and once more over the same file with the huge line replaced by a
small one: the baseline (interpreter, imports, tokenizer). Printed: peak RSS of each, the growth
(peak - baseline) and its ratio to the document's bytes. Target: growth <= 3x the document.

2026-12-01, busy shared 2-core box, sample_data tokenizer (MB are MiB):

    document                 peak RSS   growth   growth/doc   peak/doc
    193.4 (default --mb)       665 MB    417 MB      2.16        3.44     (baseline 248 MB)
     49.8 (--mb 50)            323 MB     75 MB      1.50        6.48
     49.8, before (eeb7722)    528 MB    279 MB      5.60       10.59     (the issue: 200 MB -> 1,695 MB)

What is left at 200 MB: the line's bytes and Arrow's parse of it side by side (the JSON
parser's string builder grows by doubling), then the text's UTF-8 alone while it is encoded.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TOKENIZER = str(ROOT / "sample_data" / "tokenizer.json")

RUN = """
import resource, sys
from packer.cli import main
try:
    main(sys.argv[1:])
except SystemExit as e:
    if e.code:
        raise
print("maxrss_kb", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
"""


def sample_text() -> str:
    texts = []
    for name in ("prose.jsonl", "code.jsonl"):
        with open(ROOT / "sample_data" / name, encoding="utf-8") as f:
            texts.extend(json.loads(line)["text"] for line in f)
    return "\n\n".join(texts)


def write_corpus(path: Path, doc_bytes: int) -> int:
    """before / a doc_bytes line / after; returns the huge line's length in bytes."""
    base = sample_text()
    with open(path, "wb") as f:
        f.write(b'{"text": "before"}\n{"text": "')
        n, k = 0, 0
        while n < doc_bytes:
            chunk = json.dumps(f"{base} ({k})\n", ensure_ascii=False)[1:-1].encode("utf-8")
            f.write(chunk)
            n, k = n + len(chunk), k + 1
        f.write(b'"}\n{"text": "after"}\n')
    return n


def run_build(corpus: Path, out: Path, max_doc_bytes: int) -> tuple[float, float]:
    """(peak RSS in MB, seconds) of `packer build` over `corpus`, in a fresh process."""
    args = ["build", str(corpus), "--tokenizer", TOKENIZER, "--output", str(out), "--workers", "1",
            "--max-doc-bytes", str(max_doc_bytes), "--quiet"]
    t = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", RUN, *args], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    seconds = time.perf_counter() - t
    if proc.returncode or "maxrss_kb" not in proc.stdout:
        raise SystemExit(f"build failed:\n{proc.stdout}\n{proc.stderr}")
    return int(proc.stdout.rsplit("maxrss_kb", 1)[1]) / 1024, seconds


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mb", type=float, default=200, help="the document's size in MB (default 200)")
    args = parser.parse_args()
    import pyarrow
    import tokenizers

    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, {platform.platform()}")
    print(f"python {platform.python_version()}, tokenizers {tokenizers.__version__}, pyarrow {pyarrow.__version__}")
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        doc = write_corpus(tmp / "huge.jsonl", int(args.mb * 1e6))
        write_corpus(tmp / "small.jsonl", 1000)
        limit = doc + (1 << 20)
        print(f"document: {doc / 1e6:.1f} MB on one JSONL line, --max-doc-bytes {limit:,}, tokenizer "
              f"{Path(TOKENIZER).name}")
        base_mb, base_s = run_build(tmp / "small.jsonl", tmp / "out-small", limit)
        peak_mb, seconds = run_build(tmp / "huge.jsonl", tmp / "out-huge", limit)
        manifest = json.loads((tmp / "out-huge" / "manifest.json").read_text())
        tokens = manifest["totals"]["tokens_in"]
    doc_mb = doc / 2**20
    print(f"{'case':<22}{'doc MB':>9}{'seconds':>9}{'peak RSS MB':>13}{'growth MB':>11}{'growth/doc':>12}"
          f"{'peak/doc':>10}")
    print(f"{'baseline (1 KB doc)':<22}{0:>9.1f}{base_s:>9.1f}{base_mb:>13.0f}{0:>11.0f}{'-':>12}{'-':>10}")
    print(f"{'one huge document':<22}{doc_mb:>9.1f}{seconds:>9.1f}{peak_mb:>13.0f}{peak_mb - base_mb:>11.0f}"
          f"{(peak_mb - base_mb) / doc_mb:>12.2f}{peak_mb / doc_mb:>10.2f}")
    print(f"tokens of the build: {tokens:,}; MB are MiB; target growth/doc <= 3")


if __name__ == "__main__":
    main()
