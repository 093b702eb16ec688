"""packer.torchtitan against packer's own rows and torchtitan's own rules, on a text build and a chat build with
assistant-only loss masks: every sample ({"input", "positions"}, shifted labels) holds the stored row's tokens, the
stored documents' positions, exactly the trained (context, target) pairs of the stored loss mask, and
torchtitan's masks made from its positions (0.3.0: document id = cumsum(positions == 0); flex mask and varlen
cu_seqlens) equal packer's block-causal mask and cu_seqlens. torchtitan <= 0.2's EOS rule would not (chat rows).
Resume mid-epoch and across epochs is exact (StatefulDataLoader; torchtitan's ParallelAwareDataloader and a job
config's PackedTitanDataLoader.Config.build where torchtitan imports); dp ranks are disjoint and cover every row.
On a GPU with torchtitan installed (benchmarks/gpu_check.sh), its own mask helpers and VarlenAttention are checked
too.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torchdata")

from conftest import SAMPLE, TOKENIZER  # noqa: E402
from test_hf import build_small  # noqa: E402
from torchdata.stateful_dataloader import StatefulDataLoader  # noqa: E402

from packer.data import ItemFields, PackedDataset  # noqa: E402
from packer.store.dataset import open_dataset  # noqa: E402
from packer.torchtitan import PackedTitanDataset, titan_dataloader  # noqa: E402

EXTRA = 8  # seq_len = context length + EXTRA: every row ends in a padding segment
BATCH = 4


def build_chat(out, n_conversations=40):
    """Chat build, context 256, the default --train-roles assistant: 46 rows, 1,384 of 10,363 tokens trained; its
    template ends every message with the EOS id (<|endoftext|>, id 0), inside the documents."""
    from packer.config import BuildConfig, Job
    from packer.preprocess.pipeline import build

    source = out.parent / f"{out.name}-input.jsonl"
    with open(SAMPLE / "chat.jsonl", encoding="utf-8") as f:
        source.write_text("".join(next(f) for _ in range(n_conversations)), encoding="utf-8")
    build(Job(inputs=(str(source),), tokenizer=TOKENIZER, output=str(out), workers=1,
              config=BuildConfig(context_length=256, input_kind="chat")), progress="off")
    return out


@pytest.fixture(scope="module")
def builds(tmp_path_factory):
    """kind -> its build, made once per module."""
    built = {}

    def get(kind):
        if kind not in built:
            out = tmp_path_factory.mktemp(f"titan-{kind}") / "ds"
            built[kind] = build_small(out) if kind == "text" else build_chat(out)
        return built[kind]

    return get


@pytest.fixture(params=["text", "chat"])
def dataset(request, builds):
    return builds(request.param)


def seq_len_of(path) -> int:
    return int(open_dataset(path).manifest["config"]["context_length"]) + EXTRA


def _import_titan(what: str):
    """torchtitan's module, or pytest.skip with the exact reason it does not import here."""
    try:
        if what == "dataloader":
            from torchtitan.components import dataloader as module
        else:
            from torchtitan.models.common import attention as module
    except ImportError as e:
        pytest.skip(_why_not(e, what))
    return module


def _why_not(e: ImportError, what: str) -> str:
    """Checked 2026-12 on this CPU box, torchtitan 0.3.0 from PyPI."""
    extra = ("torchtitan 0.3.0 is not in the dev extra: with its dependencies it pins datasets<4.8, below the "
             "datasets 5.2 this project tests")
    triton = ("models/common/__init__ imports decoder -> moe -> token_dispatcher -> "
              "distributed/minimal_async_ep/kernels, which imports triton (GPU only; none beside CPU torch); the "
              "mask tests here check its rule through a reference copied from its models/common/attention.py")
    if e.name == "triton":
        return f"torchtitan 0.3.0's {triton}"
    if e.name == "torchtitan":
        return f"torchtitan is not installed ({extra})"
    also = f"; with them its {triton}" if what == "attention" else ""
    return (f"torchtitan imports {e.name}, a dependency `pip install --no-deps torchtitan==0.3.0` leaves out "
            f"({extra}){also}")


