"""Where does a build's time go: the engine's encode, or packer's own work around it?

    python benchmarks/bench_pipeline_split.py                 # 3 corpora x 3 tokenizers x 1, 2 workers
    python benchmarks/bench_pipeline_split.py --mb 60 --repeat 3
    python benchmarks/bench_pipeline_split.py --nfc 5         # also the NFC check, paired (packer/encode/nfc.py)
    python benchmarks/bench_pipeline_split.py --corpus DIR    # keep the corpora in DIR, or read them from there
    python benchmarks/bench_pipeline_split.py --markdown --json rows.json  # docs/engines.md's table; every row's columns
    python benchmarks/bench_pipeline_split.py --smoke         # seconds (tests/test_benchmarks.py runs it)

Corpora, made here from what this machine holds (deterministic on one machine; documents cut at
DOC_CHARS, about 11 KB as the issue's held-out set), each --mb of JSONL:

    english        /usr/share/doc (text, and HTML turned to text) and the English man pages
    code           the Python standard library's sources (tests left out: 13.2 MB of text on this
                   machine), then the installed packages' (site-packages, one file of each package in
                   turn; 279 MB more here)
    multilingual   man pages in every other language under /usr/share/man, and every installed
                   .mo catalog's translations (12.4 + 97.7 MB here)

A kind that runs out before --mb says so ("all this machine holds"), never silently smaller.

Tokenizers trained here on a sample of all three (`tokenizers`' BpeTrainer, --vocab tokens):
GPT-2 style (ByteLevel with its regex) and NFC Qwen 2 style (NFC, the Qwen 2 Split, ByteLevel), for
which `auto` picks tiktoken, and DeepSeek-V3 style (its tokenizer.json's three Splits: digits in
threes, CJK runs, words and punctuation; then ByteLevel without its regex), for which `auto` picks hf
(each row asserts the engine the manifest names).

Rows, per corpus, tokenizer and worker count (cores = workers x engine threads, the cores rule):

    encode_batch_fast   tokenizers over the same texts in memory, 1 MiB batches, RAYON_NUM_THREADS = cores
    engine alone        tiktoken's encode_ordinary_batch, the build's ranks and split regex, num_threads =
                        cores, the same batches (no NFC: for the Qwen tokenizer the normalization is
                        packer's work here). For hf (DeepSeek style) the engine alone IS encode_batch_fast
                        with the same threads: the row reuses the baseline's run, so its two ratios are
                        equal ("alone = batch_fast" on the line, in the markdown cell)
    build               the whole `packer build` process, split by stage, timed inside it:
        start-up          interpreter, imports, the tokenizer loaded and its engine probed, units cut
        tokenize          the stage (read, parse, hash, normalize, encode, unit files), and in it
                          "not the engine": the stage less the engine alone
        plan, write       the stages
        finish            stats, report, manifest, publish, exit

and the ratios: build / encode_batch_fast (the baseline's seconds over the build's: the issue's
targets >= 3.0 GPT-2 style, >= 2.5 Qwen NFC, >= 0.9 hf) and build / engine alone (the engine's
seconds over the build's, target >= 0.85). With --repeat N each row runs N times in rounds and each
ratio is the median of its rounds (paired: a round's rows ran minutes apart at most).

--markdown prints the rows as docs/engines.md's "Packer's own work, per corpus" table (ratios: the
median, and the rounds' range with --repeat; stages in seconds; "tokenize (not the engine)": the
stage, and the stage less the engine alone); --json PATH writes every row with all its columns and
each round's ratios.

Figures: docs/engines.md "Packer's own work, per corpus" (2026-12-06, load 1.1, `--corpus DIR --repeat 2
--markdown`; at 2 workers GPT-2 style 3.36 / 3.03 / 3.18x encode_batch_fast on english / code /
multilingual, Qwen NFC 3.64 / 3.31 / 3.35, hf 0.94 / 0.90 / 0.89, build / engine alone 0.90-0.97).
The kept corpora (written once, `--corpus DIR --mb 60`): english 62.2 MB of JSONL (7,066 documents), code 62.5 MB (8,274), multilingual 62.0 MB (6,682).

Check run of the hf row, 2026-12-05, a loaded machine (load 5.9 on 2 shared cores, so the figures
only show the row works), `--mb 4 --repeat 1 --tokenizers deepseek --workers 2`: build /
encode_batch_fast 0.36 english, 0.59 code, 0.40 multilingual; at 4 MB the fixed work (start-up
0.8-1.4 s) weighs far more than at 60.

--nfc, 2026-12-05, a loaded machine (load 5.8 on 2 shared cores), `--nfc 5 --mb 4 --vocab 20000
--tokenizers qwen --corpora english,multilingual --workers 1`: the tiktoken engine's encode with the
NFC check took 0.92 (0.79-1.15) of its time before on english (4.1 M characters, 0.7 M of them in
texts that are not ASCII) and 0.79 (0.61-0.95) on multilingual (3.2 M, 2.9 M); normalizing alone
0.03 -> 0.00 s and 0.26 -> 0.10 s.
"""

