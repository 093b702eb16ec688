"""Regenerate the sample corpus and its tokenizer from the Python standard library.

The corpus is text nobody on the team wrote and every machine with Python has offline:
the interactive-help topics (pydoc_data, English prose), module/class/function
docstrings (prose, from a few words to pages), and module sources (code, up to tens of
thousands of tokens). Run with the interpreter whose stdlib you want:

    python sample_data/make_sample.py

Outputs (committed): sample_data/prose.jsonl, sample_data/code.jsonl, sample_data/tokenizer.json.
Same interpreter version => byte-identical outputs.
"""

import ast
import json
import random
import sys
import sysconfig
from pathlib import Path

from pydoc_data.topics import topics

HERE = Path(__file__).resolve().parent
SEED = 20261129
CODE_BUDGET_BYTES = 1_600_000
VOCAB_SIZE = 16384
EOS = "<|endoftext|>"


def _docstrings(stdlib: Path):
    """(source, text) for module/class/function docstrings of top-level stdlib modules."""
    for path in sorted(stdlib.glob("*.py")):
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                doc = ast.get_docstring(node)
                if doc and len(doc) >= 20:
                    name = getattr(node, "name", "<module>")
                    yield f"stdlib/{path.name}:{name}", doc


def _sources(stdlib: Path, rng: random.Random):
    paths = sorted(stdlib.glob("*.py"))
    rng.shuffle(paths)
    used = 0
    for path in paths:
        text = path.read_text(encoding="utf-8", errors="replace")
        if used + len(text) > CODE_BUDGET_BYTES:
            continue
        used += len(text)
        yield f"stdlib/{path.name}", text


def _write_jsonl(path: Path, records):
    with path.open("w", encoding="utf-8", newline="\n") as f:
        for source, text in records:
            f.write(json.dumps({"text": text, "source": source}, ensure_ascii=False) + "\n")


def _train_tokenizer(files, out: Path):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=[EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train([str(f) for f in files], trainer)
    tok.save(str(out))


def _train_texts(files, tmp: Path):
    """The tokenizer trains on the texts, one per line-free chunk (JSON escapes would skew merges)."""
    tmp.parent.mkdir(parents=True, exist_ok=True)
    with tmp.open("w", encoding="utf-8") as out:
        for f in files:
            for line in f.open(encoding="utf-8"):
                out.write(json.loads(line)["text"] + "\n")
    return tmp


def main():
    rng = random.Random(SEED)
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    prose = [(f"pydoc_data.topics:{k}", topics[k]) for k in sorted(topics)]
    prose += list(_docstrings(stdlib))
    rng.shuffle(prose)
    code = list(_sources(stdlib, rng))
    _write_jsonl(HERE / "prose.jsonl", prose)
    _write_jsonl(HERE / "code.jsonl", code)
    raw = _train_texts([HERE / "prose.jsonl", HERE / "code.jsonl"], HERE / ".train_text.tmp")
    try:
        _train_tokenizer([raw], HERE / "tokenizer.json")
    finally:
        raw.unlink()
    print(f"python {sys.version.split()[0]}: {len(prose)} prose docs, {len(code)} code docs")


if __name__ == "__main__":
    main()
