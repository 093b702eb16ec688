"""Online packing: buffer pack/carry rule, every token once, loader semantics, seeds, resume, partitions."""

from __future__ import annotations

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from conftest import TOKENIZER, sample_texts  # noqa: E402
from torch.utils.data import DataLoader  # noqa: E402

from packer.config import BuildConfig  # noqa: E402
from packer.online_pack import online_fill_rate  # noqa: E402
from packer.store.dataset import open_dataset  # noqa: E402
from packer.train.items import ItemFields  # noqa: E402
from packer.train.online import OnlinePackedDataset  # noqa: E402


def numbered_docs(seed: int, n: int, high: int) -> list[list[int]]:
    """Documents whose tokens are globally unique ids 1, 2, 3, ..., so every token can be traced back."""
    lengths = np.random.default_rng(seed).integers(1, high, n)
    starts = np.concatenate([[1], 1 + np.cumsum(lengths)])
    return [list(range(int(a), int(a) + int(n))) for a, n in zip(starts, lengths)]


def rows(ds) -> list[tuple[int, ...]]:
    return [tuple(item["input_ids"].tolist()) for item in ds]


def segments(item) -> list[list[int]]:
    cu = item["cu_seqlens"].tolist()
    ids = item["input_ids"].tolist()
    return [ids[a:b] for a, b in zip(cu[:-1], cu[1:])]


# -- the dataset ------------------------------------------------------------------------------

@pytest.mark.parametrize("seed", range(4))
def test_every_token_once_within_context_and_loader_semantics(seed):
    docs = numbered_docs(seed, 300, 90)
    ds = OnlinePackedDataset(docs, config=BuildConfig(context_length=64, eos=False, seed=seed), buffer_docs=40,
                             fields=ItemFields(pad_to=64))
    seen, n_multi, n_split, n_padded = [], 0, 0, 0
    for item in ds:
        assert item["input_ids"].shape == (64,) and item["input_ids"].dtype == torch.int64
        cu = item["cu_seqlens"].tolist()
        assert cu[0] == 0 and cu[-1] == 64 and item["cu_seqlens"].dtype == torch.int32
        assert item["max_seqlen"] == max(b - a for a, b in zip(cu[:-1], cu[1:]))
        ids, labels = item["input_ids"].tolist(), item["labels"].tolist()
        for a, b in zip(cu[:-1], cu[1:]):
            assert item["position_ids"][a:b].tolist() == list(range(b - a))
            assert labels[a] == -100
            assert labels[a + 1 : b] == ids[a + 1 : b] or set(ids[a:b]) == {0}  # a document, or the padding
        docs_in_row = segments(item)
        if set(docs_in_row[-1]) == {0}:  # the padding segment (pad id 0; real tokens are >= 1)
            assert (item["labels"][cu[-2]:] == -100).all()
            docs_in_row.pop()
            n_padded += 1
        for seg in docs_in_row:
            assert seg == list(range(seg[0], seg[0] + len(seg)))  # a contiguous run of one document
            seen.extend(seg)
            n_split += len(seg) < len(next(d for d in docs if d[0] <= seg[0] <= d[-1]))
        n_multi += len(docs_in_row) > 1
    assert sorted(seen) == [t for d in docs for t in d]
    assert n_multi and n_split and n_padded  # packing, splitting and padding were all exercised


def test_single_buffer_gives_the_offline_build_rows(sample_dataset):
    texts = [{"text": t, "id": i} for i, t in enumerate(sample_texts())]  # HF datasets style records
    online = OnlinePackedDataset(texts, tokenizer=TOKENIZER, config=BuildConfig(context_length=1024),
                                 buffer_docs=len(texts) + 1)
    offline = open_dataset(sample_dataset)
    expected = sorted(tuple(tokens.tolist()) for tokens, _ in offline)
    got = list(online)
    assert sorted(tuple(item["input_ids"].tolist()) for item in got) == expected
    assert sorted(tuple(item["cu_seqlens"].tolist()) for item in got) == sorted(
        tuple(offsets.tolist()) for _, offsets in offline)


def test_texts_get_eos_and_document_ids_and_masks():
    texts = ["hello world", "a b c", "the end"]
    ds = OnlinePackedDataset(texts, tokenizer=TOKENIZER, config=BuildConfig(context_length=64),
                             fields=ItemFields(attention_mask=True, document_ids=True, pad_to=64))
    (item,) = list(ds)
    eos = ds.eos_id
    cu = item["cu_seqlens"].tolist()
    assert len(cu) == 5 and all(item["input_ids"][b - 1] == eos for b in cu[1:4])
    assert item["attention_mask"].shape == (64, 64) and item["document_ids"].tolist()[cu[1]] == 1
    assert not item["attention_mask"][cu[1], cu[1] - 1] and item["attention_mask"][cu[1] + 1, cu[1]]


