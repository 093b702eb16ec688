"""Online packing of fine-tuning records: every accepted example's ids and labels equal what `packer build`
stores for it (the same RecordEncoder), for prompt-completion, chat, tokens and auto; bad records are
skipped and counted as the build counts them; resume and DataLoader workers stay exact with skips."""

from __future__ import annotations

import collections
import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from tokenizers import Tokenizer  # noqa: E402
from torch.utils.data import DataLoader  # noqa: E402

from packer.config import BuildConfig, Job  # noqa: E402
from packer.encode.chat import TemplateRefused  # noqa: E402
from packer.preprocess.pipeline import build  # noqa: E402
from packer.store.dataset import open_dataset  # noqa: E402
from packer.train.items import ItemFields  # noqa: E402
from packer.train.online import OnlinePackedDataset  # noqa: E402

SAMPLE = Path(__file__).resolve().parents[2] / "sample_data"
TOKENIZER = str(SAMPLE / "tokenizer.json")  # its tokenizer_config.json beside it holds a ChatML-style template
IGNORE = -100


def _records(name: str, n: int | None = None) -> list:
    with open(SAMPLE / name, encoding="utf-8") as f:
        return [json.loads(line) for line in f][:n]


def _write_jsonl(path: Path, records) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return str(path)


def _build(tmp_path: Path, inputs, **config) -> Path:
    out = tmp_path / "built"
    build(Job(inputs=tuple(inputs), tokenizer=TOKENIZER, output=str(out), workers=1, config=BuildConfig(**config)),
          progress="off")
    return out


def _labels(ids, mask) -> tuple:
    """The loader rule, written out: -100 at the piece's first token and wherever the mask is 0."""
    return tuple(IGNORE if i == 0 or not m else t for i, (t, m) in enumerate(zip(ids, mask)))


def _stored(out: Path) -> collections.Counter:
    """(ids, labels) of every stored piece, from the build's rows, offsets and loss masks."""
    ds = open_dataset(out)
    rows = range(len(ds))
    tokens, offsets = ds.views(rows)
    masks = ds.mask_views(rows) or [np.ones(len(t), np.uint8) for t in tokens]
    pieces = collections.Counter()
    for t, o, m in zip(tokens, offsets, masks):
        for a, b in zip(o[:-1], o[1:]):
            ids = tuple(t[a:b].tolist())
            pieces[ids, _labels(ids, m[a:b].tolist())] += 1
    return pieces


def _emitted(items, pad_id: int | None = None) -> collections.Counter:
    """(ids, labels) of every segment the online items hold (cu_seqlens), the padding segment left out."""
    pieces = collections.Counter()
    for item in items:
        cu, ids, labels = item["cu_seqlens"].tolist(), item["input_ids"].tolist(), item["labels"].tolist()
        for a, b in zip(cu[:-1], cu[1:]):
            if pad_id is not None and b == len(ids) and a > 0 and labels[a:b] == [IGNORE] * (b - a) \
                    and set(ids[a:b]) == {pad_id}:
                continue
            pieces[tuple(ids[a:b]), tuple(labels[a:b])] += 1
    return pieces


def _check_exercised(pieces: collections.Counter, context: int):
    labels = [t for _, lab in pieces for t in lab[1:]]
    assert IGNORE in labels and any(t != IGNORE for t in labels)  # trained and untrained tokens both
    assert any(len(ids) == context for ids, _ in pieces)  # some example was split into pieces


def _token_records() -> list[dict]:
    """Pre-tokenized examples (labels for some, a loss mask for others) made from sample prompt/completions."""
    tok = Tokenizer.from_file(TOKENIZER)
    tok.encode_special_tokens = True
    out = []
    for k, r in enumerate(_records("prompt_completion.jsonl", 200)):
        p, c = (tok.encode(r[f], add_special_tokens=False).ids for f in ("prompt", "completion"))
        if k % 2:
            out.append({"input_ids": p + c, "labels": [IGNORE] * len(p) + c})
        else:
            out.append({"input_ids": p + c, "loss_mask": [0] * len(p) + [1] * len(c)})
    return out


CASES = {  # kind -> (records, context)
    "prompt-completion": (lambda: _records("prompt_completion.jsonl", 400), 64),
    "chat": (lambda: _records("chat.jsonl"), 128),
    "tokens": (_token_records, 64),
}


