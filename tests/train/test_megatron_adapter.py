"""packer.megatron with megatron-core's own code on CPU: BlendedMegatronDatasetBuilder builds PackedGPTDataset over
a text build (--format megatron) and a chat build with loss masks (Arrow), blended and split; every sample is its
stored row as packer's own item (tokens, trained (context, target) pairs, positions, boundaries, the stored loss
mask); packed_seq_params gives Megatron-Core's PackedSeqParams with packer's cu_seqlens; the stock GPTDataset
re-packs the same files (what docs/format.md and `packer build --format megatron` warn of)."""

from __future__ import annotations

import subprocess
import sys
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")
with warnings.catch_warnings():  # megatron-core warns on import that Transformer Engine and Apex are absent
    warnings.simplefilter("ignore")
    builder = pytest.importorskip("megatron.core.datasets.blended_megatron_dataset_builder")
    gpt_dataset = pytest.importorskip("megatron.core.datasets.gpt_dataset")
    from megatron.core.packed_seq_params import PackedSeqParams
    from megatron.core.tokenizers.text.libraries.null_tokenizer import NullTokenizer

from click.testing import CliRunner  # noqa: E402
from conftest import ROOT, SAMPLE, TOKENIZER, build_sample  # noqa: E402
from torch.utils.data import default_collate  # noqa: E402

from packer.cli import main  # noqa: E402
from packer.data import ItemFields, PackedDataset, collate_padded, collate_varlen  # noqa: E402
from packer.megatron import PackedGPTDataset, collate_thd, packed_seq_params  # noqa: E402
from packer.store.dataset import open_dataset  # noqa: E402

IGNORE = -100
L = 256  # Megatron's sequence_length: both builds' rows padded to it
VOCAB = 16384  # the sample tokenizer's


@pytest.fixture(scope="module")
def text_build(tmp_path_factory):
    out = tmp_path_factory.mktemp("megatron-adapter") / "text"
    build_sample(out, context_length=L, format="megatron")
    return out


@pytest.fixture(scope="module")
def chat_build(tmp_path_factory):
    """Chat with loss masks (system and user turns untrained) at context 200: long conversations split."""
    from packer.config import BuildConfig, Job
    from packer.preprocess.pipeline import build

    out = tmp_path_factory.mktemp("megatron-adapter") / "chat"
    build(Job(inputs=(str(SAMPLE / "chat.jsonl"),), tokenizer=TOKENIZER, output=str(out), workers=1,
              config=BuildConfig(context_length=200, input_kind="chat")), progress="off")
    return out


def config(paths, weights, split, **overrides):
    settings = dict(random_seed=7, sequence_length=L, blend=(list(map(str, paths)), weights), split=split,
                    tokenizer=NullTokenizer(VOCAB), reset_position_ids=False, reset_attention_mask=False,
                    eod_mask_loss=False, create_attention_mask=False)
    return gpt_dataset.GPTDatasetConfig(**{**settings, **overrides})


def build_splits(paths, weights, split, sizes, **overrides):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return builder.BlendedMegatronDatasetBuilder(PackedGPTDataset, sizes, lambda: True,
                                                     config(paths, weights, split, **overrides)).build()


def packer_items(path) -> list[dict]:
    """Packer's own item of every stored row, in stored order, padded to L as the samples are."""
    return list(PackedDataset(str(path), shuffle=False, fields=ItemFields(pad_to=L)))


def trained_pairs_packer(item) -> list[tuple[int, int, int]]:
    """(document start, end of the context, target) of every trained target of a packer item: labels[j] is
    predicted from input_ids[start:j]."""
    starts = item["cu_seqlens"].tolist()
    labels = item["labels"].tolist()
    out = []
    for a, b in zip(starts[:-1], starts[1:]):
        out += [(a, j, labels[j]) for j in range(a, b) if labels[j] != IGNORE]
    return out


def trained_pairs_megatron(sample) -> list[tuple[int, int, int]]:
    """The same from a Megatron sample: where loss_mask is 1, labels[i] is predicted from tokens[start:i + 1]."""
    starts = sample["cu_seqlens"].tolist()
    labels, mask = sample["labels"].tolist(), sample["loss_mask"].tolist()
    out = []
    for a, b in zip(starts[:-1], starts[1:]):
        out += [(a, i + 1, labels[i]) for i in range(a, b) if mask[i] == 1.0]
    return out


def assert_sample_is_row(sample, item, n_tokens, stored_mask):
    """One Megatron sample against packer's item of its row (n_tokens stored tokens) and the row's stored loss
    mask (None: all trained)."""
    assert sample["tokens"].dtype == torch.int64 and sample["tokens"].shape == (L,)
    assert torch.equal(sample["tokens"], item["input_ids"])
    assert torch.equal(sample["position_ids"], item["position_ids"])
    assert sample["cu_seqlens"].dtype == torch.int32 and torch.equal(sample["cu_seqlens"], item["cu_seqlens"])
    assert sample["max_seqlen"].dim() == 0 and int(sample["max_seqlen"]) == int(item["max_seqlen"])
    assert sample["loss_mask"].dtype == torch.float32
    assert trained_pairs_megatron(sample) == trained_pairs_packer(item)
    # The loss mask from the stored bytes, token by token: position i trains token i + 1 when that token is
    # stored (not padding), starts no document and the stored mask trains it.
    starts = set(item["cu_seqlens"].tolist()[:-1])
    for i in range(L):
        j = i + 1
        trains = j < n_tokens and j not in starts and (stored_mask is None or stored_mask[j] == 1)
        assert sample["loss_mask"][i].item() == float(trains), i
        assert sample["labels"][i].item() == (sample["tokens"][j].item() if trains else IGNORE), i


