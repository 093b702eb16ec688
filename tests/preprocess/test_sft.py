"""Fine-tuning builds end to end: every accepted example's tokens and loss mask are stored exactly
(against the test's own rendering and tokenization), across split pieces, in every shard format;
bad records are counted by reason; long prompts are dropped when asked; text builds store no mask."""

from __future__ import annotations

import collections
import hashlib
import json
import random
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from tokenizers import Tokenizer

from packer.config import BuildConfig, Job
from packer.preprocess.pipeline import build
from packer.store.dataset import open_dataset
from packer.store.verify import verify_dataset

SAMPLE = Path(__file__).resolve().parents[2] / "sample_data"
TOKENIZER = str(SAMPLE / "tokenizer.json")
EOS = "<|endoftext|>"


def _records(name: str, n: int) -> list[dict]:
    return [json.loads(line) for line in open(SAMPLE / name, encoding="utf-8")][:n]


def _write_jsonl(path: Path, records) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return str(path)


def _build(tmp_path, inputs, name="out", **config) -> Path:
    out = tmp_path / name
    build(Job(inputs=tuple(inputs), tokenizer=TOKENIZER, output=str(out), workers=1, config=BuildConfig(**config)),
          progress="off")
    return out


def _stored_pieces(out: Path) -> dict[int, list[tuple[tuple, tuple]]]:
    """doc id -> [(piece tokens, piece mask)] as stored, read back through open_dataset."""
    ds = open_dataset(out)
    rows = range(len(ds))
    tokens, offsets = ds.views(rows)
    masks = ds.mask_views(rows)
    doc_ids = iter(ds.doc_ids().tolist())
    pieces = collections.defaultdict(list)
    for t, o, m in zip(tokens, offsets, masks):
        for a, b in zip(o[:-1], o[1:]):
            pieces[next(doc_ids)].append((tuple(t[a:b].tolist()), tuple(m[a:b].tolist())))
    return pieces


def _assert_stored(out: Path, reference: list[tuple[list[int], list[int]]], context: int):
    """Every reference example (ids, mask), cut into context-sized pieces, is stored exactly once."""
    pieces = _stored_pieces(out)
    assert sorted(pieces) == list(range(len(reference)))
    n_split = 0
    for d, (ids, mask) in enumerate(reference):
        expected = [(tuple(ids[i:i + context]), tuple(mask[i:i + context])) for i in range(0, len(ids), context)]
        assert sorted(pieces[d]) == sorted(expected), f"example {d}"
        n_split += len(expected) > 1
    assert n_split > 0  # the split path was exercised
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["totals"]["trained_tokens"] == sum(sum(m) for _, m in reference)
    verify_dataset(out)


@pytest.fixture(scope="module")
def tok():
    return Tokenizer.from_file(TOKENIZER)  # plain: "<|endoftext|>" in a text stays text only with encode_special_tokens


def _text_ids(tok, text: str) -> list[int]:
    tok.encode_special_tokens = True
    return tok.encode(text, add_special_tokens=False).ids


@pytest.mark.parametrize("fmt", ["arrow", "memmap", "megatron"])
def test_prompt_completion_tokens_and_masks_are_stored_exactly(tmp_path, tok, fmt):
    records = _records("prompt_completion.jsonl", 300)
    out = _build(tmp_path, [_write_jsonl(tmp_path / "pc.jsonl", records)], input_kind="prompt-completion",
                 context_length=64, format=fmt)
    eos = tok.token_to_id(EOS)
    reference = []
    for r in records:
        p, c = _text_ids(tok, r["prompt"]), _text_ids(tok, r["completion"]) + [eos]
        reference.append((p + c, [0] * len(p) + [1] * len(c)))
    _assert_stored(out, reference, 64)


def _sample_chat_reference(tok, messages) -> tuple[list[int], list[int]]:
    """sample_data/tokenizer_config.json's template, written out by hand: <|im_start|>ROLE\\nCONTENT<eos>\\n."""
    tok.encode_special_tokens = False
    ids, mask = [], []
    text, trained = "", []
    for m in messages:
        text += f"<|im_start|>{m['role']}\n"
        start = len(text)
        text += m["content"] + EOS + "\n"
        if m["role"] == "assistant":
            trained.append((start, len(text)))
    enc = tok.encode(text, add_special_tokens=False)
    ids = enc.ids
    mask = [int(any(a <= s and e <= b for a, b in trained)) for s, e in enc.offsets]
    return ids, mask


def test_sample_chat_tokens_and_masks_are_stored_exactly(tmp_path, tok):
    records = _records("chat.jsonl", 204)
    out = _build(tmp_path, [str(SAMPLE / "chat.jsonl")], input_kind="chat", context_length=128)
    _assert_stored(out, [_sample_chat_reference(tok, r["messages"]) for r in records], 128)
    template = json.loads((SAMPLE / "tokenizer_config.json").read_text())["chat_template"]
    recorded = json.loads((out / "manifest.json").read_text())["tokenizer"]["chat_template"]
    assert recorded == {"source": "tokenizer_config.json", "sha256": hashlib.sha256(template.encode()).hexdigest()}