from __future__ import annotations

import argparse
import gzip
import html.parser
import itertools
import json
import os
import platform
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
import bench_engines  # noqa: E402  (corpus families, the tokenizer trainer, the baseline)

DOC_CHARS = 11_000
N_FILES = 4
SEED_SAMPLE = 8  # train on every SEED_SAMPLE-th document

# --tokenizers name -> its label here, its name in docs/engines.md's table, and the engine `auto` must pick for it
TOKENIZERS = {
    "gpt2": {"label": "gpt2-style", "doc": "GPT-2 style", "engine": "tiktoken"},
    "qwen": {"label": "qwen-style NFC", "doc": "Qwen 2 style, NFC", "engine": "tiktoken"},
    "deepseek": {"label": "deepseek-style", "doc": "DeepSeek-V3 style (3 Splits)", "engine": "hf"},
}


class _Text(html.parser.HTMLParser):
    def __init__(self):
        super().__init__()
        self.parts, self._skip = [], 0

    def handle_starttag(self, tag, attrs):
        self._skip += tag in ("script", "style")

    def handle_endtag(self, tag):
        self._skip -= tag in ("script", "style") and self._skip > 0

    def handle_data(self, data):
        if not self._skip:
            self.parts.append(data)


def _html_text(raw: str) -> str:
    parser = _Text()
    parser.feed(raw)
    return "\n".join(line.strip() for line in "".join(parser.parts).splitlines() if line.strip())


def _english():
    docs = (_html_text(t) if "<html" in t[:2000].lower() else t for t in bench_engines._docs())
    man = (t for t in _man_pages(english=True))
    return _round_robin(docs, man)


def _man_pages(english: bool):
    root = Path("/usr/share/man")
    for path in sorted(root.rglob("*.gz")):
        if (path.relative_to(root).parts[0].startswith("man")) != english:
            continue
        try:
            raw = gzip.decompress(path.read_bytes()).decode("utf-8")
        except (OSError, UnicodeDecodeError, EOFError):
            continue
        yield "\n".join(bench_engines._TROFF.sub("", line) for line in raw.splitlines() if not line.startswith('.\\"'))


def _round_robin(*families):
    families = list(families)
    while families:
        for family in list(families):
            text = next(family, None)
            if text is None:
                families.remove(family)
            else:
                yield text


def _package_sources():
    """The installed packages' Python sources (site-packages, tests left out), one file of each top-level
    package in turn: the standard library alone is about 13 MB here, short of the issue's 60."""
    root = Path(sysconfig.get_paths()["purelib"])
    packages = sorted(p for p in root.iterdir() if p.is_dir() and not p.name.endswith((".dist-info", ".egg-info")))
    return _round_robin(*(_sources(p) for p in packages))


def _sources(root: Path):
    for path in sorted(root.rglob("*.py")):
        if not {"test", "tests"} & set(path.relative_to(root).parts):
            try:
                yield path.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError):
                continue


CORPORA = {
    "english": _english,
    "code": lambda: itertools.chain(bench_engines._python_sources(), _package_sources()),
    "multilingual": lambda: _round_robin(_man_pages(english=False), bench_engines._translations()),
}