def test_texts_encode_as_the_build_does_also_in_a_pickled_copy():
    """"<|endoftext|>" in a text is text (only the appended eos is the eos id), in the dataset and in a
    pickled copy (a spawned DataLoader worker), though a tokenizer's JSON does not carry that setting."""
    import pickle

    from tokenizers import Tokenizer

    texts = ["a <|endoftext|> b", "plain text", "<|endoftext|>"]
    ds = OnlinePackedDataset(texts, tokenizer=Tokenizer.from_file(TOKENIZER), config=BuildConfig(context_length=64))
    (item,) = list(ds)
    docs = segments(item)
    assert len(docs) == 3 and all(d.count(ds.eos_id) == 1 and d[-1] == ds.eos_id for d in docs)
    assert rows(pickle.loads(pickle.dumps(ds))) == rows(ds)


@pytest.mark.parametrize("buffer_docs", [50, 60])  # 500 docs: the stream ends on a full buffer, or not
def test_online_fill_rate_counts_what_the_dataset_yields(buffer_docs):
    docs = numbered_docs(9, 500, 150)
    ds = OnlinePackedDataset(docs, config=BuildConfig(context_length=128, eos=False), buffer_docs=buffer_docs)
    out = rows(ds)
    r = online_fill_rate([len(d) for d in docs], 128, buffer_docs=buffer_docs)
    assert r["sequences"] == len(out) and r["tokens"] == sum(map(len, out)) and r["max_carry_bins"] > 0


def test_hf_datasets_map_style_and_iterable():
    datasets = pytest.importorskip("datasets")
    texts = sample_texts()[:300]
    kwargs = dict(tokenizer=TOKENIZER, config=BuildConfig(context_length=512), buffer_docs=64, rank=1, world_size=2)
    expected = rows(OnlinePackedDataset(texts, **kwargs))
    table = datasets.Dataset.from_dict({"text": texts})
    assert rows(OnlinePackedDataset(table, **kwargs)) == expected
    assert rows(OnlinePackedDataset(table.to_iterable_dataset(), **kwargs)) == expected


def test_same_seed_same_output_other_seed_same_rows_reordered():
    docs = numbered_docs(7, 400, 50)
    kwargs = dict(buffer_docs=100, eos_id=0)
    seeded = lambda seed: BuildConfig(context_length=64, seed=seed)  # noqa: E731
    a, b = rows(OnlinePackedDataset(docs, config=seeded(5), **kwargs)), rows(OnlinePackedDataset(docs, config=seeded(5), **kwargs))
    c = rows(OnlinePackedDataset(docs, config=seeded(6), **kwargs))
    assert a == b and a != c and sorted(a) == sorted(c)


@pytest.mark.parametrize("policy", ["split", "truncate", "drop"])
def test_long_doc_policies(policy):
    docs = numbered_docs(3, 100, 200)
    out = rows(OnlinePackedDataset(docs, config=BuildConfig(context_length=64, eos=False, long_docs=policy),
                                   buffer_docs=30))
    tokens = sorted(t for r in out for t in r)
    assert max(len(r) for r in out) <= 64
    if policy == "split":
        assert tokens == [t for d in docs for t in d]
    elif policy == "truncate":
        assert tokens == [t for d in docs for t in d[:64]]
    else:
        assert tokens == [t for d in docs if len(d) <= 64 for t in d]
    assert any(len(d) > 64 for d in docs)


def test_resume_anywhere_gives_the_uninterrupted_stream():
    docs = numbered_docs(11, 120, 60)
    make = lambda: OnlinePackedDataset(docs, config=BuildConfig(context_length=64, seed=2), buffer_docs=25,  # noqa: E731
                                       eos_id=0)
    full = rows(make())
    carried = 0
    for stop in range(len(full) + 1):
        first = make()
        it = iter(first)
        head = [tuple(next(it)["input_ids"].tolist()) for _ in range(stop)]
        state = json.loads(json.dumps(first.state_dict()))  # plain values: survives json and torch.save
        carried += bool(state["carry"]) and state["n_yielded"] > 0
        second = make()
        second.load_state_dict(state)
        assert head + rows(second) == full, stop
    assert carried  # some stops fell mid-buffer with a carry pending