# -- torchtitan's rules, copied from its source ---------------------------------------------


def titan_document_ids(positions_BL: torch.Tensor) -> torch.Tensor:
    """torchtitan 0.3.0 models/common/attention.py, get_document_mask_mod: a document starts where positions == 0."""
    return torch.cumsum((positions_BL == 0).int(), dim=1) - 1


def titan_cu_seqlens(positions_BL: torch.Tensor) -> torch.Tensor:
    """torchtitan 0.3.0 create_varlen_metadata_for_document: each row's document starts, offset by row * L."""
    batch, length = positions_BL.shape
    starts = [(positions_BL[b] == 0).nonzero()[:, 0] + b * length for b in range(batch)]
    return torch.cat(starts + [torch.tensor([batch * length])]).to(torch.int32)


def eos_document_ids_v02(input_BL: torch.Tensor, eos_id: int) -> torch.Tensor:
    """torchtitan 0.2.0 models/attention.py, get_document_mask_mod(batch, eos_id): a document ends at each EOS."""
    eos_mask = input_BL == eos_id
    eos_mask[:, -1] = True
    cumulative = torch.cumsum(torch.where(eos_mask, 1, 0), dim=1)
    out = torch.zeros_like(cumulative, dtype=torch.int32)
    out[:, 1:] = cumulative[:, :-1]
    return out


def dense(mask_mod, length: int, b: int = 0) -> torch.Tensor:
    """A flex mask_mod over one row, as a dense [L, L] bool matrix."""
    q, kv = torch.arange(length)[:, None], torch.arange(length)[None, :]
    return mask_mod(torch.tensor(b), torch.tensor(0), q, kv).expand(length, length)


# -- each sample is the stored row ---------------------------------------------------------


def one_epoch(path, **kwargs):
    ds = PackedTitanDataset(path, seq_len=seq_len_of(path), infinite=False, **kwargs)
    return list(ds), ds


def stored_rows(path, rows):
    ds = open_dataset(path)
    (tokens, offsets) = ds.views(rows)
    masks = ds.mask_views(rows) if ds.has_loss_mask else [np.ones(len(t), np.uint8) for t in tokens]
    return [(t.astype(np.int64), o.astype(np.int64), m) for t, o, m in zip(tokens, offsets, masks)]


def test_each_sample_is_the_stored_row(dataset):
    samples, ds = one_epoch(dataset, seed=3)
    seq_len, pad_id = seq_len_of(dataset), int(open_dataset(dataset).manifest["config"].get("pad_id", 0))
    rows = ds.packed.epoch_rows({"rank": 0, "world_size": 1, "worker": 0, "num_workers": 1})
    assert len(samples) == len(rows) == len(open_dataset(dataset))
    items = list(PackedDataset(dataset, seed=3, fields=ItemFields(pad_to=seq_len, attention_mask=True)))
    n_multi = n_untrained = 0
    for (inputs, labels), (tokens, offsets, mask), item in zip(samples, stored_rows(dataset, rows), items):
        x, pos, n = inputs["input"], inputs["positions"], len(tokens)
        assert x.shape == pos.shape == labels.shape == (seq_len,) and x.dtype == labels.dtype == torch.int64
        assert x[:n].tolist() == tokens.tolist() and (x[n:] == pad_id).all()
        bounds = offsets.tolist() + [seq_len]  # the stored documents, then the padding segment
        assert pos.tolist() == [p for a, b in zip(bounds[:-1], bounds[1:]) for p in range(b - a)]
        starts = set(offsets[:-1].tolist())
        trained = {(i - 1, int(tokens[i])) for i in range(1, n) if i not in starts and mask[i]}
        assert {(i, int(labels[i])) for i in range(seq_len) if labels[i] != -100} == trained
        # packer's own item: the same tokens and positions, its labels one to the right
        assert torch.equal(x, item["input_ids"]) and torch.equal(pos, item["position_ids"])
        assert torch.equal(labels[:-1], item["labels"][1:]) and labels[-1] == -100
        # torchtitan's boundaries from positions: packer's cu_seqlens, and its mask packer's block-causal one
        assert torch.equal(titan_cu_seqlens(pos[None]), item["cu_seqlens"])
        doc = titan_document_ids(pos[None])[0]
        causal = torch.ones(seq_len, seq_len, dtype=torch.bool).tril()
        assert torch.equal(causal & (doc[:, None] == doc[None, :]), item["attention_mask"])
        n_multi += len(offsets) > 2
        n_untrained += int((mask[1:] == 0).sum())
    assert n_multi >= 5  # rows of several documents exercised
    if open_dataset(dataset).has_loss_mask:
        assert n_untrained > 1000  # chat: only the assistant turns are trained