def write_corpus(d: Path, kind: str, n_bytes: int) -> list[str]:
    """JSONL of `kind`'s documents (each at most DOC_CHARS), about n_bytes of UTF-8 text, in N_FILES files."""
    d.mkdir(parents=True, exist_ok=True)
    files = [open(d / f"part-{i}.jsonl", "w", encoding="utf-8") for i in range(N_FILES)]
    written, k = 0, 0
    for text in CORPORA[kind]():
        for start in range(0, len(text), DOC_CHARS):
            doc = text[start:start + DOC_CHARS]
            if doc.strip():
                files[k % N_FILES].write(json.dumps({"text": doc}, ensure_ascii=False) + "\n")
                written += len(doc.encode("utf-8"))
                k += 1
        if written >= n_bytes:
            break
    for f in files:
        f.close()
    if written < n_bytes:
        print(f"corpus {kind}: {written / 1e6:.1f} MB of text, all this machine holds (asked for {n_bytes / 1e6:.1f} MB)")
    return [f.name for f in files]


ENGINE_ALONE = textwrap.dedent("""
    import json, sys, time
    import tiktoken
    from packer.encode.engines import byte_level
    files, path, threads = json.loads(sys.argv[1]), sys.argv[2], int(sys.argv[3])
""") + bench_engines.BATCHES + textwrap.dedent("""
    vocab = byte_level.ranked_vocab_at(path)
    enc = tiktoken.Encoding("alone", pat_str=byte_level.FAST_FORMS.get(vocab.pattern, vocab.pattern),
                            mergeable_ranks=vocab.ranks, special_tokens={})
    t = time.perf_counter()
    n_tokens = sum(sum(map(len, enc.encode_ordinary_batch(b, num_threads=threads))) for b in batches)
    print(json.dumps({"seconds": time.perf_counter() - t, "tokens": n_tokens}))
""")

# The build, in-process, each stage timed where pipeline.py calls it (module attributes looked up at
# call time); "t0" is when this script's first line ran, so the parent's wall less it is the interpreter's start.
BUILD = textwrap.dedent("""
    import time
    t0 = time.perf_counter()
    import json, sys
    marks = {}
    def timed(module, name, label):
        inner = getattr(module, name)
        def wrapper(*args, **kwargs):
            start = time.perf_counter()
            try:
                return inner(*args, **kwargs)
            finally:
                marks[label] = (start - t0, time.perf_counter() - t0)
        setattr(module, name, wrapper)
    from packer import cli
    from packer.preprocess import owned, pipeline
    for name, label in (("_tokenize_stage", "tokenize"), ("_plan_stage", "plan"), ("_write_stage", "write"),
                        ("_finalize", "finalize")):
        timed(pipeline, name, label)
    timed(owned, "publish", "publish")
    try:
        cli.main(sys.argv[1:], standalone_mode=False)
    finally:
        marks["end"] = (time.perf_counter() - t0,) * 2
        print(json.dumps(marks))
""")


# The NFC check (packer/encode/nfc.py) against what it replaced, paired in one process on one thread:
# the tiktoken engine's encode of each text with nfc_text, and with normalize_str on every non-ASCII text.
NFC_AB = textwrap.dedent("""
    import json, statistics, sys, time
    import numpy as np
    from packer.encode.nfc import nfc_text
    from packer.encode.tokenizer import load_encoder
    files, path, rounds = json.loads(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    texts = [json.loads(line)["text"] for f in files for line in open(f, encoding="utf-8")]
    enc = load_encoder(path, "tiktoken")
    normalize = enc._normalize
    def encode(text):
        return np.frombuffer(enc._core.encode_to_tiktoken_buffer(text, set()), np.uint32)
    def before(text):
        return encode(text if text.isascii() else normalize(text))
    def after(text):
        return encode(nfc_text(text, normalize))
    assert all(np.array_equal(before(t), after(t)) for t in texts)
    seconds = {"before": [], "after": []}
    for r in range(rounds):
        for label, f in [("before", before), ("after", after)][:: 1 if r % 2 == 0 else -1]:
            t = time.perf_counter()
            for text in texts:
                f(text)
            seconds[label].append(time.perf_counter() - t)
    t = time.perf_counter()
    for text in texts:
        text.isascii() or normalize(text)
    alone_before = time.perf_counter() - t
    t = time.perf_counter()
    for text in texts:
        nfc_text(text, normalize)
    alone_after = time.perf_counter() - t
    ratios = [a / b for a, b in zip(seconds["after"], seconds["before"])]
    print(json.dumps({"before": min(seconds["before"]), "after": min(seconds["after"]),
                      "ratio": statistics.median(ratios), "low": min(ratios), "high": max(ratios),
                      "normalize_before": alone_before, "normalize_after": alone_after,
                      "chars": sum(map(len, texts)), "non_ascii": sum(len(t) for t in texts if not t.isascii())}))
""")


