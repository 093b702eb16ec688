"""Packed equals alone under a role policy: TinyGPT's loss and every parameter gradient on a packed batch of chat
conversations attended by a RolePolicy equal each conversation run alone under the same policy (float32 1e-5,
float64 1e-9; varlen and padded batches; every CPU backend that runs policies), also through the loader on a
chat build with --store-roles. Negative control: the same batch with the policy ignored differs by far more."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import torch.nn.functional as F  # noqa: E402
from conftest import SAMPLE, TOKENIZER  # noqa: E402

from packer.attention import available_backends  # noqa: E402
from packer.data import ItemFields, PackedDataset, collate_padded, collate_varlen, make_items  # noqa: E402
from packer.masks import DEFAULT_ROLES, RolePolicy  # noqa: E402
from packer.train.model import GPTConfig, TinyGPT  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py

VOCAB, CONTEXT = 97, 64
CPU_ROLES = [n for n, info in available_backends("cpu").items() if info["backward"] and info["roles"]]
TOL = {torch.float32: 1e-5, torch.float64: 1e-9}
POLICY = RolePolicy(window=6, role_windows={"user": 2}, global_roles={"system"})
S, U, A = DEFAULT_ROLES["system"], DEFAULT_ROLES["user"], DEFAULT_ROLES["assistant"]


def chat_rows(seed, n_rows=3):
    """Rows of conversations (a system turn, then user / assistant turns; assistant turns trained) filling
    a context of 64: (tokens, offsets, masks, role ids per row; the conversations as (ids, mask, roles))."""
    rng = np.random.default_rng(seed)
    rows, conversations = ([], [], [], []), []
    for _ in range(n_rows):
        row, room = [], CONTEXT
        while room >= 4:
            turns = [S] + [U if k % 2 == 0 else A for k in range(int(rng.integers(2, 6)))]
            roles = np.repeat(turns, rng.integers(1, 7, len(turns)))[:room].astype(np.uint8)
            row.append((rng.integers(0, VOCAB, len(roles)), (roles == A).astype(np.uint8), roles))
            room -= len(roles)
        conversations += row
        rows[0].append(np.concatenate([ids for ids, _, _ in row]))
        rows[1].append(np.concatenate([[0], np.cumsum([len(ids) for ids, _, _ in row])]))
        rows[2].append(np.concatenate([mask for _, mask, _ in row]))
        rows[3].append(np.concatenate([roles for _, _, roles in row]))
    return (*rows, conversations)


def packed_batch(rows, *, padded=False):
    """The loader's batch of the rows with role ids (collate_varlen, or collate_padded flattened to one row)."""
    tokens, offsets, masks, roles, _ = rows
    items = make_items(tokens, offsets, loss_masks=masks, role_ids=roles, pad_to=CONTEXT + 5 if padded else None)
    batch = collate_padded(items) if padded else collate_varlen(items)
    return {"input_ids": batch["input_ids"].reshape(-1), "labels": batch["labels"].reshape(-1),
            "position_ids": batch["position_ids"].reshape(-1), "cu_seqlens": batch["cu_seqlens"],
            "max_seqlen": batch["max_seqlen"], "role_ids": batch["role_ids"]}


def gradients(model, loss):
    model.zero_grad()
    loss.backward()
    return {name: p.grad.clone() for name, p in model.named_parameters()}


def alone(model, conversations, dtype):
    """Each conversation alone, under the model's policy: its trained targets' summed loss over the batch's count."""
    total, count = torch.zeros((), dtype=dtype), 0
    for ids, mask, roles in conversations:
        n = len(ids)
        logits = model(torch.from_numpy(ids), torch.arange(n), torch.tensor([0, n], dtype=torch.int32), n,
                       role_ids=torch.from_numpy(roles))
        losses = F.cross_entropy(logits[:-1].to(dtype), torch.from_numpy(ids[1:]), reduction="none")
        keep = torch.from_numpy(mask[1:].astype(bool))
        total, count = total + losses[keep].sum(), count + int(keep.sum())
    return total / count


def relative(a, b) -> float:
    return float((a - b).norm() / b.norm())


def differences(model, batch, reference_model, conversations, dtype) -> dict:
    """Relative |packed - alone| of the loss and the largest over parameter gradients; `reference_model`
    (the same weights) runs the conversations alone."""
    batch = dict(batch)
    if model.cfg.policy is None:
        batch.pop("role_ids")  # the negative control: the policy ignored
    if dtype == torch.float32:
        _, loss = model(**batch)
    else:
        labels = batch.pop("labels")
        loss = F.cross_entropy(model(**batch)[:-1], labels[1:], ignore_index=-100)
    g = gradients(model, loss)
    ref = alone(reference_model, conversations, dtype)
    g_ref = gradients(reference_model, ref)
    return {"loss": relative(loss.detach().to(dtype), ref.detach()),
            "grads": max(relative(g[name], g_ref[name]) for name in g)}


def tiny(backend, dtype, policy=POLICY, vocab=VOCAB, roles=None):
    torch.manual_seed(0)
    cfg = GPTConfig(vocab_size=vocab, dim=32, n_layers=2, n_heads=4, backend=backend, policy=policy, roles=roles)
    return TinyGPT(cfg).to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