def test_chat_from_parquet_equals_chat_from_jsonl(tmp_path):
    records = _records("chat.jsonl", 80)
    pq.write_table(pa.Table.from_pylist(records), tmp_path / "chat.parquet", row_group_size=25)
    a = _build(tmp_path, [_write_jsonl(tmp_path / "chat.jsonl", records)], "a", input_kind="chat", context_length=256)
    b = _build(tmp_path, [str(tmp_path / "chat.parquet")], "b", input_kind="chat", context_length=256)
    assert _stored_pieces(a) == _stored_pieces(b)


def _token_records(seed: int, n: int, vocab: int):
    rng = random.Random(seed)
    good, bad = [], []
    for i in range(n):
        ids = [rng.randrange(vocab) for _ in range(rng.randrange(1, 150))]
        mask = [int(rng.random() < 0.6) for _ in ids]
        mask[-1] = 1
        if i % 2:
            good.append({"input_ids": ids, "labels": [t if m else -100 for t, m in zip(ids, mask)]})
        else:
            good.append({"input_ids": ids, "loss_mask": mask})
    bad = [{"input_ids": [1, 2, vocab], "loss_mask": [1, 1, 1]},        # id_out_of_range
           {"input_ids": [1, 2, 3], "labels": [-100, 5, 3]},          # bad_labels (5 is not its id)
           {"input_ids": [1, 2, 3], "loss_mask": [0, 2, 1]},          # bad_loss_mask
           {"input_ids": [1, 2, 3], "loss_mask": [1, 1]},             # bad_loss_mask (length)
           {"input_ids": "1 2 3", "loss_mask": [1]},                  # bad_ids
           {"input_ids": [1, 2, 3], "labels": [-100, -100, -100]}]    # no_trained_tokens
    return good, bad


def test_pretokenized_both_forms_are_stored_exactly_and_bad_records_counted(tmp_path, tok):
    good, bad = _token_records(3, 200, tok.get_vocab_size())
    good.insert(100, {"input_ids": [1, 2, 3]})  # ids alone: a pre-tokenized corpus, every token trained
    records = good[:101] + bad + good[101:]
    out = _build(tmp_path, [_write_jsonl(tmp_path / "t.jsonl", records)], input_kind="tokens", context_length=48)
    reference = [(r["input_ids"], r.get("loss_mask") or [int(x != -100) for x in r.get("labels", r["input_ids"])])
                 for r in good]
    assert reference[100] == ([1, 2, 3], [1, 1, 1])
    _assert_stored(out, reference, 48)
    skipped = json.loads((out / "manifest.json").read_text())["totals"]["docs_skipped"]
    assert skipped == {"id_out_of_range": 1, "bad_labels": 1, "bad_loss_mask": 2, "bad_ids": 1, "no_trained_tokens": 1}


def test_malformed_prompt_completion_records_are_counted(tmp_path):
    records = [{"prompt": "a", "completion": "b"}, {"prompt": "a"}, {"prompt": 1, "completion": "b"},
               {"prompt": "a", "completion": "  "}, {"prompt": "", "completion": "only completion"}, "not an object"]
    out = _build(tmp_path, [_write_jsonl(tmp_path / "pc.jsonl", records)], input_kind="prompt-completion")
    totals = json.loads((out / "manifest.json").read_text())["totals"]
    assert totals["docs_accepted"] == 2
    assert totals["docs_skipped"] == {"missing_field": 2, "non_string_text": 1, "empty_completion": 1}


def test_long_prompts_drop_counts_them_and_split_keeps_them(tmp_path):
    records = [{"prompt": "word " * n, "completion": "end"} for n in (5, 100, 10, 300)]
    path = _write_jsonl(tmp_path / "pc.jsonl", records)
    dropped = _build(tmp_path, [path], "drop", input_kind="prompt-completion", context_length=64, long_prompts="drop")
    totals = json.loads((dropped / "manifest.json").read_text())["totals"]
    assert totals["docs_accepted"] == 2 and totals["docs_skipped"] == {"prompt_too_long": 2}
    kept = _build(tmp_path, [path], "split", input_kind="prompt-completion", context_length=64)
    assert json.loads((kept / "manifest.json").read_text())["totals"]["docs_accepted"] == 4


def test_auto_reads_each_file_as_its_kind(tmp_path, tok):
    out = _build(tmp_path, [str(SAMPLE / "chat.jsonl"), str(SAMPLE / "prompt_completion.jsonl")], input_kind="auto",
                 context_length=512)
    chat = [_sample_chat_reference(tok, r["messages"]) for r in _records("chat.jsonl", 10_000)]
    eos = tok.token_to_id(EOS)
    pc = []
    for r in _records("prompt_completion.jsonl", 10_000):
        p, c = _text_ids(tok, r["prompt"]), _text_ids(tok, r["completion"]) + [eos]
        pc.append((p + c, [0] * len(p) + [1] * len(c)))
    _assert_stored(out, chat + pc, 512)