@pytest.mark.parametrize("kind", list(CASES))
def test_every_example_equals_the_build(tmp_path, kind):
    make, context = CASES[kind]
    records = make()
    built = _stored(_build(tmp_path, [_write_jsonl(tmp_path / "in.jsonl", records)], input_kind=kind,
                           context_length=context, bos=False))
    ds = OnlinePackedDataset(records, tokenizer=TOKENIZER, config=BuildConfig(context_length=context, input_kind=kind),
                             buffer_docs=50)
    online = _emitted(ds)
    assert online == built
    _check_exercised(online, context)
    assert ds.skipped == {}


def test_auto_reads_each_record_as_the_build_reads_each_file(tmp_path):
    chat, pc, prose = _records("chat.jsonl", 100), _records("prompt_completion.jsonl", 100), _records("prose.jsonl", 50)
    files = [_write_jsonl(tmp_path / f"{name}.jsonl", r) for name, r in (("chat", chat), ("pc", pc), ("prose", prose))]
    built = _stored(_build(tmp_path, files, input_kind="auto", context_length=128, bos=False))
    interleaved = [r for group in itertools_zip(chat, pc, prose) for r in group]
    ds = OnlinePackedDataset(interleaved, tokenizer=TOKENIZER, config=BuildConfig(context_length=128,
                                                                                  input_kind="auto"), buffer_docs=64)
    online = _emitted(ds)
    assert online == built
    _check_exercised(online, 128)
    assert any(all(t != IGNORE for t in lab[1:]) and len(lab) > 20 for _, lab in online)  # a text, all trained


def itertools_zip(*lists):
    """Round-robin over lists of different lengths."""
    longest = max(map(len, lists))
    return [[lst[i] for lst in lists if i < len(lst)] for i in range(longest)]


def _bad_records() -> list:
    """A stream of good and bad records of every kind; each bad one named by the reason the build gives it."""
    chat, pc = _records("chat.jsonl", 30), _records("prompt_completion.jsonl", 30)
    user = {"role": "user", "content": "hi"}
    bad_chat = [
        {"messages": [user, {"content": "no role"}]},  # missing_role
        {"messages": [user, {"role": "assistant", "content": 7}]},  # non_string_content
        {"messages": []},  # empty_messages
        {"messages": [user]},  # no_trained_tokens
        {"messages": [user, {"role": "assistant", "content": "a <|endoftext|> b"}]},  # special_token_in_content
        {"conversation": [user]},  # missing_field
    ]
    bad_pc = [
        {"prompt": "p", "completion": ""},  # empty_completion
        {"prompt": "p", "completion": "   "},  # empty_completion
        {"prompt": 3, "completion": "c"},  # non_string_text
    ]
    return chat[:10] + bad_chat[:2] + chat[10:20] + bad_chat[2:] + chat[20:], pc[:5] + bad_pc + pc[5:]


def test_bad_records_are_counted_as_the_build_counts_them(tmp_path):
    chat, pc = _bad_records()
    for kind, records in (("chat", chat), ("prompt-completion", pc)):
        out = _build(tmp_path / kind, [_write_jsonl(tmp_path / f"{kind}.jsonl", records)], input_kind=kind,
                     context_length=128, bos=False)
        expected = json.loads((out / "manifest.json").read_text())["totals"]["docs_skipped"]
        for as_kind in (kind, "auto"):
            ds = OnlinePackedDataset(records, tokenizer=TOKENIZER, config=BuildConfig(context_length=128,
                                                                                      input_kind=as_kind), buffer_docs=7)
            with pytest.warns(UserWarning, match=r"the first: source document (10|5): "):
                online = _emitted(ds)
            assert ds.skipped == expected, as_kind
            assert online == _stored(out)
    assert set(json.loads((tmp_path / "chat" / "built" / "manifest.json").read_text())["totals"]["docs_skipped"]) \
        == {"missing_role", "non_string_content", "empty_messages", "no_trained_tokens", "special_token_in_content",
            "missing_field"}