def _nfc_rows(corpora: dict, qwen: str, rounds: int):
    print(f"NFC check, paired in one process, one thread, {rounds} alternating rounds (qwen-style NFC):")
    print(f"{'corpus':<13}{'Mchar':>7}{'non-ASCII':>10}{'before s':>10}{'after s':>9}{'after/before':>13}"
          f"{'range':>12}{'normalize s before':>20}{'after':>7}")
    for kind, files in corpora.items():
        r = _python(NFC_AB, [json.dumps(files), qwen, str(rounds)], threads=1)
        print(f"{kind:<13}{r['chars'] / 1e6:>7.1f}{r['non_ascii'] / 1e6:>10.1f}{r['before']:>10.2f}{r['after']:>9.2f}"
              f"{r['ratio']:>13.3f}{r['low']:>6.2f}-{r['high']:.2f}{r['normalize_before']:>20.2f}"
              f"{r['normalize_after']:>7.2f}", flush=True)


def _env(threads: int | None = None) -> dict:
    env = {**os.environ, "PYTHONPATH": bench_engines._pythonpath(ROOT)}
    if threads:
        env.update(RAYON_NUM_THREADS=str(threads), TOKENIZERS_PARALLELISM="true" if threads > 1 else "false")
    return env


def _python(code: str, args: list[str], threads: int | None = None) -> dict:
    proc = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=_env(threads))
    if proc.returncode:
        raise SystemExit(proc.stderr)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _build(files, tokenizer: str, out: Path, workers: int, unit_bytes: int) -> dict:
    """The whole build process: its wall seconds and each stage's, by _split."""
    args = ["build", *files, "--tokenizer", tokenizer, "-o", str(out), "--workers", str(workers),
            "--unit-bytes", str(unit_bytes), "--quiet", "--overwrite"]
    t = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", BUILD, *args], capture_output=True, text=True, env=_env(), cwd=ROOT)
    seconds = time.perf_counter() - t
    if proc.returncode:
        raise SystemExit(proc.stdout + proc.stderr)
    marks = json.loads(proc.stdout.strip().splitlines()[-1])
    manifest = json.loads((out / "manifest.json").read_text())
    return {"seconds": seconds, "tokens": manifest["totals"]["tokens_in"], **_split(seconds, marks),
            "engine": manifest["tokenizer"]["encode_engine"]["name"]}


def _split(seconds: float, marks: dict) -> dict:
    """Stage seconds from the marks (start, end since the script began): start-up is everything before
    the tokenize stage (the interpreter's start, seconds less the script's own span, included)."""
    began = seconds - marks["end"][0]
    tokenize, plan, write = marks["tokenize"], marks["plan"], marks["write"]
    return {"start-up": began + tokenize[0], "tokenize": tokenize[1] - tokenize[0], "plan": plan[1] - plan[0],
            "write": write[1] - write[0], "finish": marks["end"][0] - write[1]}


STAGES = ("start-up", "tokenize", "plan", "write", "finish")


def _train(d: Path, name: str, sample: Path, vocab: int) -> str:
    bench_engines.VOCAB = vocab
    return bench_engines.train(d / f"{name}.json", name, [str(sample)])


def _corpora(args, d: Path) -> dict:
    """kind -> its JSONL files: read back from --corpus DIR/KIND where that holds them, else written (there or in d)."""
    keep, corpora = args.corpus or d, {}
    for kind in args.corpora.split(","):
        kept = sorted(map(str, (keep / kind).glob("part-*.jsonl"))) if args.corpus else []
        corpora[kind] = kept or write_corpus(keep / kind, kind, int(args.mb * 1e6))
    return corpora


