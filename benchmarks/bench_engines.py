"""How much faster than the tokenizer it mirrors does `packer build` run with a fast encode engine?

    python benchmarks/bench_engines.py              # >= 50 MB of mixed text, 1 and 2 workers
    python benchmarks/bench_engines.py --mb 10      # quicker
    python benchmarks/bench_engines.py --cl100k     # also a real vocabulary: cl100k_base, as shipped in
                                                    # the bpe-openai package, converted by transformers
    python benchmarks/bench_engines.py --corpus DIR # keep the corpus in DIR, or read it from there
    python benchmarks/bench_engines.py --before DIR # also the build of another checkout (an older commit's
                                                    # git worktree), on hf: is hf slower than it was?

Corpus (deterministic on one machine, corpus_texts below): man pages in ~25 languages, Debian's
/usr/share/doc, the Python standard library's sources and the translations of every installed .mo
catalog, round-robin, documents of at most 64 KB, as JSONL in several files. Tokenizers trained
here on a third of it with `tokenizers`' BpeTrainer (50,000 tokens): GPT-2 style (ByteLevel with
its regex) and Qwen style (NFC, the Qwen 2 Split regex, ByteLevel).

Rows, per tokenizer and worker count, each timed in this run:

    encode_batch_fast   the baseline: tokenizers over the same texts in memory, ~1 MiB batches,
                        RAYON_NUM_THREADS = the cores the build rows use (workers x threads)
    stage ENGINE        the tokenize stage (read, encode, write unit files) with hf, auto's choice
                        (tiktoken where installed) and --engines (fastokens: only when asked for)
    build ENGINE        the whole `packer build` process (plan, write, finalize included)

"ratio" is the baseline's seconds / the row's (the issue's targets, whole build: >= 3 GPT-2
style, >= 2.5 Qwen style, >= 0.95 where hf runs); "cpu ratio" the same in CPU seconds (the
process and its children; with one worker only: a pool's workers are not counted), steadier on a
shared machine. With --repeat N every row runs N times, in rounds (the baseline, then every row):
"seconds" is a row's best, and each ratio the median over the rounds of the row against its own
round's baseline, with the rounds' range after it ("paired": a machine whose speed drifts, as this
shared one does by a quarter from one hour to the next, moves both sides of a round alike, while
the best of each row may come from different hours).

2026-12-03, x86_64, 2 cores shared with other jobs (load average 9-15: wall seconds swing 2-3x
row to row, so the CPU ratio is the figure to read), 62 MB, --repeat 1:

    whole build, ratio to encode_batch_fast    wall (cpu)
                                   1 worker              2 workers
    gpt2-style      hf             1.30 (1.07)           1.05
                    fastokens      9.19 (6.83)           4.17
                    tiktoken       3.27 (3.49)           5.10
    qwen-style NFC  hf             0.57 (0.93)           2.78
                    fastokens      6.49 (7.54)          15.09
                    tiktoken       2.43 (3.24)           5.95
    tokenize stage alone, cpu: fastokens 10.2 / 9.8, tiktoken 4.2 / 4.1, hf 0.99 / 1.00
    (2 workers: no CPU column; the baseline ran while the load was highest, so every wall
    ratio there is too high, hf's 2.78 most plainly: hf runs at about 1.0 of itself)

2026-12-04, the same machine quiet (load < 0.3 at the start; a helper's tests ran beside the later
runs now and then), 62 MB, --repeat 2, three runs (the ranges); after this session's cuts to the
build's fixed work (report charts without matplotlib, no pandas import, a faster JSONL blank-line
check, orjson for the tokenizer.json), and before them (the first run of the day):

    whole build, ratio to encode_batch_fast    wall (cpu)
                                   1 worker                        2 workers
    gpt2-style      hf             0.73-1.02 (0.80-1.01)           0.73-0.91
                      --before     0.71 (0.79)                     0.68       (the build before engines)
                    fastokens      5.81 (8.65)                     4.23       (one run)
                    tiktoken       1.99-2.56 (2.79-3.06)           2.21-2.38
                      before cuts  1.75 (2.31)                     1.88
    qwen-style NFC  hf             0.71-0.90 (0.78-0.98)           0.75-0.83
                      --before     0.87 (0.98)                     0.71
                    fastokens      4.21 (6.79)                     3.56
                    tiktoken       1.99-2.27 (2.52-2.87)           2.50-2.66
                      before cuts  1.85 (2.50)                     -
    tokenize stage alone: tiktoken 2.5-3.7, fastokens 7.4-11.7, hf 0.68-1.02
    --cl100k, 1 worker (before the cuts): tiktoken stage 2.58, build 1.20 (the rule's check on
    100,000 tokens: ~1.5 s of fixed work), fastokens stage 4.86, build 1.74

2026-12-04, a quiet machine (the CPU host of a GPU box, 2 cores by taskset, load 0.07), the same 45 MB
corpus carried there (--corpus), --repeat 1, whole build: tiktoken 1.53 / 1.70 (GPT-2 style, 1 / 2
workers), 1.55 / 2.29 (Qwen NFC); fastokens 4.35 / 2.60, 4.01 / 3.17; hf 0.75 / 0.84, 0.72 / 0.87.
tiktoken's stage alone was 2.0x there: tokenizers ran 1.9 Mchar/s a thread on that CPU.

2026-12-04 evening, this machine (load 0.6-1.5; the baseline itself moved 12.3-18.3 s between runs),
62 MB, --repeat 2, --corpus; before / after three cuts to the tiktoken path (its ids as tiktoken's u32
buffer instead of a list of ints, xxh3 for the input records, a batch encoded while the next is read):

    whole build, ratio to encode_batch_fast    wall (cpu)
                                   1 worker                 2 workers
    gpt2-style      tiktoken       2.59 (3.11) -> 2.92 (3.36)   2.25 -> 3.52
                    hf             0.87 (0.93) -> 0.88 (0.94)   0.74 -> 0.93
    qwen-style NFC  tiktoken       2.36 (2.93) -> 2.70 (3.17)   2.73 -> 3.35
                    hf             0.92 (1.00) -> 0.89 (0.94)   0.81 -> 0.91
    tokenize stage alone, tiktoken: 3.22 / 2.74 / 2.91 / 3.51 -> 3.75 / 4.45 / 3.58 / 4.41

With 2 usable cores, "1 worker" runs 2 tokenizer threads, so every row uses both cores; the
previous table's 1-worker rows (a loaded machine) had about one.

2026-12-04 night, this machine (load 0.6-2.2; the baseline moved 9.6-14.4 s between runs), 62 MB,
--corpus, --repeat 5, ratios now paired (the median over rounds); two runs, after: the split
regexes' fast forms (byte_level.FAST_FORMS: tiktoken 0.74 / 0.88 of its time, GPT-2 / Qwen 2), the
rule's kept ranks (no JSON parse, no merge replay: 0.16 s a build and each worker), no second parse
for the shipped truncation, no pyarrow.compute import, and hf encoding on a thread of its own:

    whole build, ratio to encode_batch_fast    wall (cpu)
                                   1 worker                   2 workers
    gpt2-style      tiktoken       3.08 (3.50) / 3.04 (3.44)  3.90 / 3.41
                    hf             0.86 (0.94) / 0.93 (0.99)  1.00 / 0.91
    qwen-style NFC  tiktoken       3.17 (3.64) / 2.66 (3.04)  3.43 / 2.98
                    hf             0.92 (0.98) / 0.85 (0.91)  0.99 / 1.00
    tokenize stage alone, tiktoken: 3.59 / 4.95 / 3.32 / 3.89 and 3.92 / 4.33 / 3.03 / 3.85

Rounds spread widely (GPT-2, 1 worker, tiktoken: 2.53-3.97, then 2.55-3.95). hf's whole build against
the build before engines existed (a worktree of 5f5d168^, GPT-2 style, 1 worker, 6 paired whole-process
runs): 0.85 of its wall time (0.75-0.92).
"""