def rows_of(blended, k):
    """(which dataset, its PackedGPTDataset, the stored row) of sample k of a BlendedDataset."""
    d = int(blended.dataset_index[k])
    mid = blended.datasets[d]
    return d, mid, int(mid.sample_rows[blended.dataset_sample_index[k]])


def test_builder_blends_and_splits_rows_and_each_sample_is_packers_item(text_build, chat_build):
    paths, weights = [text_build, chat_build], [0.4, 0.6]
    n = [len(open_dataset(p)) for p in paths]
    items = [packer_items(p) for p in paths]
    ds = [open_dataset(p) for p in paths]
    stored = [None, ds[1].mask_views(np.arange(n[1]))]
    assert ds[0].format == "megatron" and ds[1].format == "arrow" and stored[1] is not None
    sizes = [int(1.5 * n[1]), 60, 0]  # the chat build's train split is drawn over twice: two epochs of it
    train, valid, test = build_splits(paths, weights, "80,20,0", sizes)
    assert test is None and 0 <= len(train) - sizes[0] <= 2 and 0 <= len(valid) - sizes[1] <= 2  # Megatron rounds up
    for blended, lo, hi in ((train, 0.0, 0.8), (valid, 0.8, 1.0)):
        assert type(blended).__name__ == "BlendedDataset"
        for d, mid in enumerate(blended.datasets):
            assert isinstance(mid, PackedGPTDataset)
            split_rows = np.arange(int(round(lo * n[d])), int(round(hi * n[d])))
            epochs = len(mid.sample_rows) // len(split_rows)
            assert epochs >= 1 and len(mid.sample_rows) == epochs * len(split_rows) and len(mid) >= mid.num_samples
            for e in range(epochs):  # every row of the split once per epoch, none from another split
                assert sorted(mid.sample_rows[e * len(split_rows):(e + 1) * len(split_rows)]) == split_rows.tolist()
        shares = np.bincount(blended.dataset_index, minlength=2) / len(blended)
        assert np.abs(shares - weights).max() < 0.02, shares  # Megatron's blend
    assert len(train.datasets[1].sample_rows) > len(np.arange(0, int(round(0.8 * n[1]))))  # two epochs exercised
    seen = {0: set(), 1: set()}
    multi = masked_inside = 0
    for blended in (train, valid):
        for k in range(len(blended)):
            sample = blended[k]
            d, _, row = rows_of(blended, k)
            assert int(sample["dataset_id"]) == d
            assert_sample_is_row(sample, items[d][row], len(ds[d][row][0]), stored[d][row] if stored[d] is not None else None)
            seen[d].add(row)
            multi += len(sample["cu_seqlens"]) > 3  # two documents or more, then padding
            cu = sample["cu_seqlens"].tolist()
            masked_inside += d == 1 and any(sample["loss_mask"][a:b - 1].min() == 0 for a, b in zip(cu[:-2], cu[1:-1]))
    assert multi > 10 and masked_inside > 10 and len(seen[0]) > 20 and len(seen[1]) > 20  # the checks were exercised


def test_packed_seq_params_carry_packers_cu_seqlens(text_build, chat_build):
    train, _, _ = build_splits([chat_build], None, "100,0,0", [None, 0, 0])
    assert type(train).__name__ == "PackedGPTDataset"
    items = packer_items(chat_build)
    rows = [int(r) for r in train.sample_rows[:6]]
    samples = [train[k] for k in range(6)]
    for sample, row in zip(samples, rows):
        params = packed_seq_params(sample)
        assert isinstance(params, PackedSeqParams) and params.qkv_format == "thd"
        assert params.cu_seqlens_q.dtype == torch.int32 and torch.equal(params.cu_seqlens_q, items[row]["cu_seqlens"])
        assert params.cu_seqlens_kv is params.cu_seqlens_q
        assert params.max_seqlen_q == params.max_seqlen_kv == int(items[row]["max_seqlen"])
    # Megatron-LM's get_batch with micro-batch-size 1: cu_seqlens [1, n], max_seqlen [1] (it asserts both shapes)
    one = default_collate(samples[:1])
    assert one["cu_seqlens"].shape[0] == 1 and one["max_seqlen"].dim() == 1
    assert torch.equal(packed_seq_params(one).cu_seqlens_q, items[rows[0]]["cu_seqlens"])
    # several rows: collate_thd flattens them, merged boundaries as packer's collate_varlen of the same items
    thd = collate_thd(samples[:3])
    assert thd["tokens"].shape == (1, 3 * L) and thd["cu_seqlens"].shape[0] == 1 and thd["max_seqlen"].shape == (1,)
    packer_batch = collate_varlen([items[r] for r in rows[:3]])
    assert torch.equal(thd["tokens"], packer_batch["input_ids"])
    assert torch.equal(packed_seq_params(thd).cu_seqlens_q, packer_batch["cu_seqlens"])
    assert packed_seq_params(thd).max_seqlen_q == int(packer_batch["max_seqlen"])
    # a default-collated [B, L] batch (rows of equal segment counts stack): merged as packer's collate_padded
    by_count = {}
    for sample, row in zip([train[k] for k in range(len(train))], train.sample_rows.tolist()):
        by_count.setdefault(len(sample["cu_seqlens"]), []).append((sample, row))
    group = max(by_count.values(), key=len)[:3]
    assert len(group) == 3
    stacked = default_collate([s for s, _ in group])
    assert stacked["tokens"].shape == (3, L)
    padded = collate_padded([items[r] for _, r in group])
    assert torch.equal(packed_seq_params(stacked).cu_seqlens_q, padded["cu_seqlens"])
    # cu_seqlens padded with -1 (NeMo's and Megatron-LM's packed collate): the -1s are dropped
    tail = torch.cat([samples[0]["cu_seqlens"], torch.full((4,), -1, dtype=torch.int32)])[None]
    assert torch.equal(packed_seq_params({"cu_seqlens": tail}).cu_seqlens_q, items[rows[0]]["cu_seqlens"])
    with pytest.raises(ValueError, match=r"1 rows of cu_seqlens but tokens of shape \(2, 256\)"):
        packed_seq_params({"cu_seqlens": tail, "tokens": torch.zeros(2, L, dtype=torch.int64)})