def test_ids_as_arrays_or_tensors_are_the_ids_as_lists():
    """An HF dataset in numpy or torch format hands over arrays: read as the lists the build reads."""
    records = _token_records()[:60]
    arrays = [{k: np.asarray(v) for k, v in r.items()} for r in records]
    tensors = [{k: torch.tensor(v) for k, v in r.items()} for r in records]
    kwargs = dict(tokenizer=TOKENIZER, config=BuildConfig(context_length=64, input_kind="tokens"))
    expected = _emitted(OnlinePackedDataset(records, **kwargs))
    assert _emitted(OnlinePackedDataset(arrays, **kwargs)) == expected == _emitted(OnlinePackedDataset(tensors,
                                                                                                       **kwargs))
    floats = [{"input_ids": np.asarray(r["input_ids"], float), **{k: v for k, v in r.items() if k != "input_ids"}}
              for r in records[:3]]
    ds = OnlinePackedDataset(floats, **kwargs)
    with pytest.warns(UserWarning, match="bad_ids"):
        assert list(ds) == []
    assert ds.skipped == {"bad_ids": 3}


def test_records_of_another_shape_are_skipped_not_raised():
    records = [*_records("prompt_completion.jsonl", 5), "a text", [1, 2, 3], {"other": 1},
               {"input_ids": [1, 2], "labels": [1]}, {"input_ids": [1, 10**9], "loss_mask": [1, 1]}]
    ds = OnlinePackedDataset(records, tokenizer=TOKENIZER, config=BuildConfig(context_length=64,
                                                                              input_kind="prompt-completion"))
    with pytest.warns(UserWarning, match="source document 5: missing_field"):
        assert len(list(ds))
    assert ds.skipped == {"missing_field": 5}
    auto = OnlinePackedDataset(records, tokenizer=TOKENIZER, config=BuildConfig(context_length=64, input_kind="auto"))
    with pytest.warns(UserWarning, match="source document 7: missing_field"):
        list(auto)  # the text and the ids are texts' kind; the dict with no kind's field is missing_field
    assert auto.skipped == {"missing_field": 1, "bad_labels": 1, "id_out_of_range": 1}


def test_long_prompts_drop_is_counted_as_the_build_counts_it(tmp_path):
    records = _records("prompt_completion.jsonl", 300)
    out = _build(tmp_path, [_write_jsonl(tmp_path / "pc.jsonl", records)], input_kind="prompt-completion",
                 context_length=12, long_prompts="drop", bos=False)
    expected = json.loads((out / "manifest.json").read_text())["totals"]["docs_skipped"]
    config = BuildConfig(context_length=12, input_kind="prompt-completion", long_prompts="drop")
    ds = OnlinePackedDataset(records, tokenizer=TOKENIZER, config=config, buffer_docs=64)
    with pytest.warns(UserWarning, match="prompt_too_long"):
        assert _emitted(ds) == _stored(out)
    assert ds.skipped == expected and expected["prompt_too_long"] > 0


def test_padding_is_its_own_untrained_segment():
    records = _records("chat.jsonl", 40)
    ds = OnlinePackedDataset(records, tokenizer=TOKENIZER, config=BuildConfig(context_length=256, input_kind="chat"),
                             fields=ItemFields(pad_to=256))
    n_padded = 0
    for item in ds:
        cu, labels = item["cu_seqlens"].tolist(), item["labels"]
        assert cu[-1] == 256
        n_padded += cu[-2] < 256 and bool((labels[cu[-2]:] == IGNORE).all()) and bool(
            (item["input_ids"][cu[-2]:] == ds.pad_id).all())
    assert n_padded
    plain = OnlinePackedDataset(records, tokenizer=TOKENIZER, config=BuildConfig(context_length=256, input_kind="chat"))
    assert _emitted(ds, pad_id=ds.pad_id) == _emitted(plain)


def _rows(items) -> list[tuple]:
    return [(tuple(i["input_ids"].tolist()), tuple(i["labels"].tolist())) for i in items]


@pytest.mark.filterwarnings("ignore:OnlinePackedDataset skips bad records")
def test_resume_with_skipped_records_gives_the_uninterrupted_stream():
    chat, pc = _bad_records()
    records = [r for group in itertools_zip(chat, pc) for r in group]
    config = BuildConfig(context_length=128, input_kind="auto", seed=3)
    make = lambda: OnlinePackedDataset(records, tokenizer=TOKENIZER, config=config, buffer_docs=9)  # noqa: E731
    whole = make()
    full = _rows(whole)
    assert whole.skipped and sum(whole.skipped.values()) == 9
    recounted = 0
    for stop in sorted({*np.linspace(0, len(full), 7).astype(int).tolist(), 3, 4, 5}):
        first = make()
        it = iter(first)
        head = [_rows([next(it)])[0] for _ in range(stop)]
        state = json.loads(json.dumps(first.state_dict()))
        recounted += state["n_yielded"] > 0 and sum(state["skipped"].values()) < sum(first.skipped.values())
        second = make()
        second.load_state_dict(state)
        assert head + _rows(second) == full, stop
        assert second.skipped == whole.skipped, stop
    assert recounted  # some stop fell inside a buffer whose skips the resumed run counts again
    with pytest.raises(ValueError, match="input_kind='auto'"):
        OnlinePackedDataset(records, tokenizer=TOKENIZER, config=dataclasses.replace(config, input_kind="chat"),
                            buffer_docs=9).load_state_dict(state)