@pytest.mark.parametrize("backend", CPU_ROLES)
@pytest.mark.parametrize("padded", [False, True], ids=["varlen", "padded"])
def test_tiny_model_packed_chat_with_a_policy_equals_each_conversation_alone(backend, dtype, padded):
    model = tiny(backend, dtype)
    for seed in range(3):
        rows = chat_rows(seed)
        conversations = rows[4]
        assert len(conversations) >= 6 and max(len(c[0]) for c in conversations) > 3 + 6  # windows bite
        d = differences(model, packed_batch(rows, padded=padded), model, conversations, dtype)
        assert d["loss"] < TOL[dtype] and d["grads"] < TOL[dtype], d


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
def test_negative_control_policy_ignored(dtype):
    """The packed batch run document-causally (no policy), against each conversation alone under the policy:
    far off (measured 2026-12-03: loss 5.2e-3, gradients 0.82 of their norm)."""
    rows = chat_rows(0)
    with_policy, without = tiny("sdpa", dtype), tiny("sdpa", dtype, policy=None)
    d = differences(without, packed_batch(rows), with_policy, rows[4], dtype)
    assert d["loss"] > 1e-3 and d["grads"] > 0.3, d


@pytest.fixture(scope="module")
def chat_roles_dataset(tmp_path_factory):
    from packer.config import BuildConfig, Job
    from packer.preprocess.pipeline import build

    out = tmp_path_factory.mktemp("roles-train") / "ds"
    job = Job(inputs=(str(SAMPLE / "chat.jsonl"),), tokenizer=TOKENIZER, output=str(out), workers=1,
              config=BuildConfig(context_length=256, input_kind="chat", store_roles=True))
    build(job, progress="off")
    return out


def test_loader_batches_train_as_each_stored_conversation_alone(chat_roles_dataset):
    """PackedDataset(fields=ItemFields(role_ids=True), batch_size=3) on a --store-roles build: TinyGPT's float64 loss and
    gradients under a policy equal the stored conversations (their pieces) run alone under it."""
    from packer.store.dataset import open_dataset

    loader = PackedDataset(chat_roles_dataset, shuffle=False, batch_size=3, fields=ItemFields(role_ids=True))
    batches = list(loader)
    k = max(range(len(batches)), key=lambda j: len(batches[j]["cu_seqlens"]))  # the batch with most segments
    ds = open_dataset(chat_roles_dataset)
    rows = np.arange(3 * k, min(3 * k + 3, len(ds)))
    (tokens, offsets), masks, roles = ds.views(rows), ds.mask_views(rows), ds.role_views(rows)
    conversations = [(t[a:b].astype(np.int64), m[a:b], r[a:b].copy()) for t, o, m, r in zip(tokens, offsets, masks, roles)
                     for a, b in zip(o[:-1].tolist(), o[1:].tolist())]
    assert len(conversations) >= 4 and {S, U, A} <= set(np.concatenate([c[2] for c in conversations]).tolist())
    batch = {key: (v.reshape(-1) if key in ("input_ids", "labels", "position_ids") else v)
             for key, v in batches[k].items()}
    model = tiny("bucketed", torch.float64, RolePolicy(role_windows={"user": 8}, global_roles={"system"}),
                 vocab=16384, roles=loader.roles)
    d = differences(model, batch, model, conversations, torch.float64)
    assert d["loss"] < 1e-9 and d["grads"] < 1e-9, d


def test_role_ids_follow_their_rows_blended_padded_and_streamed(chat_roles_dataset, tmp_path):
    """Each item's role_ids are its stored row's (padding masks.PAD_ROLE), through a blend of two datasets, and
    the same read from a memory:// copy; a dataset without role ids is refused with the fix."""
    import uuid

    from packer.io import fs
    from packer.masks import PAD_ROLE
    from packer.store.dataset import open_dataset

    ds = open_dataset(chat_roles_dataset)
    stored = {ds[i][0].astype(np.int64).tobytes(): ds.role_views([i])[0].astype(np.int64) for i in range(len(ds))}
    uri = f"memory://packer-role-train-{uuid.uuid4().hex}/ds"
    for file in sorted(chat_roles_dataset.iterdir()):
        fs.upload(file, fs.location(uri) / file.name)
    blend = PackedDataset({"a": chat_roles_dataset, "b": uri}, weights=[1, 1], num_samples=40,
                          fields=ItemFields(pad_to=300, role_ids=True))
    items = list(blend)
    for item in items:
        n = int(item["cu_seqlens"][-2])  # rows of <= 256 tokens padded to 300: the last segment is padding
        row = stored[item["input_ids"][:n].numpy().tobytes()]
        assert item["role_ids"][:n].tolist() == row.tolist() and (item["role_ids"][n:] == PAD_ROLE).all()
    assert len(items) == 40 and {S, U, A} <= set(torch.cat([i["role_ids"] for i in items]).tolist())
    with pytest.raises(ValueError, match="stores no role ids; build it with --input-kind chat --store-roles"):
        from masked_data import build_masked

        PackedDataset(build_masked(tmp_path / "plain"), fields=ItemFields(role_ids=True))