from __future__ import annotations

import argparse
import gettext
import gzip
import json
import os
import platform
import re
import resource
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # this checkout's packer, installed or not (its subprocesses get PYTHONPATH)
N_FILES = 8
DOC_CHARS = 65536
VOCAB = 50_000
QWEN2 = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""

# DeepSeek-V3's tokenizer.json pre_tokenizer: a Sequence of these three Splits (each Isolated, not inverted), then
# ByteLevel(add_prefix_space=False, use_regex=False). No engine but hf reproduces several Splits, so auto picks hf.
DEEPSEEK_V3_SPLITS = (
    "\\p{N}{1,3}",
    "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+",
    "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+|"
    " ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+",
)
_TROFF = re.compile(r"^\.[A-Za-z]+\s?|\\f[BIRP]|\\\(..|\\[-&e|^]")


def _man_pages():
    for path in sorted(Path("/usr/share/man").rglob("*.gz")):
        try:
            raw = gzip.decompress(path.read_bytes()).decode("utf-8")
        except (OSError, UnicodeDecodeError, EOFError):
            continue
        yield "\n".join(_TROFF.sub("", line) for line in raw.splitlines() if not line.startswith('.\\"'))


def _docs():
    for path in sorted(Path("/usr/share/doc").rglob("*")):
        if path.is_file() and not path.is_symlink():
            try:
                data = path.read_bytes()
                yield (gzip.decompress(data) if path.suffix == ".gz" else data).decode("utf-8")
            except (OSError, UnicodeDecodeError, EOFError):
                continue