def test_batches_give_torchtitans_varlen_metadata(dataset):
    """A [B, seq_len] batch: torchtitan's cu_seqlens over the flattened batch are the rows' stored offsets."""
    loader = titan_dataloader(PackedTitanDataset(dataset, seq_len=seq_len_of(dataset), shuffle=False), BATCH)
    inputs, labels = next(iter(loader))
    seq_len = seq_len_of(dataset)
    assert inputs["input"].shape == inputs["positions"].shape == labels.shape == (BATCH, seq_len)
    expected = [o + b * seq_len for b, (_, offsets, _) in enumerate(stored_rows(dataset, np.arange(BATCH)))
                for o in offsets.tolist()]  # each row's documents, then its padding segment (from offsets[-1])
    expected.append(BATCH * seq_len)
    assert titan_cu_seqlens(inputs["positions"]).tolist() == expected


def test_eos_masks_would_cross_packers_boundaries(builds):
    """torchtitan <= 0.2 found documents at EOS: the chat build's template ends every message with EOS, so that
    rule cuts its conversations inside (and tells its padding, pad id = EOS, apart token by token), while the
    positions rule gives packer's documents (test_each_sample_is_the_stored_row)."""
    chat = builds("chat")
    samples, _ = one_epoch(chat, shuffle=False)
    eos_id = int(open_dataset(chat).manifest["config"]["eos_id"])
    cut = 0
    for inputs, _ in samples:
        ours = titan_document_ids(inputs["positions"][None])[0]
        eos = eos_document_ids_v02(inputs["input"][None].clone(), eos_id)[0]
        n = int(torch.nonzero(ours == ours[-1])[0])  # the padding segment's start
        cut += len(set(eos[:n].tolist())) > len(set(ours[:n].tolist()))  # more documents than packer stored
    assert cut == len(samples), (cut, len(samples))  # measured 2026-12: 46 of 46 rows


def test_torchtitans_own_mask_helpers(dataset):
    attention = _import_titan("attention")
    samples, _ = one_epoch(dataset, shuffle=False)
    positions = torch.stack([inputs["positions"] for inputs, _ in samples[:BATCH]])
    assert torch.equal(attention.create_varlen_metadata_for_document(positions).cu_seq_q, titan_cu_seqlens(positions))
    for b in range(BATCH):
        doc = titan_document_ids(positions)[b]
        assert torch.equal(dense(attention.get_document_mask_mod(positions), positions.shape[1], b),
                           doc[:, None] == doc[None, :])


def test_seq_len_shorter_than_the_rows_is_one_line(builds):
    text, chat = builds("text"), builds("chat")
    longest = max(seq_len_of(text), seq_len_of(chat)) - EXTRA
    with pytest.raises(ValueError, match=rf"seq_len={longest - 1} is shorter than the context length {longest} of .*"
                                         rf"set torchtitan's training.seq_len >= {longest}"):
        PackedTitanDataset([text, chat], seq_len=longest - 1)


