"""packer.hf against HF transformers itself: a real packed batch through tiny config-built causal LMs (Llama,
Qwen2, Mistral with a sliding window, Gemma; float64) gives every logit, the loss and every parameter gradient
of each document run alone, on eager and sdpa (flex_attention: CPU forward in float32, slow), and on
flash_attention_2's varlen contract (CUDA, and a CPU twin). Negative controls: without the packed path
(use_cache=True, position ids without resets, an attention_mask of ones) the same check fails. HFBatches:
the same number of batches on every rank, each row once. HF `datasets` reads the Arrow shards without a copy.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import torch.nn.functional as F  # noqa: E402
from conftest import SAMPLE, TOKENIZER  # noqa: E402

from packer import masks  # noqa: E402
from packer.data import ItemFields, PackedDataset  # noqa: E402
from packer.hf import HFBatches, collate_hf  # noqa: E402
from packer.store.dataset import open_dataset  # noqa: E402
from packer.train.hf import _split_sizes  # noqa: E402

CONTEXT = 128
VOCAB = 16384  # the sample tokenizer's
TOL_F64 = 1e-9
# Float32 inside a float64 model: transformers' eager attention takes its softmax in float32
# (eager_attention_forward: softmax(..., dtype=float32)), and Gemma its RMSNorm; there the packed batch is exact
# to float32 rounding. Measured 2026-12 (transformers 5.24): eager logits 6e-8, grads 1.3e-9; Gemma grads 8e-10.
TOL_F32_INSIDE = 1e-6
TOL_HF_LOSS = 2e-5  # transformers' own .loss upcasts the logits to float32


def build_small(out, n_prose=56, n_code=0, context_length=CONTEXT):
    """A slice of the sample corpus built at a short context: with the defaults 37 rows of 1 to 6 documents."""
    from packer.config import BuildConfig, Job
    from packer.preprocess.pipeline import build

    lines = []
    for name, n in (("prose.jsonl", n_prose), ("code.jsonl", n_code)):
        with open(SAMPLE / name, encoding="utf-8") as f:
            lines += [next(f) for _ in range(n)]
    source = out.parent / f"{out.name}-input.jsonl"
    source.write_text("".join(lines), encoding="utf-8")
    job = Job(inputs=(str(source),), tokenizer=TOKENIZER, output=str(out), workers=1,
              config=BuildConfig(context_length=context_length))
    build(job, keep_work=False)
    return out


@pytest.fixture(scope="module")
def small_dataset(tmp_path_factory):
    return build_small(tmp_path_factory.mktemp("hf") / "ds")


@pytest.fixture(scope="module")
def packed_batch(small_dataset):
    """The batch of 3 rows (stored order) with the most documents: 14 of 10 to 93 tokens."""
    batches = list(PackedDataset(small_dataset, shuffle=False, batch_size=3, collate_fn=collate_hf))
    batch = max(batches, key=lambda b: len(b["cu_seq_lens_q"]))  # the first of the most
    lengths = batch["cu_seq_lens_q"].diff()
    assert len(lengths) >= 6 and lengths.max() > 16  # several documents, some longer than Mistral's window
    return batch


# -- models --------------------------------------------------------------------------------

SMALL = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=2 * CONTEXT)
FAMILIES = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", {}),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", {}),
    "mistral": ("MistralConfig", "MistralForCausalLM", {"sliding_window": 16}),  # windows inside documents
    "gemma": ("GemmaConfig", "GemmaForCausalLM", {"head_dim": 8}),
}


def make_model(family: str, attn: str, dtype=torch.float64, seed=0):
    config_name, model_name, extra = FAMILIES[family]
    config = getattr(transformers, config_name)(**SMALL, **extra)
    assert config.use_cache, "the trap this file guards against: configs default to use_cache=True"
    torch.manual_seed(seed)
    model = getattr(transformers, model_name)._from_config(config, attn_implementation=attn, dtype=dtype)
    return model.train()  # dropout is 0 in these configs: train mode changes nothing but the mode


def _documents(batch) -> list[torch.Tensor]:
    cu = batch["cu_seq_lens_q"].tolist()
    return [batch["input_ids"][0, a:b] for a, b in zip(cu[:-1], cu[1:])]


def _loss64(logits_NV, labels_N) -> torch.Tensor:
    """Token-weighted next-token loss in float64: logits at t predict labels at t + 1 (HF's shift)."""
    return F.cross_entropy(logits_NV[:-1].double(), labels_N[1:], ignore_index=-100, reduction="sum")


def per_document(model, batch):
    """Each document run alone: (logits [N, V] concatenated, loss over all their tokens, token count)."""
    logits, loss_sum, n_tokens = [], 0.0, 0
    for doc in _documents(batch):
        doc_logits = model(input_ids=doc[None], use_cache=False).logits[0]
        logits.append(doc_logits)
        loss_sum = loss_sum + _loss64(doc_logits, doc)
        n_tokens += len(doc) - 1
    return torch.cat(logits), loss_sum / n_tokens


def differences(model, batch, *, grads=True, **overrides) -> dict:
    """Max |packed - per document| of logits, float64 loss, HF .loss and (with grads) every parameter gradient."""
    params = [p for p in model.parameters() if p.requires_grad]
    packed = model(**{**batch, **overrides})
    labels = batch["labels"][0]
    loss = _loss64(packed.logits[0], labels) / (labels[1:] != -100).sum()
    ref_logits, ref_loss = per_document(model, batch)
    out = {"logits": (packed.logits[0] - ref_logits).abs().max().item(), "loss": abs(loss - ref_loss).item(),
           "hf_loss": abs(packed.loss.double() - ref_loss).item()}
    if grads:
        g_packed = torch.autograd.grad(loss, params)
        g_ref = torch.autograd.grad(ref_loss, params)
        out["grads"] = max((a - b).abs().max().item() for a, b in zip(g_packed, g_ref))
    return out


# -- the batch -----------------------------------------------------------------------------


def test_batch_fields(packed_batch):
    b = packed_batch
    cu, n = b["cu_seq_lens_q"], b["input_ids"].shape[1]
    assert set(b) == {"input_ids", "labels", "position_ids", "cu_seq_lens_q", "cu_seq_lens_k", "max_length_q",
                      "max_length_k", "use_cache"}
    assert b["use_cache"] is False and b["cu_seq_lens_k"] is cu and cu.dtype == torch.int32
    assert cu[0] == 0 and cu[-1] == n and type(b["max_length_q"]) is int and b["max_length_q"] == cu.diff().max()
    starts = torch.zeros(n, dtype=torch.bool)
    starts[cu[:-1].long()] = True
    expected_pos = torch.cat([torch.arange(int(length)) for length in cu.diff()])
    assert torch.equal(b["position_ids"][0], expected_pos)
    assert torch.equal(b["labels"][0], torch.where(starts, -100, b["input_ids"][0]))


def test_collate_hf_is_the_dataloader_collate(small_dataset):
    """PackedDataset(batch_size=B, collate_fn=collate_hf) equals DataLoader(batch_size=B, collate_fn=collate_hf)."""
    from torch.utils.data import DataLoader

    by_dataset = list(PackedDataset(small_dataset, seed=3, batch_size=4, collate_fn=collate_hf))
    by_loader = list(DataLoader(PackedDataset(small_dataset, seed=3), batch_size=4, collate_fn=collate_hf))
    assert len(by_dataset) == len(by_loader) > 3
    for a, b in zip(by_dataset, by_loader):
        assert a.keys() == b.keys()
        for key in a:
            assert torch.equal(a[key], b[key]) if torch.is_tensor(a[key]) else a[key] == b[key]


def test_attention_mask_is_refused(small_dataset):
    items = list(PackedDataset(small_dataset, shuffle=False, fields=ItemFields(attention_mask=True)))[:2]
    with pytest.raises(ValueError, match="attention_mask"):
        collate_hf(items)


# -- exact on every attention implementation ------------------------------------------------


@pytest.mark.parametrize("family", sorted(FAMILIES))
@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_packed_equals_each_document_alone(packed_batch, family, attn, one_torch_thread):
    d = differences(make_model(family, attn), packed_batch)
    tol = TOL_F64 if attn == "sdpa" else TOL_F32_INSIDE
    grad_tol = TOL_F32_INSIDE if family == "gemma" else tol
    assert d["logits"] < tol and d["loss"] < tol and d["grads"] < grad_tol, d
    assert d["hf_loss"] < TOL_HF_LOSS, d


@pytest.mark.parametrize("overrides", [{"use_cache": True}, {"position_ids": None}, {"attention_mask": "ones"}],
                         ids=["use_cache", "no_resets", "mask_of_ones"])
@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_negative_control_without_the_packed_path(packed_batch, attn, overrides, one_torch_thread):
    """The check above fails when transformers does not take its packed path: its documents see each other."""
    n = packed_batch["input_ids"].shape[1]
    if overrides.get("attention_mask") == "ones":
        overrides = {"attention_mask": torch.ones(1, n, dtype=torch.long)}
    if "position_ids" in overrides:
        overrides = {"position_ids": torch.arange(n)[None]}
    d = differences(make_model("llama", attn), packed_batch, grads=False, **overrides)
    assert d["logits"] > 1e-3 and d["loss"] > 1e-5, d


@pytest.mark.slow  # torch.compile of flex_attention on CPU: 55-80 s cold, 20 s with inductor's cache (2-core box, 2026-12)
def test_flex_attention_cpu_forward(packed_batch):
    """flex_attention on CPU (torch 2.13): float32 only, and no backward ("FlexAttention does not support
    backward on CPU"), so logits and loss, in float32."""
    model = make_model("llama", "flex_attention", dtype=torch.float32)
    with torch.no_grad():
        d = differences(model, packed_batch, grads=False)
    assert d["logits"] < 1e-4 and d["loss"] < 1e-5 and d["hf_loss"] < TOL_HF_LOSS, d


# -- flash_attention_2: its varlen contract on CPU, the real kernel on CUDA -----------------


VARLEN_CALLS = []


def _varlen_twin(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """What transformers' flash path computes (modeling_flash_attention_utils._flash_attention_forward), written
    with sdpa per segment: with no attention_mask and all four varlen kwargs, flash_attn_varlen_func, i.e. causal
    attention inside each [cu[i], cu[i+1]) of the flattened row; without them (a document run alone), plain
    causal flash over the row."""
    assert attention_mask is None, "flash's varlen path needs attention_mask None"
    names = ("cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k")
    if all(kwargs.get(k) is not None for k in names):
        cu_q, cu_k, max_q, max_k = (kwargs[k] for k in names)
        assert torch.equal(cu_q, cu_k) and cu_q.dtype == torch.int32 and cu_q[-1] == query.shape[2]
        assert type(max_q) is int and max_q == max_k == cu_q.diff().max()
        bounds = cu_q.tolist()
        VARLEN_CALLS.append(len(bounds) - 1)
    else:
        bounds = [0, query.shape[2]]
    groups = query.shape[1] // key.shape[1]
    q, k, v = query[0], key[0].repeat_interleave(groups, 0), value[0].repeat_interleave(groups, 0)  # [H, N, D]
    out = torch.empty_like(q)
    for a, b in zip(bounds[:-1], bounds[1:]):
        out[:, a:b] = F.scaled_dot_product_attention(q[:, a:b], k[:, a:b], v[:, a:b], is_causal=True, scale=scaling)
    return out.transpose(0, 1)[None], None  # [1, N, H, D], as flash returns it


@pytest.fixture(scope="module")
def varlen_twin():
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, flash_attention_mask

    AttentionInterface.register("packer_varlen_twin", _varlen_twin)
    ALL_MASK_ATTENTION_FUNCTIONS.register("packer_varlen_twin", flash_attention_mask)  # the mask flash gets
    return "packer_varlen_twin"


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_flash_varlen_contract_cpu_twin(packed_batch, family, varlen_twin, one_torch_thread):
    VARLEN_CALLS.clear()
    d = differences(make_model(family, varlen_twin), packed_batch)
    assert VARLEN_CALLS == [len(packed_batch["cu_seq_lens_q"]) - 1] * SMALL["num_hidden_layers"]  # the varlen path
    assert d["logits"] < TOL_F64 and d["loss"] < TOL_F64 and d["grads"] < TOL_F64, d


def _flash_attn_available() -> bool:
    try:
        import flash_attn  # noqa: F401
    except ImportError:
        return False
    return torch.cuda.is_available()


@pytest.mark.skipif(not _flash_attn_available(), reason="flash_attention_2 needs CUDA and the flash-attn package "
                    "(CPU twin: test_flash_varlen_contract_cpu_twin)")
@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_flash_attention_2_cuda(packed_batch, family):
    """The real kernel, bf16: packed against each document alone (both flash), and the loss against sdpa fp32."""
    batch = {k: v.cuda() if torch.is_tensor(v) else v for k, v in packed_batch.items()}
    model = make_model(family, "flash_attention_2", dtype=torch.bfloat16).cuda()
    with torch.no_grad():
        d = differences(model, batch, grads=False)
    assert d["logits"] < 5e-2 and d["loss"] < 1e-2, d
    reference = make_model(family, "sdpa", dtype=torch.float32).cuda()
    with torch.no_grad():
        _, ref_loss = per_document(reference, batch)
        assert abs(model(**batch).loss.double() - ref_loss).item() < 2e-2


# -- documents padded apart (context-parallel layouts) and seq_idx ---------------------------------


@pytest.fixture(scope="module")
def padded_batch(small_dataset):
    """The 3-row HF batch with the most documents, each padded to a multiple of 8, with seq_idx."""
    fields = ItemFields(pad_multiple=8, seq_idx=True)
    batches = list(PackedDataset(small_dataset, shuffle=False, fields=fields, batch_size=3, collate_fn=collate_hf))
    return max(batches, key=lambda b: len(b["cu_seqlens"]))


def test_padded_batch_fields(padded_batch):
    b = padded_batch
    real, padded, segments = b["cu_seqlens"], b["cu_seqlens_padded"], b["cu_seq_lens_q"]
    n = b["input_ids"].shape[1]
    assert set(b) == {"input_ids", "labels", "position_ids", "cu_seq_lens_q", "cu_seq_lens_k", "max_length_q",
                      "max_length_k", "use_cache", "cu_seqlens", "cu_seqlens_padded", "n_tokens", "seq_idx"}
    assert b["n_tokens"] == n == padded[-1] and real[-1] < n and (padded.diff() % 8 == 0).all()
    assert segments.dtype == torch.int32 and segments[-1] == n and b["max_length_q"] == segments.diff().max()
    # flash's segments: every document's real tokens, then its padding, each alone
    starts = set(padded[:-1].tolist()) | {p + r for p, r in zip(padded[:-1].tolist(), real.diff().tolist())}
    assert set(segments[:-1].tolist()) == starts - {n}
    expected_pos = torch.cat([torch.arange(int(length)) for length in segments.diff()])
    assert torch.equal(b["position_ids"][0], expected_pos)  # HF's eager/sdpa find the same segments from resets
    assert b["seq_idx"].dtype == torch.int32 and torch.equal(b["seq_idx"][0], masks.document_ids(segments).int())


def _real_documents(batch) -> list[tuple[int, torch.Tensor]]:
    """(place, tokens) of every real document: cu_seqlens_padded says where, cu_seqlens how long."""
    real, padded = batch["cu_seqlens"].tolist(), batch["cu_seqlens_padded"].tolist()
    return [(p, batch["input_ids"][0, p:p + b - a]) for a, b, p in zip(real[:-1], real[1:], padded[:-1])]


@pytest.mark.parametrize("attn", ["sdpa", "varlen_twin"])
def test_padded_documents_equal_each_document_alone(padded_batch, attn, varlen_twin, one_torch_thread):
    """Through the HF model, padding apart changes no real token's logits, loss or gradient."""
    model = make_model("llama", varlen_twin if attn == "varlen_twin" else attn)
    params = [p for p in model.parameters() if p.requires_grad]
    VARLEN_CALLS.clear()
    packed = model(**padded_batch)
    labels = padded_batch["labels"][0]
    loss = _loss64(packed.logits[0], labels) / (labels[1:] != -100).sum()
    ref_loss, n_trained, max_diff = 0.0, 0, 0.0
    for place, doc in _real_documents(padded_batch):
        doc_logits = model(input_ids=doc[None], use_cache=False).logits[0]
        max_diff = max(max_diff, (packed.logits[0, place:place + len(doc)] - doc_logits).abs().max().item())
        ref_loss, n_trained = ref_loss + _loss64(doc_logits, doc), n_trained + len(doc) - 1
    ref_loss = ref_loss / n_trained
    assert max_diff < TOL_F64 and abs(loss - ref_loss).item() < TOL_F64
    assert abs(packed.loss.double() - ref_loss).item() < TOL_HF_LOSS
    grads = [(a - b).abs().max().item() for a, b in zip(torch.autograd.grad(loss, params),
                                                         torch.autograd.grad(ref_loss, params))]
    assert max(grads) < TOL_F64
    if attn == "varlen_twin":  # flash's varlen path ran, over the segments
        assert VARLEN_CALLS == [len(padded_batch["cu_seq_lens_q"]) - 1] * SMALL["num_hidden_layers"]


# -- the same number of batches on every rank ----------------------------------------------


def test_split_sizes_by_hand():
    assert _split_sizes(9, 8, 4) == [4, 5]  # the ninth row would be a third batch: it joins the second
    assert _split_sizes(8, 8, 4) == [4, 4]
    assert _split_sizes(10, 9, 4) == [4, 4, 2]  # 3 batches on both
    assert _split_sizes(0, 0, 4) == []
    with pytest.raises(ValueError, match="too small"):
        _split_sizes(1, 0, 4)


@pytest.mark.parametrize("world,workers,batch_size,drop_last,merges", [
    (1, 1, 4, False, False), (2, 1, 4, False, False), (2, 1, 6, False, True), (3, 2, 2, False, True),
    (4, 3, 5, False, False), (3, 1, 4, True, False)])
def test_hf_batches_every_row_once_same_count_per_rank(small_dataset, world, workers, batch_size, drop_last, merges):
    """Over ranks (and DataLoader workers, as each one would iterate), every row once per epoch, each batch
    holding exactly the rows its row_ids name, and the same number of batches on every rank. 37 rows on 2 ranks,
    batch 6: rank 0 owns 19, rank 1 owns 18, so rank 0's 19th row joins its third batch (merges)."""
    from torch.utils.data import _utils

    stored = open_dataset(small_dataset)
    n = len(stored)
    assert n == 37
    seen, counts, sizes = [], [], []
    for rank in range(world):
        ds = PackedDataset(small_dataset, seed=5, epoch=2, rank=rank, world_size=world, drop_last=drop_last)
        batches = HFBatches(ds, batch_size, return_row_ids=True, num_workers=workers)
        n_batches = 0
        for worker in range(workers):  # what each DataLoader worker process would see
            _utils.worker._worker_info = _utils.worker.WorkerInfo(id=worker, num_workers=workers, seed=0,
                                                                  dataset=batches)
            try:
                for batch in batches:
                    rows = batch["row_ids"].tolist()
                    assert torch.equal(batch["input_ids"][0], torch.cat(
                        [torch.from_numpy(stored[r][0].astype(np.int64)) for r in rows]))
                    seen += rows
                    sizes.append(len(rows))
                    n_batches += 1
            finally:
                _utils.worker._worker_info = None
        assert n_batches == len(batches)
        counts.append(n_batches)
    assert len(set(counts)) == 1, counts
    assert (max(sizes) > batch_size) == merges and max(sizes) <= batch_size + 1
    if drop_last:
        assert len(seen) == len(set(seen)) == n // world * world
    else:
        assert sorted(seen) == list(range(n))


def test_hf_dataloader_with_workers_passes_through_accelerate(small_dataset):
    """Real DataLoader workers: every row once, len() the batches they make; Accelerator.prepare keeps it."""
    accelerate = pytest.importorskip("accelerate")
    from packer.hf import hf_dataloader

    loader = hf_dataloader(PackedDataset(small_dataset, seed=1), 4, num_workers=2, return_row_ids=True)
    batches = list(loader)
    assert len(batches) == len(loader) == 10  # 37 rows, 19 + 18 per worker: 5 + 5 batches
    assert sorted(r for b in batches for r in b["row_ids"].tolist()) == list(range(37))
    assert all(b["use_cache"] is False and type(b["max_length_q"]) is int for b in batches)
    try:
        assert accelerate.Accelerator(cpu=True).prepare(loader) is loader
    finally:
        accelerate.state.AcceleratorState._reset_state(reset_partial_state=True)  # no accelerate state for later tests


# -- HF datasets reads the shards ------------------------------------------------------------


def _shard_files(path) -> list[str]:
    return [str(path / entry["file"]) for entry in json.loads((path / "manifest.json").read_text())["shards"]]


def test_datasets_view_of_the_arrow_shards_without_a_copy(small_dataset):
    """A `datasets.Dataset` over the memory-mapped shards: nothing allocated, nothing in datasets' cache,
    and its rows (input_ids, offsets) are open_dataset's, in stored order."""
    datasets = pytest.importorskip("datasets")
    import pyarrow as pa

    before = pa.total_allocated_bytes()
    tables = [pa.ipc.open_stream(pa.memory_map(f)).read_all() for f in _shard_files(small_dataset)]
    view = datasets.Dataset(datasets.table.InMemoryTable(pa.concat_tables(tables)))
    assert pa.total_allocated_bytes() - before < 4096  # the tokens stay in the mapped files
    assert view.cache_files == []  # and were not written to datasets' cache
    stored = open_dataset(small_dataset)
    assert len(view) == len(stored) > 10
    for row, (tokens, offsets) in zip(view.with_format("numpy"), stored):
        assert np.array_equal(row["input_ids"], tokens) and np.array_equal(row["offsets"], offsets)


def test_datasets_from_file_opens_a_shard(small_dataset):
    """Shards are Arrow IPC streams, which `Dataset.from_file` memory-maps: its rows are open_dataset's and the
    batches collate_hf makes of PackedDataset's items (tests/store/test_hf_datasets.py: load_from_disk too)."""
    datasets = pytest.importorskip("datasets")
    files = _shard_files(small_dataset)
    view = datasets.concatenate_datasets([datasets.Dataset.from_file(f) for f in files])
    assert view.cache_files == [{"filename": f} for f in files]  # the shards themselves, no copy
    stored = open_dataset(small_dataset)
    assert view["input_ids"][0] == stored[0][0].tolist() and len(view) == len(stored) > 10
    batch = next(iter(PackedDataset(small_dataset, shuffle=False, batch_size=len(stored), collate_fn=collate_hf)))
    assert batch["input_ids"][0].tolist() == [t for row in view["input_ids"] for t in row]
    starts = np.cumsum([0] + [len(row) for row in view["input_ids"]])
    cu = sorted({int(s + o) for s, row in zip(starts, view["offsets"]) for o in row})
    assert batch["cu_seq_lens_q"].tolist() == cu