HOST = ("max_seqlen", "n_boundaries")  # what a trainer keeps on the CPU when the rest of a batch moves to the GPU


class DeviceTensor(torch.Tensor):
    """A CPU tensor standing for one on a GPU, with its values: what would read a GPU tensor back to the host
    (item, tolist, bool, int, numpy, cpu) raises."""

    READS = {torch.Tensor.item, torch.Tensor.tolist, torch.Tensor.__bool__, torch.Tensor.__int__,
             torch.Tensor.__index__, torch.Tensor.__float__, torch.Tensor.numpy, torch.Tensor.cpu}

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        if func in cls.READS:
            raise RuntimeError(f"a device-to-host read: {func.__name__}")
        return super().__torch_function__(func, types, args, kwargs or {})


def on_device(batch, device):
    """The batch as a trainer moves it: every tensor but the host ints to `device` ("meta": shapes only, any read
    raises; "values": DeviceTensor)."""
    move = (lambda t: t.as_subclass(DeviceTensor)) if device == "values" else (lambda t: t.to(device))
    return {key: value if key in HOST else move(value) for key, value in batch.items()}


def assert_params_equal(got, expected, device):
    assert got.qkv_format == "thd" and got.max_seqlen_q == got.max_seqlen_kv == expected.max_seqlen_q
    assert isinstance(got.max_seqlen_q, int) and got.cu_seqlens_kv is got.cu_seqlens_q
    assert got.cu_seqlens_kv_padded is got.cu_seqlens_q_padded
    for field in ("cu_seqlens_q", "cu_seqlens_q_padded"):
        a, b = getattr(got, field), getattr(expected, field)
        if b is None:
            assert a is None
            continue
        assert a.dtype == torch.int32 and a.shape == b.shape
        if device == "meta":
            assert a.device.type == "meta"
        else:
            assert type(a) is DeviceTensor and torch.equal(a.as_subclass(torch.Tensor), b)


def host_int_batches(build) -> list[dict]:
    """Batches of the build's samples, without and with context parallelism: one sample, micro-batch 1
    default-collated, collate_thd of 3, a default-collated [3, L] batch, one sample's cu_seqlens padded with -1."""
    plain, _, _ = build_splits([build], None, "100,0,0", [None, 0, 0])
    cp, _, _ = build_splits([build], None, "100,0,0", [None, 0, 0], sequence_length=L_CP, context_parallel_size=CP)
    batches = []
    for train in (plain, cp):
        samples = [train[k] for k in range(len(train))]
        by_count = {}
        for sample in samples:
            by_count.setdefault(len(sample["cu_seqlens"]), []).append(sample)
        group = max(by_count.values(), key=len)[:3]
        assert len(group) == 3
        minus = torch.full((5,), -1, dtype=torch.int32)
        tail = {**samples[1], **{key: torch.cat([samples[1][key], minus]) for key in ("cu_seqlens", "cu_seqlens_padded")
                                 if key in samples[1]}}
        batches += [samples[0], default_collate(samples[:1]), collate_thd(samples[:3]), default_collate(group), tail]
    assert "cu_seqlens_padded" in batches[-1] and packed_seq_params(batches[-1]).cu_seqlens_q.tolist() == \
        batches[-1]["cu_seqlens"][:int(batches[-1]["n_boundaries"])].tolist()  # the -1s cut
    return batches


@pytest.mark.parametrize("device", ["meta", "values"])
def test_packed_seq_params_reads_nothing_back_from_the_device(chat_build, device):
    """With the batch's tensors on a device and its host ints (max_seqlen, n_boundaries) on the CPU, as Megatron's
    get_batch leaves max_seqlen, packed_seq_params gives the same PackedSeqParams as on the CPU without a
    device-to-host read: one sample, collate_thd, a default-collated [B, L] batch, with and without context
    parallelism, and cu_seqlens padded with -1 (cut at n_boundaries)."""
    batches = host_int_batches(chat_build)
    assert bool(torch.tensor([1]).any())  # a CPU read is no device read
    with pytest.raises((RuntimeError, NotImplementedError)):  # the stand-ins do refuse a read
        bool((on_device(batches[0], device)["cu_seqlens"] < 0).any())
    for batch in batches:
        assert_params_equal(packed_seq_params(on_device(batch, device)), packed_seq_params(batch), device)
    assert len(batches) == 10


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (benchmarks/gpu_check.sh runs it)")
def test_packed_seq_params_makes_no_device_sync_cuda(chat_build):
    """The GPU twin of the test above: the batches on CUDA (host ints left on the CPU), packed_seq_params under
    torch.cuda.set_sync_debug_mode("error") (a synchronizing CUDA call raises) equals the CPU result."""
    for batch in host_int_batches(chat_build):
        expected = packed_seq_params(batch)
        moved = {key: value if key in HOST else value.cuda() for key, value in batch.items()}
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            got = packed_seq_params(moved)
        finally:
            torch.cuda.set_sync_debug_mode("default")
        assert got.max_seqlen_q == got.max_seqlen_kv == expected.max_seqlen_q
        assert got.cu_seqlens_q.is_cuda and torch.equal(got.cu_seqlens_q.cpu(), expected.cu_seqlens_q)
        assert (got.cu_seqlens_q_padded is None) == (expected.cu_seqlens_q_padded is None)
        if expected.cu_seqlens_q_padded is not None:
            assert torch.equal(got.cu_seqlens_q_padded.cpu(), expected.cu_seqlens_q_padded)