@pytest.mark.filterwarnings("ignore:'set_vital' is deprecated")
def test_resume_through_stateful_dataloader_workers():
    stateful = pytest.importorskip("torchdata.stateful_dataloader")
    docs = numbered_docs(4, 200, 60)
    make = lambda: stateful.StatefulDataLoader(  # noqa: E731
        OnlinePackedDataset(docs, config=BuildConfig(context_length=64, seed=1), buffer_docs=20,
                            eos_id=0), batch_size=None, num_workers=2)
    full = rows(make())
    for stop in (7, len(full) // 2 + 1):  # each worker is mid-buffer at the first stop
        first = make()
        head = [tuple(item["input_ids"].tolist()) for _, item in zip(range(stop), first)]
        second = make()
        second.load_state_dict(first.state_dict())
        assert head + rows(second) == full


def test_resume_rejects_another_config_or_partition():
    docs = numbered_docs(0, 50, 20)
    ds = OnlinePackedDataset(docs, config=BuildConfig(context_length=32), buffer_docs=10, eos_id=0)
    state = ds.state_dict()
    with pytest.raises(ValueError, match="buffer_docs=10"):
        OnlinePackedDataset(docs, config=BuildConfig(context_length=32), buffer_docs=20,
                            eos_id=0).load_state_dict(state)
    other = OnlinePackedDataset(docs, config=BuildConfig(context_length=32), buffer_docs=10, eos_id=0, rank=1,
                                world_size=2)
    other.load_state_dict(state)
    with pytest.raises(ValueError, match="partition 0 of 1"):
        next(iter(other))


def test_ranks_and_workers_see_disjoint_parts_that_cover_the_stream():
    docs = numbered_docs(5, 200, 40)
    seen = []
    for rank in range(2):
        ds = OnlinePackedDataset(docs, config=BuildConfig(context_length=64, eos=False), buffer_docs=20, rank=rank,
                                 world_size=2)
        loader = DataLoader(ds, batch_size=None, num_workers=2)
        part = [seg[0] for item in loader for seg in segments(item)]
        seen.append(set(part))
    firsts = {d[0] for d in docs}
    assert seen[0].isdisjoint(seen[1]) and seen[0] | seen[1] == firsts
    # partition p = rank * workers + worker holds documents i with i % 4 == p
    assert {docs[i][0] for i in range(0, 200, 4)} | {docs[i][0] for i in range(1, 200, 4)} == seen[0]


def test_a_function_returning_an_iterator_is_a_source():
    docs = numbered_docs(2, 60, 30)
    ds = OnlinePackedDataset(lambda: iter(docs), config=BuildConfig(context_length=32, eos=False), buffer_docs=16,
                             rank=1, world_size=3)
    listed = OnlinePackedDataset(docs, config=BuildConfig(context_length=32, eos=False), buffer_docs=16, rank=1,
                                 world_size=3)
    assert rows(ds) == rows(listed) and rows(ds)


def test_bad_inputs_name_the_fix():
    with pytest.raises(ValueError, match="tokenizer=None"):
        list(OnlinePackedDataset(["text"], config=BuildConfig(context_length=8), eos_id=0))
    with pytest.raises(ValueError, match="eos_id=ID"):
        OnlinePackedDataset([[1, 2]], config=BuildConfig(context_length=8))
    with pytest.raises(ValueError, match="source document 1"):
        list(OnlinePackedDataset([[1], 3.5], config=BuildConfig(context_length=8, eos=False)))
    with pytest.raises(ValueError, match="pad_to=4"):
        OnlinePackedDataset([[1]], config=BuildConfig(context_length=8, eos=False), fields=ItemFields(pad_to=4))
    with pytest.raises(ValueError, match="buffer_docs"):
        OnlinePackedDataset([[1]], config=BuildConfig(context_length=8, eos=False), buffer_docs=0)
    with pytest.raises(ValueError, match="rank and world_size together"):
        OnlinePackedDataset([[1]], config=BuildConfig(context_length=8, eos=False), rank=1)
    with pytest.raises(ValueError, match="a path to a tokenizer.json or a tokenizers.Tokenizer; got dict"):
        OnlinePackedDataset(["text"], tokenizer={}, config=BuildConfig(context_length=8))


def test_stats_cli_reports_online_fill_rate(tmp_path):
    """`packer stats INPUT... --online --buffer-docs N` prints and records online_fill_rate."""
    import json

    from click.testing import CliRunner
    from conftest import SAMPLE_INPUTS, TOKENIZER, schema_errors

    from packer.cli import main

    out = tmp_path / "s.json"
    result = CliRunner().invoke(main, ["stats", *SAMPLE_INPUTS, "--tokenizer", TOKENIZER, "--context-length", "512",
                                       "--online", "--buffer-docs", "100", "--json", str(out)])
    assert result.exit_code == 0, result.output
    figures = json.loads(out.read_text())
    online = figures["online"]
    assert online["buffer_docs"] == 100 and online["buffers"] == -(-3894 // 100)
    assert online["tokens"] == figures["lengths"]["tokens"]  # split policy: every token packed
    assert online["sequences"] >= online["lower_bound_rows"]
    assert "online packing, 100-document buffers" in result.output
    assert schema_errors(figures) == []