@pytest.mark.filterwarnings("ignore:OnlinePackedDataset skips bad records")
def test_dataloader_workers_give_the_same_examples_as_one_process(monkeypatch):
    # A worker forked after this process encoded, with TOKENIZERS_PARALLELISM=true (which an unclosed
    # InlineExecutor of an earlier test leaves set), waits forever on the tokenizers pool it lost at the fork.
    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "false")
    chat, pc = _bad_records()
    records = [r for group in itertools_zip(chat, pc) for r in group]
    ds = OnlinePackedDataset(records, tokenizer=TOKENIZER, config=BuildConfig(context_length=128, input_kind="auto"),
                             buffer_docs=16)
    one = _emitted(ds)
    two = _emitted(DataLoader(ds, batch_size=None, num_workers=2))
    assert one == two and sum(one.values()) > len(records) - 9


def test_a_tokenizer_object_needs_a_chat_template_for_chat(tmp_path):
    tok = Tokenizer.from_file(TOKENIZER)
    records = _records("chat.jsonl", 30)
    with pytest.raises(ValueError, match="chat_template=FILE"):
        OnlinePackedDataset(records, tokenizer=tok, config=BuildConfig(context_length=128, input_kind="chat"))
    config = BuildConfig(context_length=128, input_kind="chat", chat_template=str(SAMPLE / "tokenizer_config.json"))
    from_object = OnlinePackedDataset(records, tokenizer=tok, config=config)
    from_path = OnlinePackedDataset(records, tokenizer=TOKENIZER, config=BuildConfig(context_length=128,
                                                                                     input_kind="chat"))
    assert _emitted(from_object) == _emitted(from_path)
    pc = _records("prompt_completion.jsonl", 30)
    assert _emitted(OnlinePackedDataset(pc, tokenizer=tok, config=BuildConfig(context_length=64,
                                                                              input_kind="prompt-completion"))) == \
        _emitted(OnlinePackedDataset(pc, tokenizer=TOKENIZER, config=BuildConfig(context_length=64,
                                                                                 input_kind="prompt-completion")))


def test_a_refused_template_raises(tmp_path):
    """A template whose earlier turns render differently once later ones exist cannot give exact spans."""
    last_different = (r"{% for message in messages %}{% if message['role'] == 'assistant' and loop.last %}"
                      r"{{ '<|im_start|>assistant\n<think></think>' + message['content'] + '\n' }}{% else %}"
                      r"{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '\n' }}{% endif %}"
                      r"{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
    (tmp_path / "last.jinja").write_text(last_different, encoding="utf-8")
    config = BuildConfig(context_length=128, input_kind="chat", chat_template=str(tmp_path / "last.jinja"))
    ds = OnlinePackedDataset(_records("chat.jsonl", 10), tokenizer=TOKENIZER, config=config)
    with pytest.raises(TemplateRefused, match="source document 0"):
        list(ds)


def test_bad_settings_name_the_fix():
    with pytest.raises(ValueError, match="input_kind must be one of"):
        OnlinePackedDataset([], tokenizer=TOKENIZER, config=BuildConfig(context_length=8, input_kind="records"))
    with pytest.raises(ValueError, match="long_prompts must be one of"):
        OnlinePackedDataset([], tokenizer=TOKENIZER, config=BuildConfig(context_length=8, input_kind="chat",
                                                                        long_prompts="cut"))
    with pytest.raises(ValueError, match="tokenizer=PATH_TO_tokenizer.json"):
        OnlinePackedDataset([], config=BuildConfig(context_length=8, eos=False, input_kind="tokens"))
    with pytest.raises(FileNotFoundError, match="no such file"):
        OnlinePackedDataset([], tokenizer=TOKENIZER, config=BuildConfig(context_length=8, input_kind="chat",
                                                                        chat_template="nope.jinja"))
