"""How much memory does one huge document cost a build? Peak RSS of the build's process tree against the document's size.

    python benchmarks/bench_huge_doc.py                          # every case, a 200 MB document each
    python benchmarks/bench_huge_doc.py --mb 20 --cases jsonl    # quicker

Cases, each one huge document between two small ones:

    jsonl           one JSONL line {"text": "<document>"} (the issue's figure)
    txt             a .txt file that is the document (--text-split file)
    records         one prompt/completion JSONL record, the document its completion (--input-kind prompt-completion)
    chat            one chat JSONL record, the document its assistant message's content (--input-kind chat)
    parquet         a Parquet file whose text column holds the document (pyarrow's default: dictionary-encoded)
    parquet-plain   the same written with use_dictionary=False
    arrow           an Arrow IPC file whose text column holds the document
    chat-parquet    a Parquet file of chats (a nested messages column), the document one assistant content
    chat-arrow      the same as an Arrow IPC file

The document is sample_data text (prose and code), repeated with a varying number until it is
--mb MB. Each case runs `packer build --workers 1 --max-doc-bytes <above it>` in a fresh
process, and once more over the same case with the huge document replaced by a 1 KB one: the
baseline (interpreter, imports, tokenizer, the report at the end). The peak is that of the whole
process tree: the largest of the build's own peak (VmHWM), its children's maxrss, and the sum of
the tree's RSS sampled every 20 ms from /proc. Printed per case: peak RSS, the growth over the baseline, and
peak/doc, the figure the issue bounds (target: at most 2). doc MB is the document as stored
(JSON-escaped on a line; a Parquet file's string value).

2026-12-04, shared 2-core x86_64 box (glibc 2.36), python 3.11, pyarrow 26.0.1, sample_data tokenizer,
--mb 200 (MB are MiB; before: main d461465, or for Parquet main f292907 (pyarrow's reading); after:
this code; baseline builds 138-160 MB):

    case            doc MB   peak MB before -> after   peak/doc before -> after
    jsonl            193.4            701 ->  347              3.63 -> 1.79
    txt              192.3            369 ->  342              1.92 -> 1.78
    records          193.4           1503 ->  335              7.77 -> 1.73
    chat             193.4           3469 ->  329             17.94 -> 1.70   (before: main 859e46e)
    parquet          192.3            993 ->  317              5.16 -> 1.65
    parquet-plain    192.3            799 ->  318              4.16 -> 1.65
    arrow            192.3            527 ->  345              2.74 -> 1.80   (before: main 859e46e)
    chat-parquet     192.3           3954 ->  337             20.56 -> 1.75   (before: main 38e3642; 744, 3.87 on e7bf6cd)
    chat-arrow       192.3           3552 ->  366             18.47 -> 1.90   (before: main 38e3642)

Each case now holds the document once while it is encoded a 1 MiB piece at a time: JSONL, txt,
records and chat in the line's or file's own buffer (a chat rendered with a stand-in for the long
content, packer/encode/chat_long.py; it rendered and encoded the whole conversation as a str before); Parquet in its page, decompressed by packer's own page
reader (packer/preprocess/readers/parquet/pages.py) into one buffer the value is handed on over.
An Arrow IPC file is memory-mapped and its value handed on as a slice of the column's data buffer
(a pyarrow scalar of it copied the 200 MB out of the map); a nested value (a chat's content) too,
the chat then streamed as from JSONL. A Parquet chat's messages column (list<struct<role, content>>)
is read by the page reader too, its rows put together from the leaves' levels
(packer/preprocess/readers/parquet/page_levels.py): 744 MB (3.87) while pyarrow read the nested chunk,
337 (1.75) now, the build 58.7 s against 44.7 s (snappy_pieces, as below; both run back to back,
2026-12-04). pyarrow held the compressed chunk (memory-mapped), the page and the decoded array side
by side (a dictionary page: also a dense copy). Both Parquet cases are Snappy (pyarrow's default): one-shot
decompression alone would hold the 87 MiB compressed page beside the output (405 MB, 2.1x, with a
20 MB higher baseline then), so a huge Snappy page is decompressed a piece at a time (snappy_pieces:
reading Snappy's tags in Python, the build 29.7 s against 23.5 s before), gzip, zstd and brotli
pages as a stream (page_streams). Written with zstd, or uncompressed, the same value peaked at 335
and 330 MB (before merging f292907's lower baseline), and as the completion of a Parquet
prompt/completion record at 318 MB (1269 MB on main f292907) (builds reading their own VmHWM, not
this script).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TOKENIZER = str(ROOT / "sample_data" / "tokenizer.json")
CASES = ("jsonl", "txt", "records", "chat", "parquet", "parquet-plain", "arrow", "chat-parquet", "chat-arrow")
SAMPLE_SECONDS = 0.02

RUN = """
import resource, sys
from packer.cli import main
try:
    main(sys.argv[1:])
