"""Regenerate the sample corpus and its tokenizer from the Python standard library.

The corpus is text nobody on the team wrote and every machine with Python has offline:
the interactive-help topics (pydoc_data, English prose), module/class/function
docstrings (prose, from a few words to pages), and module sources (code, up to tens of
thousands of tokens). Run with the interpreter whose stdlib you want:

    python sample_data/make_sample.py

Outputs (committed): sample_data/prose.jsonl, sample_data/code.jsonl, sample_data/tokenizer.json.
Same interpreter version => byte-identical outputs.

Fine-tuning records (pipelines/sft.toml builds them), also from the stdlib, written alone by
`python sample_data/make_sample.py sft` (the corpus and tokenizer above are left as they are):

    prompt_completion.jsonl  {"prompt": "def gcd(*integers):\n", "completion": "Greatest Common Divisor."}
                             a function's `def` line(s) and its docstring
    chat.jsonl               {"messages": [{"role": "system", "content": "<the docstring's first line>"},
                                           {"role": "user", "content": ">>> 1 + 1"}, {"role": "assistant", "content": "2"}, ...]}
                             the doctest examples of a docstring as turns: source -> expected output
    tokenizer_config.json    a ChatML-style chat_template for the sample tokenizer (its only special token,
                             <|endoftext|>, ends each turn); no other key, so text builds read nothing new
"""

import ast
import doctest
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


SFT_RECORDS = 2000  # records per fine-tuning file (a seeded sample)
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + eos_token + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def _functions(stdlib: Path):
    """(path, source, def node, docstring) of every documented function of the top-level stdlib modules."""
    for path in sorted(stdlib.glob("*.py")):
        try:
            source = path.read_text(encoding="utf-8")
            tree = ast.parse(source)
        except (SyntaxError, UnicodeDecodeError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and (doc := ast.get_docstring(node)):
                yield path, source, node, doc


def _prompt_completions(stdlib: Path):
    """A function's def line(s) -> its docstring."""
    for path, source, node, doc in _functions(stdlib):
        lines = source.splitlines(keepends=True)
        head = "".join(lines[node.lineno - 1: node.body[0].lineno - 1]).strip()
        if head.startswith(("def ", "async def ")) and head.endswith(":") and len(doc) >= 20:
            yield {"prompt": head + "\n", "completion": doc.strip(), "source": f"stdlib/{path.name}:{node.name}"}


def _chats(stdlib: Path):
    """A docstring with doctests -> system (its first line), then user (an example's source) /
    assistant (its expected output) turns; examples without output join the next user turn."""
    parser = doctest.DocTestParser()
    for path, _, node, doc in _functions(stdlib):
        try:
            examples = parser.get_examples(doc)
        except ValueError:
            continue
        messages, pending = [{"role": "system", "content": doc.strip().splitlines()[0].strip()}], []
        for ex in examples:
            pending.append(">>> " + ex.source.strip())
            if ex.want.strip():
                messages += [{"role": "user", "content": "\n".join(pending)},
                             {"role": "assistant", "content": ex.want.strip()}]
                pending = []
        if len(messages) >= 3:
            yield {"messages": messages, "source": f"stdlib/{path.name}:{node.name}"}


def _write_records(path: Path, records, rng: random.Random):
    records = list(records)
    if len(records) > SFT_RECORDS:
        records = [records[i] for i in sorted(rng.sample(range(len(records)), SFT_RECORDS))]
    with path.open("w", encoding="utf-8", newline="\n") as f:
        for record in records:
            f.write(json.dumps(record, ensure_ascii=False) + "\n")
    return len(records)


def write_sft():
    rng = random.Random(SEED)
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    n_pc = _write_records(HERE / "prompt_completion.jsonl", _prompt_completions(stdlib), rng)
    n_chat = _write_records(HERE / "chat.jsonl", _chats(stdlib), rng)
    (HERE / "tokenizer_config.json").write_text(json.dumps({"chat_template": CHAT_TEMPLATE}, indent=2) + "\n",
                                                encoding="utf-8")
    print(f"python {sys.version.split()[0]}: {n_pc} prompt/completion records, {n_chat} chats")


def main():
    if sys.argv[1:] == ["sft"]:
        write_sft()
        return
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
    write_sft()


if __name__ == "__main__":
    main()