def test_balanced_rows_cost_once_and_deal_as_packers_loader(builds, monkeypatch):
    """With balance= passed through, every row's cost is read once (one PackedDataset, not one more to learn the
    context length), and the samples are the balanced PackedDataset's items, in its order."""
    from packer.data import Balance
    from packer.train import data

    dataset = builds("chat")
    calls = []
    counted = data.dataset_tokens_pairs
    monkeypatch.setattr(data, "dataset_tokens_pairs", lambda ds: calls.append(ds) or counted(ds))
    balance = Balance(window=2)
    titan = PackedTitanDataset(dataset, seq_len=seq_len_of(dataset), dp_rank=1, dp_world_size=2, infinite=False,
                               seed=3, balance=balance)
    assert len(calls) == 1
    ours = PackedDataset(str(dataset), rank=1, world_size=2, seed=3, balance=balance,
                         fields=ItemFields(pad_to=seq_len_of(dataset)))
    samples, items = list(titan), list(ours)
    assert len(samples) == len(items) > 10
    for (inputs, labels), item in zip(samples, items):
        assert torch.equal(inputs["input"], item["input_ids"]) and torch.equal(inputs["positions"], item["position_ids"])


# -- ranks and resume ----------------------------------------------------------------------


def row_key(inputs) -> tuple:
    return tuple(inputs["input"].tolist())


@pytest.mark.parametrize("world", [2, 3])
def test_dp_ranks_disjoint_and_covering(dataset, world):
    everything, _ = one_epoch(dataset, seed=1)
    keys = [row_key(inputs) for inputs, _ in everything]
    assert len(set(keys)) == len(keys)  # rows are told apart by their tokens
    shares = [[row_key(inputs) for inputs, _ in one_epoch(dataset, seed=1, dp_rank=r, dp_world_size=world)[0]]
              for r in range(world)]
    assert sorted(sum(shares, [])) == sorted(keys)  # each row on exactly one rank
    assert max(map(len, shares)) - min(map(len, shares)) <= 1


def test_infinite_goes_on_with_the_next_epochs_order(dataset):
    """infinite=True (the default): after an epoch, the next epoch's seeded order (its rows again, each once,
    shuffled anew), the one PackedTitanDataset(epoch=1) gives; not the same order again."""
    n = len(open_dataset(dataset))
    endless = PackedTitanDataset(dataset, seq_len=seq_len_of(dataset), seed=4)
    samples = [row_key(inputs) for inputs, _ in itertools.islice(endless, 2 * n)]
    first, second = samples[:n], samples[n:]
    assert sorted(first) == sorted(second) and len(set(first)) == n
    assert first != second
    assert second == [row_key(inputs) for inputs, _ in one_epoch(dataset, seed=4, epoch=1)[0]]


def _batches(loader, n):
    return [(b[0]["input"].clone(), b[0]["positions"].clone(), b[1].clone()) for b in itertools.islice(loader, n)]


def _same(a, b) -> bool:
    return len(a) == len(b) and all(all(torch.equal(x, y) for x, y in zip(p, q)) for p, q in zip(a, b))