def test_dense_attention_mask_and_the_padding_sample(chat_build):
    """create_attention_mask=True: [1, L, L], True where Megatron masks (a later token or another document);
    sample None (Megatron's padding sample) trains nothing."""
    train, _, _ = build_splits([chat_build], None, "100,0,0", [None, 0, 0])
    dense, _, _ = build_splits([chat_build], None, "100,0,0", [None, 0, 0], create_attention_mask=True)
    sample = dense[0]
    doc = np.searchsorted(sample["cu_seqlens"].numpy()[1:], np.arange(L), side="right")
    q, k = np.meshgrid(np.arange(L), np.arange(L), indexing="ij")
    expected = (k > q) | (doc[q] != doc[k])
    assert sample["attention_mask"].shape == (1, L, L) and sample["attention_mask"].dtype == torch.bool
    assert np.array_equal(sample["attention_mask"][0].numpy(), expected) and len(set(doc.tolist())) > 1
    blank = train[None]
    assert torch.equal(blank["tokens"], train[0]["tokens"]) and blank["loss_mask"].sum() == 0


def test_sequence_length_shorter_than_the_rows_is_one_line(chat_build):
    with pytest.raises(ValueError, match=r"chat: rows of up to 200 tokens .* set sequence_length >= 200"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            builder.BlendedMegatronDatasetBuilder(PackedGPTDataset, [None, 0, 0], lambda: True, gpt_dataset.GPTDatasetConfig(
                random_seed=1, sequence_length=128, blend=([str(chat_build)], None), split="100,0,0",
                tokenizer=NullTokenizer(VOCAB), reset_position_ids=False, reset_attention_mask=False,
                eod_mask_loss=False)).build()


def test_importing_the_face_does_not_import_megatron():
    code = "import sys, packer.megatron; assert 'megatron' not in sys.modules, sorted(sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]


def test_stock_gpt_dataset_repacks_and_the_build_says_so(text_build, tmp_path):
    """What docs/format.md's first lines and the build's notice say, measured with Megatron's own GPTDataset on
    the text build (its recommended settings for documents ending in EOS): its samples are not packer's rows."""
    shard = str(text_build / "shard-00000")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cfg = gpt_dataset.GPTDatasetConfig(random_seed=1, sequence_length=L, blend=([shard], None), split="100,0,0",
                                           tokenizer=NullTokenizer(VOCAB), reset_position_ids=True,
                                           reset_attention_mask=True, eod_mask_loss=True, create_attention_mask=False)
        stock, _, _ = builder.BlendedMegatronDatasetBuilder(gpt_dataset.GPTDataset, [None, 0, 0], lambda: True,
                                                            cfg).build()
    rows = {tuple(t.tolist()) for t, _ in open_dataset(text_build)}
    n = min(len(stock), 200)
    equal = sum(tuple(stock[k]["tokens"].tolist()) in rows for k in range(n))
    assert n > 100 and equal < n // 10  # re-chunked windows, not rows
    result = CliRunner().invoke(main, ["build", str(SAMPLE / "prose.jsonl"), "--tokenizer", TOKENIZER, "--output",
                                       str(tmp_path / "m"), "--format", "megatron", "--context-length", "512", "-q"])
    assert result.exit_code == 0, result.output
    assert "GPTDataset re-packs" in result.output and "packer.megatron.PackedGPTDataset" in result.output
    head = (ROOT / "docs" / "format.md").read_text(encoding="utf-8").split("\n## ")[0]
    assert "GPTDataset" in head and "PackedGPTDataset" in head


def thd_case(build, n_rows, device, dtype, heads=4, kv_heads=2, head_dim=32, seed=0):
    """q [T, H, D], k, v [T, K, D] over n_rows samples of a build collated by collate_thd, their PackedSeqParams, and
    the same rows' boundaries as packer's own loader gives them (collate_varlen of its items)."""
    train, _, _ = build_splits([build], None, "100,0,0", [None, 0, 0])
    batch = collate_thd([train[k] for k in range(n_rows)])
    params = packed_seq_params(batch)
    items = packer_items(build)
    packer_cu = collate_varlen([items[int(r)] for r in train.sample_rows[:n_rows]])["cu_seqlens"]
    n = batch["tokens"].shape[1]
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(n, h, head_dim, generator=g).to(device, dtype) for h in (heads, kv_heads, kv_heads))
    return q, k, v, params, packer_cu


def per_document_reference(q, k, v, cu_seqlens):
    """Each document alone: causal softmax attention in float64, grouped-query heads repeated."""
    out = torch.empty(q.shape, dtype=torch.float64)
    repeat = q.shape[1] // k.shape[1]
    bounds = cu_seqlens.tolist()
    for a, b in zip(bounds[:-1], bounds[1:]):
        qd, kd, vd = (x[a:b].double().cpu().transpose(0, 1) for x in (q, k, v))
        kd, vd = kd.repeat_interleave(repeat, 0), vd.repeat_interleave(repeat, 0)
        out[a:b] = torch.nn.functional.scaled_dot_product_attention(qd, kd, vd, is_causal=True).transpose(0, 1)
    return out