except SystemExit as e:
    if e.code:
        raise
# VmHWM: this process's own peak (ru_maxrss starts at the RSS of the process it was forked from)
print("maxrss_kb", next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmHWM:")),
      resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
"""


def sample_text() -> str:
    texts = []
    for name in ("prose.jsonl", "code.jsonl"):
        with open(ROOT / "sample_data" / name, encoding="utf-8") as f:
            texts.extend(json.loads(line)["text"] for line in f)
    return "\n\n".join(texts)


def _chunks(doc_bytes: int, escaped: bool):
    """Pieces of the document as UTF-8 bytes (JSON-escaped, without quotes, when `escaped`), about doc_bytes in all."""
    base, n, k = sample_text(), 0, 0
    while n < doc_bytes:
        text = f"{base} ({k})\n"
        chunk = (json.dumps(text, ensure_ascii=False)[1:-1] if escaped else text).encode("utf-8")
        yield chunk
        n, k = n + len(chunk), k + 1


def write_corpus(path: Path, doc_bytes: int) -> int:
    """before / a doc_bytes line / after; returns the huge line's length in bytes."""
    return _write_jsonl(path, doc_bytes, b'{"text": "', b'"}\n', b'{"text": "before"}\n', b'{"text": "after"}\n')


def _write_jsonl(path: Path, doc_bytes: int, head: bytes, tail: bytes, before: bytes, after: bytes) -> int:
    n = 0
    with open(path, "wb") as f:
        f.write(before + head)
        for chunk in _chunks(doc_bytes, escaped=True):
            f.write(chunk)
            n += len(chunk)
        f.write(tail + after)
    return n


def write_case(case: str, d: Path, doc_bytes: int) -> tuple[Path, int, list[str]]:
    """(the input, the document's bytes as stored, extra build arguments) of one case."""
    if case == "jsonl":
        return d / "in.jsonl", write_corpus(d / "in.jsonl", doc_bytes), []
    if case == "records":
        record = b'{"prompt": "Write it out: ", "completion": "'
        n = _write_jsonl(d / "in.jsonl", doc_bytes, record, b'"}\n', b'{"prompt": "a", "completion": "before"}\n',
                         b'{"prompt": "b", "completion": "after"}\n')
        return d / "in.jsonl", n, ["--input-kind", "prompt-completion"]
    if case == "chat":
        head = b'{"messages": [{"role": "user", "content": "Write it out."}, {"role": "assistant", "content": "'
        short = b'{"messages": [{"role": "user", "content": "%s"}, {"role": "assistant", "content": "ok"}]}\n'
        n = _write_jsonl(d / "in.jsonl", doc_bytes, head, b'"}]}\n', short % b"before", short % b"after")
        return d / "in.jsonl", n, ["--input-kind", "chat"]
    if case == "txt":
        n = 0
        with open(d / "in.txt", "wb") as f:
            for chunk in _chunks(doc_bytes, escaped=False):
                f.write(chunk)
                n += len(chunk)
        return d / "in.txt", n, []
    if case in ("parquet", "parquet-plain", "arrow", "chat-parquet", "chat-arrow"):
        doc = b"".join(_chunks(doc_bytes, escaped=False)).decode("utf-8")
        if case.startswith("chat"):
            def chat(content):
                return [{"role": "user", "content": "Write it out."}, {"role": "assistant", "content": content}]

            columns, extra = {"messages": [chat("before"), chat(doc), chat("after")]}, ["--input-kind", "chat"]
        else:
            columns, extra = {"text": ["before", doc, "after"]}, []
        path = d / ("in.arrow" if case.endswith("arrow") else "in.parquet")
        _write_table(path, columns, use_dictionary=case == "parquet")
        return path, len(doc.encode("utf-8")), extra
    raise SystemExit(f"unknown case {case!r} (cases: {', '.join(CASES)})")


def _write_table(path: Path, columns: dict, use_dictionary: bool):
    """A Parquet file (pyarrow's defaults: Snappy; dictionary-encoded or not) or an Arrow IPC file."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.table(columns)
    if path.suffix == ".parquet":
        pq.write_table(table, path, use_dictionary=use_dictionary)
        return
    with pa.OSFile(str(path), "wb") as f, pa.ipc.new_file(f, table.schema) as w:
        w.write_table(table)


def write_case_apart(case: str, d: Path, doc_bytes: int) -> tuple[Path, int, list[str]]:
    """write_case in a child process: this one stays small (a build forked from it would start its
    maxrss at this process's RSS: Linux keeps the high-water mark across exec)."""
    code = (f"import sys, json; sys.path.insert(0, {str(ROOT / 'benchmarks')!r}); from bench_huge_doc import write_case; "
            f"from pathlib import Path; p, n, extra = write_case({case!r}, Path({str(d)!r}), {doc_bytes}); "
            "print(json.dumps([str(p), n, extra]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    path, n, extra = json.loads(out.splitlines()[-1])
    return Path(path), n, extra


def _tree_rss_kb(pid: int) -> int:
    """Sum of VmRSS over `pid` and its descendants (0 once it is gone)."""
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        try:
            with open(f"/proc/{p}/status") as f:
                total += next((int(line.split()[1]) for line in f if line.startswith("VmRSS:")), 0)
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as f:
                    todo += [int(c) for c in f.read().split()]
        except (OSError, ValueError):
            pass
    return total


def run_build(corpus: Path, out: Path, max_doc_bytes: int, extra: list[str]) -> tuple[float, float]:
    """(peak RSS of the process tree in MiB, seconds) of `packer build` over `corpus`, in a fresh process."""
    args = ["build", str(corpus), "--tokenizer", TOKENIZER, "--output", str(out), "--workers", "1",
            "--max-doc-bytes", str(max_doc_bytes), "--quiet", *extra]
    t = time.perf_counter()
    # cwd ROOT: `python -c` puts the working directory first on sys.path, so run from another
    # checkout it would measure that checkout's packer, PYTHONPATH notwithstanding
    proc = subprocess.Popen([sys.executable, "-c", RUN, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env={**os.environ, "PYTHONPATH": str(ROOT)}, cwd=ROOT)
    sampled = [0]

    def sample():
        while proc.poll() is None:
            sampled[0] = max(sampled[0], _tree_rss_kb(proc.pid))
            time.sleep(SAMPLE_SECONDS)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    stdout, stderr = proc.communicate()
    sampler.join()
    seconds = time.perf_counter() - t
    if proc.returncode or "maxrss_kb" not in stdout:
        raise SystemExit(f"build failed:\n{stdout}\n{stderr}")
    own, children = map(int, stdout.rsplit("maxrss_kb", 1)[1].split())
    return max(own, children, sampled[0]) / 1024, seconds


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mb", type=float, default=200, help="the document's size in MB (default 200)")
    parser.add_argument("--cases", default=",".join(CASES), help=f"comma-separated, of {', '.join(CASES)} (default all)")
    parser.add_argument("--keep", type=Path, help="build into this directory (one folder per case) and keep it")
    parser.add_argument("--smoke", action="store_true", help="the smallest run (seconds; tests/test_benchmarks.py runs it)")
    args = parser.parse_args()
    if args.smoke:
        args.mb = 1.0
    cases = [c for c in args.cases.split(",") if c]
    import pyarrow
    import tokenizers

    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, {platform.platform()}")
    print(f"python {platform.python_version()}, tokenizers {tokenizers.__version__}, pyarrow {pyarrow.__version__}; "
          f"packer from {ROOT}; tokenizer {Path(TOKENIZER).name}; --mb {args.mb:g}")
    print(f"{'case':<15}{'doc MB':>8}{'seconds':>9}{'base MB':>9}{'peak MB':>9}{'growth MB':>11}{'peak/doc':>10}",
          flush=True)
    for case in cases:
        with tempfile.TemporaryDirectory() as tmp:
            tmp = Path(tmp)
            outs = (args.keep.resolve() / case) if args.keep else tmp
            (tmp / "small").mkdir()
            (tmp / "huge").mkdir()
            small, _, extra = write_case_apart(case, tmp / "small", 1000)
            huge, doc, _ = write_case_apart(case, tmp / "huge", int(args.mb * 1e6))
            limit = doc + (1 << 20)
            base_mb, _ = run_build(small, outs / "out-small", limit, extra)
            peak_mb, seconds = run_build(huge, outs / "out-huge", limit, extra)
            accepted = json.loads((outs / "out-huge" / "manifest.json").read_text())["totals"]["docs_accepted"]
        if accepted != (1 if case == "txt" else 3):  # a .txt file is one document
            raise SystemExit(f"{case}: {accepted} documents accepted")
        doc_mb = doc / 2**20
        print(f"{case:<15}{doc_mb:>8.1f}{seconds:>9.1f}{base_mb:>9.0f}{peak_mb:>9.0f}{peak_mb - base_mb:>11.0f}"
              f"{peak_mb / doc_mb:>10.2f}", flush=True)
    print("MB are MiB; peak/doc = peak RSS of the process tree / the document's bytes; target <= 2")


if __name__ == "__main__":
    main()