def _row(kind: str, files: list[str], name: str, path: str, workers: int, cores: int, args, out: Path) -> dict:
    """One row: --repeat rounds of the baseline, the engine alone and the build, each ratio the median of its rounds."""
    tok, size = TOKENIZERS[name], sum(os.path.getsize(p) for p in files)
    rounds = []
    for _ in range(args.repeat):
        base = _python(bench_engines.BASELINE, [json.dumps(files), path], threads=cores)
        # hf's engine alone is tokenizers' encode_batch_fast with the same threads: the baseline itself
        alone = _python(ENGINE_ALONE, [json.dumps(files), path, str(cores)]) if tok["engine"] == "tiktoken" else base
        built = _build(files, path, out, workers, max(size // (4 * N_FILES), 1 << 16))
        assert built["engine"] == tok["engine"], f"{name}: auto chose {built['engine']}, not {tok['engine']}"
        rounds.append((base, alone, built))
    base, alone, built = (min((r[i] for r in rounds), key=lambda r: r["seconds"]) for i in range(3))
    vs_base = [b["seconds"] / r["seconds"] for b, _, r in rounds]
    vs_alone = [a["seconds"] / r["seconds"] for _, a, r in rounds]
    return {"corpus": kind, "tokenizer": tok["doc"], "engine": built["engine"],
            "engine_alone": "tiktoken encode_ordinary_batch" if tok["engine"] == "tiktoken" else "encode_batch_fast",
            "workers": workers, "cores": cores, "corpus_mb": size / 1e6, "chars": base["chars"],
            "tokens": built["tokens"], "rounds": args.repeat, "batch_fast_s": base["seconds"],
            "engine_alone_s": alone["seconds"], "build_s": built["seconds"], **{s: built[s] for s in STAGES},
            "not_engine": built["tokenize"] - alone["seconds"],
            "build/batch_fast": statistics.median(vs_base), "build/engine": statistics.median(vs_alone),
            "build/batch_fast rounds": vs_base, "build/engine rounds": vs_alone}


HEAD = (f"{'corpus':<13}{'tokenizer':<16}{'engine':>9}{'workers':>8}{'cores':>6}{'batch_fast':>11}{'alone':>7}"
        f"{'build':>8}  |{''.join(f'{s:>10}' for s in STAGES)}{'not engine':>11}  |{'build/batch_fast':>17}"
        f"{'build/engine':>13}")


def _line(r: dict) -> str:
    stages = "".join(f"{r[s]:>10.2f}" for s in STAGES)
    same = "  (alone = batch_fast)" if r["engine_alone"] == "encode_batch_fast" else ""
    label = next(t["label"] for t in TOKENIZERS.values() if t["doc"] == r["tokenizer"])
    return (f"{r['corpus']:<13}{label:<16}{r['engine']:>9}{r['workers']:>8}{r['cores']:>6}{r['batch_fast_s']:>11.2f}"
            f"{r['engine_alone_s']:>7.2f}{r['build_s']:>8.2f}  |{stages}{r['not_engine']:>11.2f}  |"
            f"{r['build/batch_fast']:>17.2f}{r['build/engine']:>13.2f}{same}")


MARKDOWN = ("corpus", "tokenizer", "engine", "workers", "build / encode_batch_fast", "build / engine alone", "start-up",
            "tokenize (not the engine)", "plan", "write", "finish")


def _ratio(r: dict, key: str) -> str:
    rounds = r[f"{key} rounds"]
    return f"{r[key]:.2f}" + (f" ({min(rounds):.2f}-{max(rounds):.2f})" if len(rounds) > 1 else "")


def markdown(rows: list[dict]) -> str:
    """docs/engines.md's "Packer's own work, per corpus" table: ratios (medians, the rounds' range), stages in seconds."""
    lines = ["| " + " | ".join(MARKDOWN) + " |", "|" + "---|" * len(MARKDOWN)]
    for r in rows:
        alone = _ratio(r, "build/engine") + (" (alone = encode_batch_fast)" if r["engine_alone"] == "encode_batch_fast"
                                             else "")
        cells = [r["corpus"], r["tokenizer"], r["engine"], str(r["workers"]), _ratio(r, "build/batch_fast"), alone,
                 f"{r['start-up']:.2f}", f"{r['tokenize']:.2f} ({r['not_engine']:.2f})",
                 *(f"{r[s]:.2f}" for s in ("plan", "write", "finish"))]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _arguments():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mb", type=float, default=20, help="MB of UTF-8 text per corpus (default 20)")
    parser.add_argument("--workers", default="1,2", help="worker counts (default 1,2)")
    parser.add_argument("--corpora", default=",".join(CORPORA), help=f"of {', '.join(CORPORA)}")
    parser.add_argument("--tokenizers", default=",".join(TOKENIZERS), help="gpt2 (GPT-2 style), qwen (NFC Qwen 2 "
                        "style), deepseek (DeepSeek-V3 style: three Splits, run by hf)")
    parser.add_argument("--vocab", type=int, default=50_000, help="tokens of each trained tokenizer")
    parser.add_argument("--repeat", type=int, default=1, help="rounds; ratios are medians of paired rounds")
    parser.add_argument("--corpus", type=Path, help="keep the corpora in DIR/KIND: written there when absent, else read "
                        "from there (--mb ignored): the same texts on a quiet machine")
    parser.add_argument("--nfc", type=int, default=0, metavar="ROUNDS",
                        help="also the NFC check against normalizing every non-ASCII text, ROUNDS paired rounds")
    parser.add_argument("--json", type=Path, metavar="PATH", help="also write every row, all its columns, to PATH")
    parser.add_argument("--markdown", action="store_true", help="also print the rows as docs/engines.md's table")
    parser.add_argument("--smoke", action="store_true", help="the smallest run (seconds; tests/test_benchmarks.py runs it)")
    args = parser.parse_args()
    if args.smoke:
        args.mb, args.vocab, args.repeat, args.tokenizers, args.corpora, args.nfc = 0.1, 1000, 1, "qwen,deepseek", "code", 2
        args.workers = "2"
    unknown = set(args.tokenizers.split(",")) - set(TOKENIZERS)
    if unknown:
        parser.error(f"--tokenizers: {', '.join(sorted(unknown))} unknown; choose from {', '.join(TOKENIZERS)}")
    return args


def main():
    args = _arguments()
    import tiktoken
    import tokenizers

    from packer.encode.engines.threads import threads_per_worker, usable_cores

    machine = (f"machine: {platform.machine()}, {usable_cores()} usable cores, load {os.getloadavg()[0]:.2f}, "
               f"python {platform.python_version()}, tokenizers {tokenizers.__version__}, tiktoken {tiktoken.__version__}")
    print(machine)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        corpora = _corpora(args, d)
        sample = d / "sample.jsonl"
        with open(sample, "w", encoding="utf-8") as f:
            lines = (line for files in corpora.values() for p in files for line in open(p, encoding="utf-8"))
            f.writelines(itertools.islice(lines, 0, None, SEED_SAMPLE))
        t = time.perf_counter()
        toks = {name: _train(d, name, sample, args.vocab) for name in args.tokenizers.split(",")}
        print(f"corpora: {', '.join(f'{k} {sum(os.path.getsize(p) for p in v) / 1e6:.1f} MB' for k, v in corpora.items())}"
              f" (documents of at most {DOC_CHARS:,} characters); tokenizers ({args.vocab:,} tokens) trained in "
              f"{time.perf_counter() - t:.0f} s")
        if args.nfc and "qwen" in toks:
            _nfc_rows(corpora, toks["qwen"], args.nfc)
        print(HEAD)
        for kind, files in corpora.items():
            for name, path in toks.items():
                for workers in map(int, args.workers.split(",")):
                    cores = min(workers * threads_per_worker(workers), usable_cores())
                    rows.append(_row(kind, files, name, path, workers, cores, args, d / "out"))
                    print(_line(rows[-1]), flush=True)
    if any(r["engine"] == "hf" for r in rows):
        print("hf rows: the engine alone is encode_batch_fast with the same threads, the baseline itself, so "
              "build/engine = build/batch_fast")
    if args.markdown:
        print(markdown(rows))
    if args.json:
        args.json.write_text(json.dumps({"machine": machine, "args": {k: str(v) for k, v in vars(args).items()},
                                         "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