def test_packed_seq_params_give_per_document_attention_cpu(chat_build):
    """The CPU twin of gpu_check's Transformer Engine step: packer's varlen_attention over the flattened micro-batch,
    bounded by PackedSeqParams' cu_seqlens, equals each of packer's documents (its loader's boundaries) alone."""
    from packer.attention import varlen_attention

    q, k, v, params, packer_cu = thd_case(chat_build, 3, "cpu", torch.float32)
    assert len(packer_cu) > 5
    out = varlen_attention(q, k, v, params.cu_seqlens_q, params.max_seqlen_q)
    assert (out.double() - per_document_reference(q, k, v, packer_cu)).abs().max() < 1e-5


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (benchmarks/gpu_check.sh runs it)")
def test_transformer_engine_thd_attention_equals_varlen_attention_cuda(chat_build):
    """Transformer Engine's DotProductAttention in THD, given packer's PackedSeqParams as Megatron's
    TEDotProductAttention passes them, against packer's varlen_attention and the float64 per-document reference."""
    te = pytest.importorskip("transformer_engine.pytorch", reason="transformer_engine does not import here")
    from packer.attention import varlen_attention

    q, k, v, params, packer_cu = thd_case(chat_build, 4, "cuda", torch.bfloat16)
    heads, head_dim = q.shape[1], q.shape[2]
    attention = te.DotProductAttention(heads, head_dim, num_gqa_groups=k.shape[1], attn_mask_type="padding_causal",
                                       qkv_format="thd", attention_dropout=0.0)
    cu = params.cu_seqlens_q.cuda()
    theirs = attention(q, k, v, cu_seqlens_q=cu, cu_seqlens_kv=cu, max_seqlen_q=params.max_seqlen_q,
                       max_seqlen_kv=params.max_seqlen_kv).reshape(q.shape)
    ours = varlen_attention(q, k, v, cu, params.max_seqlen_q)
    reference = per_document_reference(q, k, v, packer_cu)
    assert (theirs.double().cpu() - reference).abs().max() < 2e-2
    assert (ours.double().cpu() - reference).abs().max() < 2e-2
    assert (theirs.float() - ours.float()).abs().max() < 2e-2


def test_a_dataset_pickles_by_name_for_spawned_workers(chat_build):
    """A DataLoader worker started by spawn gets the dataset pickled: the lazily made class is found by its name,
    the build reopened by its path (the same generation), the sample the same."""
    import pickle

    train, _, _ = build_splits([chat_build], None, "100,0,0", [None, 0, 0])
    again = pickle.loads(pickle.dumps(train))
    assert type(again) is PackedGPTDataset and again.dataset.generation == train.dataset.generation
    assert all(torch.equal(again[3][key], train[3][key]) for key in train[3])


def test_mock_data_is_refused_in_one_line():
    """No blend is Megatron's mock data: PackedGPTDataset has no build to read and says so."""
    with pytest.raises(Exception) as raised:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            builder.BlendedMegatronDatasetBuilder(PackedGPTDataset, [4, 0, 0], lambda: True, gpt_dataset.GPTDatasetConfig(
                random_seed=1, sequence_length=L, tokenizer=NullTokenizer(VOCAB), reset_position_ids=False,
                reset_attention_mask=False, eod_mask_loss=False)).build()
    cause = raised.value.__cause__ or raised.value  # Megatron wraps a mock dataset's error in its own
    assert isinstance(cause, ValueError) and "give GPTDatasetConfig(blend=" in str(cause)


def test_megatron_sample_follows_the_shift_rule_on_seeded_random_rows():
    """megatron_sample of make_item, token by token against the rule, over seeded random rows of 1..6 documents
    with random prompt/completion masks (some rows without a mask), padded or not."""
    from packer.data import make_item
    from packer.megatron import megatron_sample

    rng = np.random.default_rng(36)
    n_masked = n_multi = 0
    for _ in range(200):
        lengths = rng.integers(1, 10, rng.integers(1, 7))
        n = int(lengths.sum())
        tokens = rng.integers(0, 50, n).astype(np.uint16)
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
        mask = None if rng.random() < 0.25 else (rng.random(n) < 0.7).astype(np.uint8)
        pad_to = None if rng.random() < 0.3 else n + int(rng.integers(0, 5))
        sample = megatron_sample(make_item(tokens, offsets, loss_mask=mask, pad_to=pad_to, pad_id=7))
        width = n if pad_to is None else pad_to
        starts = set(offsets[:-1].tolist())
        for i in range(width):
            j = i + 1
            trains = j < n and j not in starts and (mask is None or mask[j] == 1)
            assert sample["labels"][i].item() == (int(tokens[j]) if trains else IGNORE)
            assert sample["loss_mask"][i].item() == float(trains)
        assert sample["tokens"][:n].tolist() == tokens.tolist() and (sample["tokens"][n:] == 7).all()
        n_masked += mask is not None and not mask.all()
        n_multi += len(lengths) > 1
    assert n_masked > 50 and n_multi > 50


# -- context parallelism: documents padded to 2 * cp, TE's cu_seqlens / cu_seqlens_padded ----------------------

CP = 2
K = 2 * CP  # every document's padded multiple
L_CP = 256  # a multiple of K, room for the chat build's rows (context 200) to grow by K - 1 a document