LOADERS = {
    "torchdata": lambda ds, **kw: StatefulDataLoader(ds, batch_size=BATCH, **kw),
    "titan_dataloader": lambda ds, **kw: titan_dataloader(ds, BATCH, **kw),
}


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("loader", sorted(LOADERS))
def test_resume_exact_mid_epoch_and_across_epochs(dataset, loader, num_workers):
    """Stop after k batches (mid-epoch 0), save the loader's state, resume in a new loader: the next batches,
    through two epoch ends, equal the uninterrupted run's."""
    def make():
        ds = PackedTitanDataset(dataset, seq_len=seq_len_of(dataset), seed=5, dp_rank=1, dp_world_size=2)
        return LOADERS[loader](ds, num_workers=num_workers, snapshot_every_n_steps=1)

    per_epoch = -(-len(make().dataset.packed) // BATCH) if num_workers == 0 else None
    k, n_after = 3, 2 * (per_epoch or 8) + 1
    run = _batches(make(), k + n_after)
    first = make()
    it = iter(first)
    assert _same(_batches(it, k), run[:k])
    state = first.state_dict()
    resumed = make()
    resumed.load_state_dict(state)
    assert _same(_batches(resumed, n_after), run[k:])
    assert not _same(run[k:k + 1], run[:1])  # the resumed batches are not the epoch's start again


def test_torchtitan_job_dataloader(dataset):
    """What a torchtitan job builds from `dataloader=PackedTitanDataLoader.Config(dataset_path=...)`: the trainer's
    build(dp_world_size, dp_rank, tokenizer, seq_len, local_batch_size, snapshot_every_n_steps) call gives the
    same batches as titan_dataloader, and torchtitan's checkpoint state (keyed by dp rank) resumes exactly."""
    loader_module = _import_titan("dataloader")
    from packer.torchtitan import PackedTitanDataLoader

    seq_len = seq_len_of(dataset)
    config = PackedTitanDataLoader.Config(dataset_path=str(dataset), seed=2)

    def build(rank):
        return config.build(dp_world_size=2, dp_rank=rank, tokenizer=None, seq_len=seq_len, local_batch_size=BATCH,
                            snapshot_every_n_steps=1)

    loader = build(1)
    assert isinstance(loader, loader_module.ParallelAwareDataloader)
    ours = titan_dataloader(PackedTitanDataset(dataset, seq_len=seq_len, seed=2, dp_rank=1, dp_world_size=2), BATCH)
    run = _batches(ours, 6)
    it = iter(loader)
    assert _same(_batches(it, 2), run[:2])
    state = loader.state_dict()
    assert set(state) == {"dp_rank_1", "world_size"}
    resumed = build(1)
    resumed.load_state_dict(state)
    assert _same(_batches(resumed, 4), run[2:])


def test_torchtitan_varlen_attention_cuda(builds):
    """On a GPU, torchtitan 0.3's own VarlenAttention given the metadata it makes from a packer batch's positions
    equals packer's varlen_attention with the batch's stored boundaries, and a float64 per-document reference
    (bf16 kernels). CPU twins: test_each_sample_is_the_stored_row, test_batches_give_torchtitans_varlen_metadata."""
    if not torch.cuda.is_available():
        pytest.skip("torchtitan's VarlenAttention runs flash varlen kernels: CUDA only (benchmarks/gpu_check.sh)")
    attention = _import_titan("attention")
    from packer.attention import varlen_attention

    chat = builds("chat")
    inputs, _ = next(iter(titan_dataloader(PackedTitanDataset(chat, seq_len=seq_len_of(chat), shuffle=False), BATCH)))
    positions = inputs["positions"].cuda()
    batch, length, heads, head_dim = BATCH, positions.shape[1], 4, 64
    generator = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(batch, length, heads, head_dim, device="cuda", generator=generator, dtype=torch.bfloat16)
               for _ in range(3))
    metadata = attention.create_varlen_metadata_for_document(positions)
    theirs = attention.VarlenAttention(attention.VarlenAttention.Config())(q, k, v, attention_masks=metadata)
    cu_seqlens = titan_cu_seqlens(inputs["positions"]).cuda()
    assert torch.equal(metadata.cu_seq_q, cu_seqlens)
    flat = [t.reshape(batch * length, heads, head_dim) for t in (q, k, v)]
    ours = varlen_attention(*flat, cu_seqlens, int(cu_seqlens.diff().max()))
    reference = torch.cat([torch.nn.functional.scaled_dot_product_attention(
        *(t[a:b].transpose(0, 1).double() for t in flat), is_causal=True).transpose(0, 1)
        for a, b in zip(cu_seqlens[:-1].tolist(), cu_seqlens[1:].tolist())])
    assert (theirs.reshape(batch * length, heads, head_dim).double() - reference).abs().max() < 2e-2
    assert (ours.double() - reference).abs().max() < 2e-2