def _python_sources():
    for path in sorted(Path(sysconfig.get_paths()["stdlib"]).rglob("*.py")):
        if "site-packages" not in path.parts and "test" not in path.parts:
            try:
                yield path.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError):
                continue


def _translations():
    for path in sorted(Path("/usr/share/locale").rglob("*.mo")):
        try:
            with open(path, "rb") as f:
                catalog = gettext.GNUTranslations(f)._catalog
        except Exception:  # a catalog gettext cannot read: not ours to fix
            continue
        texts = [v for k, v in sorted(catalog.items(), key=lambda kv: str(kv[0])) if k and isinstance(v, str)]
        if texts:
            yield "\n".join(texts)


def corpus_texts(n_bytes: int):
    """Documents, round-robin over the four families, until about n_bytes of UTF-8."""
    families, written = [_man_pages(), _docs(), _python_sources(), _translations()], 0
    while written < n_bytes and families:
        for family in list(families):
            text = next(family, None)
            if text is None:
                families.remove(family)
                continue
            for start in range(0, len(text), DOC_CHARS):
                doc = text[start:start + DOC_CHARS]
                if doc.strip():
                    written += len(doc.encode("utf-8"))
                    yield doc


def write_corpus(d: Path, n_bytes: int) -> list[str]:
    files = [open(d / f"part-{i}.jsonl", "w", encoding="utf-8") for i in range(N_FILES)]
    for k, text in enumerate(corpus_texts(n_bytes)):
        files[k % N_FILES].write(json.dumps({"text": text}, ensure_ascii=False) + "\n")
    for f in files:
        f.close()
    return [f.name for f in files]


def train(path: Path, style: str, files: list[str]) -> str:
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    texts = [json.loads(line)["text"] for f in files[::3] for line in open(f, encoding="utf-8")]
    tok = Tokenizer(models.BPE())
    if style == "gpt2":
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    elif style == "deepseek":
        tok.pre_tokenizer = pre_tokenizers.Sequence([*(pre_tokenizers.Split(Regex(r), "isolated") for r in DEEPSEEK_V3_SPLITS),
                                                     pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    else:
        tok.normalizer = normalizers.NFC()
        tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(QWEN2), "isolated"),
                                                     pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=["<|endoftext|>"],
                                                       initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                                       show_progress=False))
    tok.save(str(path))
    return str(path)


def cl100k(path: Path) -> str | None:
    try:
        from bpe_openai import data
        from transformers.convert_slow_tokenizer import TikTokenConverter
    except ImportError:
        return None
    raw = path.with_suffix(".tiktoken")
    raw.write_bytes(gzip.decompress((Path(data.__file__).parent / "cl100k_base.tiktoken.gz").read_bytes()))
    TikTokenConverter(vocab_file=str(raw), extra_special_tokens=["<|endoftext|>"]).converted().save(str(path))
    return str(path)


# A child script's texts (from the JSONL `files`) cut into the tokenize stage's batches, as `texts` and `batches`.
BATCHES = textwrap.dedent("""
    texts = [json.loads(line)["text"] for f in files for line in open(f, encoding="utf-8")]
    batches, cur, n = [], [], 0
    for t in texts:  # the stage's batches: 1024 documents or ~1 MiB
        cur.append(t); n += len(t)
        if n >= 1 << 20 or len(cur) >= 1024:
            batches.append(cur); cur, n = [], 0
    batches.append(cur)
""")