def test_text_builds_store_no_mask_and_record_nothing_new(tmp_path):
    out = _build(tmp_path, [str(SAMPLE / "prose.jsonl")], context_length=512)
    ds = open_dataset(out)
    assert not ds.has_loss_mask and ds.mask_views([0]) is None
    manifest = json.loads((out / "manifest.json").read_text())
    assert "trained_tokens" not in manifest["totals"] and "input_kind" not in manifest["config"]
    assert not list((out).glob("*loss_mask*"))


def test_strict_stops_at_the_first_bad_record(tmp_path):
    path = _write_jsonl(tmp_path / "pc.jsonl", [{"prompt": "a", "completion": "b"}, {"prompt": "a"}])
    with pytest.raises(ValueError, match=r"pc.jsonl:2: missing_field \(--strict"):
        _build(tmp_path, [path], input_kind="prompt-completion", strict=True)


def test_records_need_a_records_format(tmp_path):
    (tmp_path / "a.txt").write_text("plain text", encoding="utf-8")
    with pytest.raises(ValueError, match="holds text, not records; use --input-kind text"):
        _build(tmp_path, [str(tmp_path / "a.txt")], input_kind="chat")


def test_train_roles_from_a_toml_list():
    assert BuildConfig(input_kind="chat", train_roles=["assistant", "tool"]).roles == ("assistant", "tool")
    with pytest.raises(ValueError, match="train_roles must name at least one role"):
        BuildConfig(train_roles=" , ")


def test_stats_report_trained_tokens_of_datasets_and_raw_records(tmp_path):
    import jsonschema

    from packer.preprocess.corpus import measure
    from packer.stats.figures import SCHEMA

    path = str(SAMPLE / "chat.jsonl")
    out = _build(tmp_path, [path], input_kind="chat", context_length=256)
    stored = measure([str(out)])
    raw = measure([path], tokenizer=TOKENIZER, config=BuildConfig(input_kind="chat", context_length=256))
    written = json.loads((out / "stats.json").read_text())
    trained = json.loads((out / "manifest.json").read_text())["totals"]["trained_tokens"]
    for figures in (stored, raw, written):
        jsonschema.validate(figures, SCHEMA)
        assert figures["trained"]["tokens"] == trained
        pack = figures["strategies"]["pack_ffd"]
        assert pack["trained_share"] == trained / pack["compute_slots"]
        assert figures["strategies"]["pad_to_context"]["trained_share"] < pack["trained_share"]
    assert 0 < raw["strategies"]["truncate"]["trained_share"] < 1
    assert "trained" not in measure([str(SAMPLE / "prose.jsonl")], tokenizer=TOKENIZER,
                                    config=BuildConfig(context_length=256))


def test_masked_builds_are_the_same_bytes_at_any_worker_count(tmp_path):
    inputs = (str(SAMPLE / "chat.jsonl"), str(SAMPLE / "prompt_completion.jsonl"))
    outs = []
    for workers in (1, 2):
        out = tmp_path / f"w{workers}"
        config = BuildConfig(input_kind="auto", context_length=512, format="memmap", unit_bytes=200_000)
        build(Job(inputs=inputs, tokenizer=TOKENIZER, output=str(out), workers=workers, config=config), progress="off")
        outs.append(out)
    names = sorted(p.name for p in outs[0].iterdir() if p.name.startswith("shard-"))
    assert any(n.endswith(".loss_mask.bin") for n in names)
    assert names == sorted(p.name for p in outs[1].iterdir() if p.name.startswith("shard-"))
    for name in names:
        assert (outs[0] / name).read_bytes() == (outs[1] / name).read_bytes(), name


def test_an_edited_chat_template_is_other_work_not_a_resume(tmp_path):
    """The template decides the masks: a _work/ made with another template is refused, not resumed."""
    from packer.encode.tokenizer import tokenizer_info
    from packer.preprocess import resume

    tok_dir = tmp_path / "tok"
    tok_dir.mkdir()
    shutil.copy(SAMPLE / "tokenizer.json", tok_dir / "tokenizer.json")
    config = json.loads((SAMPLE / "tokenizer_config.json").read_text())
    (tok_dir / "tokenizer_config.json").write_text(json.dumps(config))
    chat = BuildConfig(input_kind="chat")
    info = tokenizer_info(str(tok_dir / "tokenizer.json"), chat)
    before = resume.fingerprint(chat, info, [])
    assert "chat_template_sha256" in before
    assert "chat_template_sha256" not in resume.fingerprint(BuildConfig(), info, [])  # text: as it always was
    config["chat_template"] = config["chat_template"].replace("<|im_start|>", "<|im_start|> ")
    (tok_dir / "tokenizer_config.json").write_text(json.dumps(config))
    assert resume.fingerprint(chat, info, [])["chat_template_sha256"] != before["chat_template_sha256"]