def cp_length(*paths) -> int:
    """The shortest sequence_length (a multiple of K) that holds every row of the builds with its documents padded."""
    longest = 0
    for path in paths:
        ds = open_dataset(path)
        for _, offsets in ds:
            lengths = np.diff(np.asarray(offsets, dtype=np.int64))
            longest = max(longest, int((-(-lengths // K) * K).sum()))
    return -(-longest // K) * K


def assert_cp_sample_is_row(sample, stored, offsets, stored_mask, pad_id, length, multiple=K):
    """A cp sample token by token against the stored row alone (its tokens, offsets and loss mask): document d of
    the row lies at the padded start P_d = sum of the earlier documents padded to `multiple`; position P_d + t holds its
    token t with position id t and, when token t + 1 is in the document and trained, predicts it from
    tokens[P_d : P_d + t + 1]; every other position is the pad id and trains nothing."""
    lengths = np.diff(offsets)
    padded = -(-lengths // multiple) * multiple
    starts = np.concatenate([[0], np.cumsum(padded)])
    tail = length - int(starts[-1])
    assert sample["cu_seqlens"].tolist() == np.concatenate([[0], np.cumsum(lengths), [lengths.sum() + tail] * (tail > 0)]).tolist()
    assert sample["cu_seqlens_padded"].tolist() == starts.tolist() + [length] * (tail > 0)
    assert sample["cu_seqlens_padded"].dtype == torch.int32 and (torch.diff(sample["cu_seqlens_padded"]) % multiple == 0).all()
    assert int(sample["max_seqlen"]) == int(torch.diff(sample["cu_seqlens_padded"]).max())
    tokens, labels, mask = sample["tokens"].tolist(), sample["labels"].tolist(), sample["loss_mask"].tolist()
    positions = sample["position_ids"].tolist()
    real = np.zeros(length, dtype=bool)
    for d, (o, n) in enumerate(zip(offsets[:-1].tolist(), lengths.tolist())):
        p = int(starts[d])
        real[p:p + n] = True
        for t in range(n):
            assert tokens[p + t] == int(stored[o + t]) and positions[p + t] == t
            trains = t + 1 < n and (stored_mask is None or stored_mask[o + t + 1] == 1)
            assert mask[p + t] == float(trains) and labels[p + t] == (int(stored[o + t + 1]) if trains else IGNORE)
            if trains:  # its context is the document's prefix, nothing before the padded start
                assert tokens[p:p + t + 1] == [int(x) for x in stored[o:o + t + 1]]
    assert all(tokens[i] == pad_id and mask[i] == 0.0 and labels[i] == IGNORE for i in np.flatnonzero(~real))
    return int((~real).sum()) - tail  # padding between documents


def test_context_parallel_samples_pad_each_document_and_train_packers_pairs(text_build, chat_build):
    """context_parallel_size=2 over a blend of the text and the chat build: every sample is its stored row laid out
    with each document padded to 4 (token by token against the stored bytes), and equals packer's own item with
    ItemFields(pad_multiple=4) shifted to Megatron's labels."""
    from packer.megatron import megatron_sample

    paths = [text_build, chat_build]
    length = cp_length(*paths)  # the text build's rows of many short documents grow past its context, 256
    assert length > L
    ds = [open_dataset(p) for p in paths]
    items = [list(PackedDataset(str(p), shuffle=False, fields=ItemFields(pad_to=length, pad_multiple=K)))
             for p in paths]
    stored_masks = [None, ds[1].mask_views(np.arange(len(ds[1])))]
    train, _, _ = build_splits(paths, [0.5, 0.5], "100,0,0", [120, 0, 0], sequence_length=length,
                               context_parallel_size=CP)
    gaps = multi = masked = 0
    for k in range(len(train)):
        sample = train[k]
        d, _, row = rows_of(train, k)
        (tokens,), (offsets,) = ds[d].views([row])
        stored_mask = None if stored_masks[d] is None else stored_masks[d][row]
        gaps += assert_cp_sample_is_row(sample, tokens, np.asarray(offsets), stored_mask,
                                        train.datasets[d].pad_id, length)
        expected = megatron_sample(items[d][row])
        assert all(torch.equal(sample[key], expected[key]) for key in expected), k
        multi += len(offsets) > 2
        masked += stored_mask is not None and not stored_mask.all()
    assert gaps > 100 and multi > 20 and masked > 20  # padding between documents, several documents, loss masks


def test_context_parallel_packed_seq_params_as_megatron_makes_them(chat_build, monkeypatch):
    """packed_seq_params of a cp sample equals megatron-core 0.16.1's own get_thd_batch_on_this_cp_rank (what
    Megatron-LM's get_batch calls with the batch's cu_seqlens, cu_seqlens_padded, max_seqlen); its cp = 2 slicing,
    run with a reference of Transformer Engine's thd_get_partitioned_indices (CUDA only: written from TE's kernel
    thd_partition_indices_kernel, common/fused_attn; megatron asks for TE >= 1.10), takes the layout: every padded
    span divisible by 2 * cp (as TE asserts), each rank half the tokens, the ranks' trained labels the sample's, once."""
    from megatron.core import utils as mcore_utils

    train, _, _ = build_splits([chat_build], None, "100,0,0", [None, 0, 0], sequence_length=L_CP,
                               context_parallel_size=CP)
    items = list(PackedDataset(str(chat_build), shuffle=False, fields=ItemFields(pad_to=L_CP, pad_multiple=K)))
    rows = [int(r) for r in train.sample_rows[:4]]
    samples = [train[k] for k in range(4)]
    for sample, row in zip(samples, rows):
        params = packed_seq_params(sample)
        assert torch.equal(params.cu_seqlens_q, items[row]["cu_seqlens"]) and params.cu_seqlens_kv is params.cu_seqlens_q
        assert torch.equal(params.cu_seqlens_q_padded, items[row]["cu_seqlens_padded"])
        assert params.cu_seqlens_kv_padded is params.cu_seqlens_q_padded
        assert params.max_seqlen_q == params.max_seqlen_kv == int(items[row]["max_seqlen"])
    # Megatron's own: micro-batch 1 default-collated, cu_seqlens [1, n] -> [n] as Megatron-LM's get_batch squeezes
    one = default_collate(samples[:1])
    theirs_batch = {key: one[key] for key in ("tokens", "labels", "loss_mask", "position_ids")}
    _, theirs = mcore_utils.get_thd_batch_on_this_cp_rank(dict(theirs_batch), one["cu_seqlens"][0],
                                                          one["cu_seqlens_padded"][0], one["max_seqlen"],
                                                          cp_size=1, cp_rank=0)
    ours = packed_seq_params(one)
    for field in ("qkv_format", "cu_seqlens_q", "cu_seqlens_kv", "cu_seqlens_q_padded", "cu_seqlens_kv_padded",
                  "max_seqlen_q", "max_seqlen_kv"):
        a, b = getattr(theirs, field), getattr(ours, field)
        assert torch.equal(a, b) if isinstance(a, torch.Tensor) else a == b, field

    def partitioned_indices(cu_seqlens_padded, total_tokens, world_size, rank):
        bounds = cu_seqlens_padded.tolist()
        assert all(b % (2 * world_size) == 0 for b in bounds) and total_tokens % (2 * world_size) == 0  # TE asserts
        out = []
        for a, b in zip(bounds[:-1], bounds[1:]):
            chunk = (b - a) // (2 * world_size)
            for c in (rank, 2 * world_size - 1 - rank):
                out += range(a + c * chunk, a + (c + 1) * chunk)
        return torch.tensor(out, dtype=torch.int32)

    monkeypatch.setattr(mcore_utils, "tex", type("tex", (), {"thd_get_partitioned_indices": staticmethod(
        partitioned_indices)}), raising=False)
    monkeypatch.setattr(mcore_utils, "is_te_min_version", lambda *args, **kwargs: True)
    trained = []
    for rank in range(CP):
        sliced, _ = mcore_utils.get_thd_batch_on_this_cp_rank(dict(theirs_batch), one["cu_seqlens"][0],
                                                              one["cu_seqlens_padded"][0], one["max_seqlen"],
                                                              cp_size=CP, cp_rank=rank)
        assert sliced["tokens"].shape == (1, L_CP // CP)
        trained += [(int(p), int(t)) for p, t, m in zip(sliced["position_ids"][0], sliced["labels"][0],
                                                       sliced["loss_mask"][0]) if m]
    whole = [(int(p), int(t)) for p, t, m in zip(one["position_ids"][0], one["labels"][0], one["loss_mask"][0]) if m]
    assert sorted(trained) == sorted(whole) and len(whole) > 20


def test_context_parallel_batches_merge_both_boundaries_as_packers_collates(chat_build):
    """collate_thd and a default-collated [B, L] batch of cp samples: cu_seqlens runs on by each row's real tokens,
    cu_seqlens_padded by its length, as packer's collate_varlen / collate_padded of the same padded items."""
    train, _, _ = build_splits([chat_build], None, "100,0,0", [None, 0, 0], sequence_length=L_CP,
                               context_parallel_size=CP)
    items = list(PackedDataset(str(chat_build), shuffle=False, fields=ItemFields(pad_to=L_CP, pad_multiple=K)))
    rows = [int(r) for r in train.sample_rows[:3]]
    samples = [train[k] for k in range(3)]
    thd = collate_thd(samples)
    varlen = collate_varlen([items[r] for r in rows])
    params = packed_seq_params(thd)
    assert torch.equal(thd["tokens"], varlen["input_ids"])
    assert torch.equal(params.cu_seqlens_q, varlen["cu_seqlens"])
    assert torch.equal(params.cu_seqlens_q_padded, varlen["cu_seqlens_padded"])
    assert params.cu_seqlens_q_padded[-1] == 3 * L_CP and params.cu_seqlens_q[-1] < 3 * L_CP  # padding exercised
    by_count = {}
    for k in range(len(train)):
        sample = train[k]
        by_count.setdefault(len(sample["cu_seqlens"]), []).append((sample, int(train.sample_rows[k])))
    group = max(by_count.values(), key=len)[:3]
    assert len(group) == 3
    stacked = packed_seq_params(default_collate([s for s, _ in group]))
    padded = collate_padded([items[r] for _, r in group])
    assert torch.equal(stacked.cu_seqlens_q, padded["cu_seqlens"])
    assert torch.equal(stacked.cu_seqlens_q_padded, padded["cu_seqlens_padded"])


def test_context_parallel_lengths_are_refused_in_one_line(chat_build):
    with pytest.raises(ValueError, match=r"chat: GPTDatasetConfig\(sequence_length=258\) is not a multiple of 2 \* "
                                         r"context_parallel_size = 4, .* set sequence_length to a multiple of 4"):
        build_splits([chat_build], None, "100,0,0", [None, 0, 0], sequence_length=258, context_parallel_size=CP)
    # At the context length, rows whose padded documents outgrow it are refused when the dataset is built, naming
    # the first such row of the split, its padded length and the longest (the row found by brute force here).
    ds = open_dataset(chat_build)
    padded = [sum(-(-n // K) * K for n in np.diff(np.asarray(offsets, np.int64)).tolist()) for _, offsets in ds]
    over = [r for r, n in enumerate(padded) if n > 200]
    assert over and max(padded) > 200
    first = over[0]
    documents = len(ds[first][1]) - 1
    with pytest.raises(ValueError, match=rf"chat: row {first} is {padded[first]} tokens with its {documents} documents "
                                         r"padded to multiples of 2 \* context_parallel_size = 4, more than "
                                         rf"GPTDatasetConfig\(sequence_length=200\) .* set sequence_length >= "
                                         rf"{max(padded)} .* at most C \+ 3 \* D\)$"):
        build_splits([chat_build], None, "100,0,0", [None, 0, 0], sequence_length=200, context_parallel_size=CP)
    # each split checks its own rows: the rows before the first too long build, with no sample asked of the rest
    assert first > 0
    train, valid, _ = build_splits([chat_build], None, f"{first},{len(padded) - first},0", [None, 0, 0],
                                   sequence_length=200, context_parallel_size=CP)
    assert sorted(train.sample_rows.tolist()) == list(range(first)) and valid.num_samples == 0


def test_padded_row_lengths_on_seeded_random_rows():
    """_padded_row_lengths (vectorised over many rows) against each row's documents padded one by one."""
    from packer.train.megatron import _padded_row_lengths

    assert [x.tolist() for x in _padded_row_lengths([np.array([0, 3, 5]), np.array([0, 4])], 4)] == [[8, 4], [2, 1]]
    rng = np.random.default_rng(5)
    for k in (1, 2, 4, 8):
        rows = [np.concatenate([[0], np.cumsum(rng.integers(1, 20, rng.integers(0, 8)))]).astype(np.int32)
                for _ in range(200)]
        got, documents = _padded_row_lengths(rows, k)
        assert got.tolist() == [sum(-(-int(n) // k) * k for n in np.diff(r)) for r in rows]
        assert documents.tolist() == [len(r) - 1 for r in rows]
        assert any(len(r) == 1 for r in rows) and any(len(r) > 3 for r in rows)  # empty and many-document rows


def test_megatron_sample_with_padded_documents_on_seeded_random_rows():
    """megatron_sample of make_item(pad_multiple=K) against the stored row alone, K in 2, 4, 8, over seeded random
    rows of 1..6 documents with random loss masks."""
    from packer.data import make_item
    from packer.megatron import megatron_sample

    rng = np.random.default_rng(3602)
    gaps = 0
    for k in (2, 4, 8):
        for _ in range(60):
            lengths = rng.integers(1, 12, rng.integers(1, 7))
            tokens = rng.integers(0, 50, int(lengths.sum())).astype(np.uint16)
            offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
            mask = None if rng.random() < 0.25 else (rng.random(len(tokens)) < 0.7).astype(np.uint8)
            length = int((-(-lengths // k) * k).sum()) + k * int(rng.integers(0, 3))
            sample = megatron_sample(make_item(tokens, offsets, loss_mask=mask, pad_to=length, pad_id=7, pad_multiple=k))
            gaps += assert_cp_sample_is_row(sample, tokens, offsets, mask, 7, length, multiple=k)
    assert gaps > 100


def cp_thd_case(build, n_rows, device, dtype, heads=4, kv_heads=2, head_dim=32, seed=0):
    """q [T, H, D], k, v [T, K, D] over n_rows cp = 2 samples collated by collate_thd, their PackedSeqParams and
    each document's real tokens as (start in the padded layout, count)."""
    train, _, _ = build_splits([build], None, "100,0,0", [None, 0, 0], sequence_length=L_CP, context_parallel_size=CP)
    params = packed_seq_params(collate_thd([train[k] for k in range(n_rows)]))
    real, padded = params.cu_seqlens_q.tolist(), params.cu_seqlens_q_padded.tolist()
    spans = [(p, b - a) for a, b, p in zip(real[:-1], real[1:], padded[:-1])]
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(padded[-1], h, head_dim, generator=g).to(device, dtype) for h in (heads, kv_heads, kv_heads))
    return q, k, v, params, spans


def assert_real_tokens_attend_per_document(out, q, k, v, spans, tolerance):
    """At every real token, `out` equals its document's real tokens alone (float64 causal reference)."""
    cu = torch.tensor([0] + np.cumsum([n for _, n in spans]).tolist(), dtype=torch.int32)
    pick = torch.cat([torch.arange(p, p + n) for p, n in spans])
    reference = per_document_reference(*(x[pick.to(x.device)] for x in (q, k, v)), cu)
    assert (out[pick.to(out.device)].double().cpu() - reference).abs().max() < tolerance


def test_context_parallel_layout_attends_per_document_cpu(chat_build):
    """The CPU twin of gpu_check's TE step for the cp layout: packer's varlen_attention over the layout's segments
    (masks.padded_segments of PackedSeqParams' cu_seqlens_q / cu_seqlens_q_padded) gives every real token exactly
    its document's attention, the padding between documents seen by none."""
    from packer import masks
    from packer.attention import varlen_attention

    q, k, v, params, spans = cp_thd_case(chat_build, 3, "cpu", torch.float32)
    segments = masks.padded_segments(params.cu_seqlens_q, params.cu_seqlens_q_padded)
    assert len(spans) > 5 and len(segments) > len(spans) + 1  # padding between documents exercised
    out = varlen_attention(q, k, v, segments, params.max_seqlen_q)
    assert_real_tokens_attend_per_document(out, q, k, v, spans, 1e-5)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (benchmarks/gpu_check.sh runs it)")
def test_transformer_engine_thd_attention_takes_the_context_parallel_layout_cuda(chat_build):
    """Transformer Engine's DotProductAttention in THD given the cp = 2 samples' PackedSeqParams (cu_seqlens_q real,
    cu_seqlens_q_padded the layout, as Megatron's TEDotProductAttention passes them), on one GPU: every real token
    equals its document alone. (The layout's split over cp ranks needs cp GPUs; not run here.)"""
    te = pytest.importorskip("transformer_engine.pytorch", reason="transformer_engine does not import here")

    q, k, v, params, spans = cp_thd_case(chat_build, 4, "cuda", torch.bfloat16)
    attention = te.DotProductAttention(q.shape[1], q.shape[2], num_gqa_groups=k.shape[1],
                                       attn_mask_type="padding_causal", qkv_format="thd", attention_dropout=0.0)
    cu, cu_padded = params.cu_seqlens_q.cuda(), params.cu_seqlens_q_padded.cuda()
    out = attention(q, k, v, cu_seqlens_q=cu, cu_seqlens_kv=cu, cu_seqlens_q_padded=cu_padded,
                    cu_seqlens_kv_padded=cu_padded, max_seqlen_q=params.max_seqlen_q,
                    max_seqlen_kv=params.max_seqlen_kv).reshape(q.shape)
    assert_real_tokens_attend_per_document(out, q, k, v, spans, 2e-2)