BASELINE = textwrap.dedent("""
    import json, sys, time
    from tokenizers import Tokenizer
    files = json.loads(sys.argv[1])
""") + BATCHES + textwrap.dedent("""
    tok = Tokenizer.from_file(sys.argv[2])
    tok.encode_special_tokens = True
    t = time.perf_counter()
    n_tokens = sum(sum(map(len, tok.encode_batch_fast(b, add_special_tokens=False))) for b in batches)
    print(json.dumps({"seconds": time.perf_counter() - t, "tokens": n_tokens, "chars": sum(map(len, texts))}))
""")

STAGE = textwrap.dedent("""
    import json, shutil, sys, tempfile, time
    from pathlib import Path
    from packer.config import BuildConfig
    from packer.encode.tokenizer import tokenizer_info
    from packer.preprocess import readers
    from packer.preprocess.executors import make_executor
    from packer.preprocess.pipeline import _tokenize_stage
    files, workers, engine = json.loads(sys.argv[1]), int(sys.argv[3]), sys.argv[4]
    config = BuildConfig(encode_engine=engine, unit_bytes=int(sys.argv[5]))
    info = tokenizer_info(sys.argv[2], config)  # the engine chosen (and its merges checked) before timing
    work = Path(tempfile.mkdtemp())
    t = time.perf_counter()
    units = readers.plan_units(files, config.unit_bytes)
    executor = make_executor(workers)
    try:
        counters = _tokenize_stage(units, info, config, work, executor)
    finally:
        executor.close()
    seconds = time.perf_counter() - t
    shutil.rmtree(work)
    print(json.dumps({"seconds": seconds, "tokens": sum(u["tokens"] for u in counters), "engine": info.engine}))
""")


def _pythonpath(root: Path) -> str:
    """The checkout first, then whatever PYTHONPATH already held (packages installed with --target)."""
    return os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH", "")]))


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _python(code: str, args: list[str], threads: int | None = None) -> dict:
    """Run `code` in a fresh process: its JSON line, with "cpu": the process's CPU seconds and its
    children's (pool workers included: reaped by their parents before these exit)."""
    env = {**os.environ, "PYTHONPATH": _pythonpath(ROOT)}
    if threads:
        env.update(RAYON_NUM_THREADS=str(threads), TOKENIZERS_PARALLELISM="true" if threads > 1 else "false")
    cpu = _children_cpu()
    proc = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=env)
    if proc.returncode:
        raise SystemExit(proc.stderr)
    return {**json.loads(proc.stdout.strip().splitlines()[-1]), "cpu": _children_cpu() - cpu}


def _build(files, tokenizer, out: Path, workers: int, engine: str | None, unit_bytes: int, root: Path = ROOT) -> dict:
    """`packer build` of the checkout at `root` (engine None: a checkout from before engines, which runs hf)."""
    args = [sys.executable, "-m", "packer", "build", *files, "--tokenizer", tokenizer, "-o", str(out), "--workers",
            str(workers), *(["--encode-engine", engine] if engine else []), "--unit-bytes", str(unit_bytes), "--quiet",
            "--overwrite"]
    t, cpu = time.perf_counter(), _children_cpu()
    proc = subprocess.run(args, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": _pythonpath(root)},
                          cwd=root)  # python -m puts the working directory first: run in the checkout timed
    seconds, cpu = time.perf_counter() - t, _children_cpu() - cpu
    if proc.returncode:
        raise SystemExit(proc.stdout + proc.stderr)
    manifest = json.loads((out / "manifest.json").read_text())
    return {"seconds": seconds, "cpu": cpu, "tokens": manifest["totals"]["tokens_in"],
            "engine": manifest["tokenizer"].get("encode_engine", {"name": "hf"})["name"]}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mb", type=float, default=60, help="corpus size in MB of UTF-8 text (default 60)")
    parser.add_argument("--workers", default="1,2", help="worker counts (default 1,2)")
    parser.add_argument("--cl100k", action="store_true", help="also cl100k_base (needs bpe-openai and transformers)")
    parser.add_argument("--engines", default="fastokens", help="engines timed besides hf and auto's choice (\"\": none)")
    parser.add_argument("--repeat", type=int, default=1, help="run every row this many times, keep each one's best")
    parser.add_argument("--before", type=Path, help="another checkout of packer (a git worktree of an older commit): "
                        "its whole build, on hf, timed as one more row ('build hf, before'), to compare today's hf with")
    parser.add_argument("--corpus", type=Path, help="keep the corpus in DIR: written there when DIR holds no "
                        "part-*.jsonl, else read from there (--mb ignored): the same texts on another machine")
    parser.add_argument("--smoke", action="store_true", help="the smallest run (seconds; tests/test_benchmarks.py runs it)")
    args = parser.parse_args()
    if args.smoke:
        args.mb, args.workers, args.engines, args.repeat = 0.3, "1", "", 1
    import tiktoken
    import tokenizers

    from packer.preprocess.executors import tokenizer_threads, usable_cores

    print(f"machine: {platform.machine()}, {usable_cores()} usable cores, load {os.getloadavg()[0]:.2f}, "
          f"python {platform.python_version()}, tokenizers {tokenizers.__version__}, tiktoken {tiktoken.__version__}")
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        kept = sorted(args.corpus.glob("part-*.jsonl")) if args.corpus and args.corpus.is_dir() else []
        if args.corpus and not kept:
            args.corpus.mkdir(parents=True, exist_ok=True)
        files = [str(f) for f in kept] or write_corpus(args.corpus or d, int(args.mb * 1e6))
        size = sum(os.path.getsize(f) for f in files)
        unit_bytes = max(size // (4 * N_FILES), 1 << 20)
        t = time.perf_counter()
        toks = {"gpt2-style": train(d / "gpt2.json", "gpt2", files), "qwen-style NFC": train(d / "qwen.json", "qwen", files)}
        if args.cl100k and (path := cl100k(d / "cl100k.json")):
            toks["cl100k (real)"] = path
        print(f"corpus: {size / 1e6:.1f} MB JSONL in {len(files)} files, units of {unit_bytes / 1e6:.1f} MB; "
              f"tokenizers trained in {time.perf_counter() - t:.0f} s ({VOCAB:,} tokens)")
        print(f"{'tokenizer':<16}{'workers':>8}{'cores':>6}  {'row':<22}{'seconds':>9}{'Mchar/s':>9}{'ratio':>7}"
              f"{'rounds':>11}{'cpu s':>8}{'cpu ratio':>10}")
        for name, path in toks.items():
            for workers in map(int, args.workers.split(",")):
                cores = min(workers * tokenizer_threads(workers), usable_cores())
                rows: dict[str, dict] = {}
                paired: dict[str, list] = {}  # label -> [(baseline seconds / row's, the same in CPU)] per round

                def keep(label, r):
                    best = rows.setdefault(label, r)
                    rows[label] = {**r, "seconds": min(best["seconds"], r["seconds"]), "cpu": min(best["cpu"], r["cpu"])}
                    paired.setdefault(label, []).append((base_now["seconds"] / r["seconds"], base_now["cpu"] / r["cpu"]))

                for _ in range(args.repeat):
                    base_now = _python(BASELINE, [json.dumps(files), path], threads=cores)
                    keep("encode_batch_fast", base_now)
                    for engine in ("hf", "auto", *filter(None, args.engines.split(","))):
                        stage = _python(STAGE, [json.dumps(files), path, str(workers), engine, str(unit_bytes)])
                        keep(f"stage {stage['engine']}", stage)
                        built = _build(files, path, d / "out", workers, engine, unit_bytes)
                        keep(f"build {built['engine']}", built)
                    if args.before:
                        keep("build hf, before", _build(files, path, d / "out-before", workers, None, unit_bytes, args.before))
                base = rows["encode_batch_fast"]
                for label, r in rows.items():
                    walls, cpus = zip(*paired[label])
                    spread = f"{min(walls):.2f}-{max(walls):.2f}" if len(walls) > 1 else ""
                    # pool workers are the forkserver's children, which no one here waits for: their CPU
                    # is not counted, so with --workers > 1 only the baseline's is shown
                    cpu = f"{r['cpu']:>8.1f}{statistics.median(cpus):>10.2f}" if workers == 1 or r is base else \
                        f"{'-':>8}{'-':>10}"
                    print(f"{name:<16}{workers:>8}{cores:>6}  {label:<22}{r['seconds']:>9.2f}"
                          f"{base['chars'] / r['seconds'] / 1e6:>9.2f}{statistics.median(walls):>7.2f}{spread:>11}{cpu}",
                          flush=True)
                counts = {r["tokens"] for label, r in rows.items() if label != "encode_batch_fast"}
                assert len(counts) == 1, f"the engines' token counts differ: {counts}"


if __name__ == "__main__":
    main()
