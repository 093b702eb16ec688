"""TRL's SFTTrainer (trl 1.16) on packer builds through the docs/hf.md recipe, `class MyTrainer(PackedTrainerMixin,
SFTTrainer)` with `train_dataset=PackedDataset(path)`: on a text build and a chat build with assistant-only loss
masks, 3 steps of a tiny config-built Llama train on collate_hf batches of the PackedDataset's rows in its order,
each step's loss equals the model's own loss on that collate_hf batch, and the first step's loss equals each stored
document run alone under its stored mask (per-document attention: the cross-document loss of the same rows
differs). The trap the docs name: TRL's own collator turns a `position_ids` column into 0..N-1. Slow: 2 ranks
under torchrun each train their own PackedDataset share.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
trl = pytest.importorskip("trl")

import torch.nn.functional as F  # noqa: E402
from test_hf import build_small  # noqa: E402
from test_torchtitan import build_chat  # noqa: E402

from packer.data import PackedDataset  # noqa: E402
from packer.hf import PackedTrainerMixin, collate_hf  # noqa: E402
from packer.store.dataset import open_dataset  # noqa: E402

BATCH, STEPS, SEED = 4, 3, 0
# float32 throughout (bf16=False: SFTConfig's default bf16=True autocasts on CPU too, 4e-5 off). Measured 2026-12
# (trl 1.16, transformers 5.25): TRL's fused LM head against the model's own .loss on the collate_hf batch within
# 1e-6, step 1 against each document alone 4.4e-7; logits 1.5e-7, 0.32-0.38 with attention across documents.
TOL = 5e-6


class MyTrainer(PackedTrainerMixin, trl.SFTTrainer):
    """The docs/hf.md recipe."""


class AuditedTrainer(MyTrainer):
    """MyTrainer that records each step's batch (row_ids, input_ids, labels) and the loss it backpropagated."""

    return_row_ids = True

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.steps = []

    def compute_loss(self, model, inputs, *args, **kwargs):
        seen = {key: inputs[key].clone() for key in ("row_ids", "input_ids", "labels")}
        loss = super().compute_loss(model, inputs, *args, **kwargs)
        self.steps.append({**seen, "loss": loss.detach().clone()})
        return loss


@pytest.fixture(scope="module", params=["text", "chat"])
def dataset(request, tmp_path_factory):
    out = tmp_path_factory.mktemp(f"trl-{request.param}") / "ds"
    return build_small(out) if request.param == "text" else build_chat(out)


def tiny_llama(path, seed=SEED):
    manifest = open_dataset(path).manifest
    config = transformers.LlamaConfig(vocab_size=int(manifest["tokenizer"]["vocab_size"]), hidden_size=32,
                                      intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                                      num_key_value_heads=2, max_position_embeddings=512)
    torch.manual_seed(seed)
    return transformers.LlamaForCausalLM._from_config(config, attn_implementation="sdpa")


def build_tokenizer(path):
    """The build's own tokenizer.json, its eos the manifest's eos id."""
    eos_id = int(json.loads((Path(path) / "manifest.json").read_text())["config"]["eos_id"])
    tokenizer = transformers.PreTrainedTokenizerFast(tokenizer_file=str(Path(path) / "tokenizer.json"))
    tokenizer.eos_token = tokenizer.convert_ids_to_tokens(eos_id)
    return tokenizer


def sft_config(tmp_path, **kwargs):
    return trl.SFTConfig(str(tmp_path / "run"), max_steps=STEPS, per_device_train_batch_size=BATCH,
                         learning_rate=1e-3, logging_steps=1, save_strategy="no", report_to="none", seed=SEED,
                         use_cpu=True, bf16=False, **kwargs)  # SFTConfig defaults to bf16 autocast, CPU too


def stored_documents(path, rows):
    """Each stored document of `rows` with its labels from the stored loss mask (-100: first token, untrained)."""
    ds = open_dataset(path)
    (tokens, offsets) = ds.views(rows)
    masks = ds.mask_views(rows) if ds.has_loss_mask else [None] * len(rows)
    out = []
    for t, o, m in zip(tokens, offsets, masks):
        for a, b in zip(o[:-1].tolist(), o[1:].tolist()):
            doc = torch.from_numpy(t[a:b].astype(np.int64))
            labels = doc.clone()
            if m is not None:
                labels[torch.from_numpy(m[a:b] == 0)] = -100
            labels[0] = -100
            out.append((doc, labels))
    return out


def per_document_loss(model, documents) -> float:
    loss_sum, n_targets = 0.0, 0
    with torch.no_grad():
        for doc, labels in documents:
            logits = model(input_ids=doc[None], use_cache=False).logits[0].double()
            loss_sum += F.cross_entropy(logits[:-1], labels[1:], ignore_index=-100, reduction="sum").item()
            n_targets += int((labels[1:] != -100).sum())
    return loss_sum / n_targets


def test_sft_trainer_trains_packed_rows_as_collate_hf(dataset, tmp_path):
    model = tiny_llama(dataset)
    initial = copy.deepcopy(model)
    trainer = AuditedTrainer(model=model, args=sft_config(tmp_path), train_dataset=PackedDataset(dataset, seed=SEED),
                             processing_class=build_tokenizer(dataset))
    assert isinstance(trainer.train_dataset, PackedDataset)

    # the same rows in the same order: the PackedDataset's items, BATCH at a time, through collate_hf
    items = list(PackedDataset(dataset, seed=SEED))
    reference = [collate_hf(items[k:k + BATCH]) for k in range(0, BATCH * STEPS, BATCH)]
    expected_losses = []
    original = trainer.compute_loss

    def compute_loss_checked(model_, inputs, *args, **kwargs):  # the model's own loss on the reference batch, now
        batch = reference[len(expected_losses)]
        with torch.no_grad():
            expected_losses.append(model_(**batch).loss.item())
        return original(model_, inputs, *args, **kwargs)

    trainer.compute_loss = compute_loss_checked
    trainer.train()

    assert len(trainer.steps) == STEPS
    order = PackedDataset(dataset, seed=SEED).epoch_rows({"rank": 0, "world_size": 1, "worker": 0, "num_workers": 1})
    for k, (step, batch) in enumerate(zip(trainer.steps, reference)):
        assert step["row_ids"].tolist() == order[k * BATCH:(k + 1) * BATCH].tolist()
        assert torch.equal(step["input_ids"], batch["input_ids"]) and torch.equal(step["labels"], batch["labels"])
        assert abs(step["loss"].item() - expected_losses[k]) < TOL, (k, step["loss"].item(), expected_losses[k])
    logged = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    assert np.allclose(logged, [s["loss"].item() for s in trainer.steps], atol=1e-6)

    # per-document attention and the stored masks: step 1 equals each stored document of its rows run alone
    documents = stored_documents(dataset, trainer.steps[0]["row_ids"].numpy())
    assert len(documents) > BATCH  # some row holds several documents
    alone = per_document_loss(initial, documents)
    assert abs(trainer.steps[0]["loss"].item() - alone) < TOL
    first = reference[0]
    with torch.no_grad():  # the logits too; negative control: the same rows attending across documents
        alone_logits = torch.cat([initial(input_ids=doc[None], use_cache=False).logits[0] for doc, _ in documents])
        packed_logits = initial(**first).logits[0]
        crossed_logits = initial(input_ids=first["input_ids"], use_cache=False,
                                 position_ids=torch.arange(first["input_ids"].shape[1])[None]).logits[0]
    assert (packed_logits - alone_logits).abs().max() < 1e-5
    assert (crossed_logits - alone_logits).abs().max() > 1e-2
    if open_dataset(dataset).has_loss_mask:  # chat: the user and system turns are not trained
        n_masked = sum(int(((labels == -100).sum() - 1)) for _, labels in documents)
        assert n_masked > 100


def test_trl_collator_ignores_a_position_ids_column(dataset):
    """The trap: TRL's DataCollatorForLanguageModeling(padding_free=True) given packer's items (which carry
    position_ids) makes position ids 0..N-1 per row, so every packed row is one document; only a `seq_lengths`
    column gives it the boundaries (and then it equals collate_hf)."""
    from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

    items = [item for item in PackedDataset(dataset, shuffle=False) if len(item["cu_seqlens"]) > 2][:BATCH]
    assert len(items) == BATCH  # rows of several documents each
    collator = DataCollatorForLanguageModeling(pad_token_id=0, padding_free=True)
    plain = collator([{"input_ids": i["input_ids"].tolist(), "labels": i["labels"].tolist(),
                       "position_ids": i["position_ids"].tolist()} for i in items])
    ours = collate_hf(items)
    assert not torch.equal(plain["position_ids"], ours["position_ids"])
    assert len(plain["cu_seq_lens_q"]) == BATCH + 1  # one "document" per packed row
    with_lengths = collator([{"input_ids": i["input_ids"].tolist(), "labels": i["labels"].tolist(),
                              "seq_lengths": i["cu_seqlens"].diff().tolist()} for i in items])
    for key in ("input_ids", "labels", "position_ids", "cu_seq_lens_q", "max_length_q"):
        assert torch.equal(torch.as_tensor(with_lengths[key]), torch.as_tensor(ours[key])), key


def test_sft_settings_that_reshape_data_are_refused(tmp_path):
    path = build_small(tmp_path / "ds", n_prose=8)
    for setting in ({"packing": True}, {"assistant_only_loss": True}, {"completion_only_loss": True}):
        with pytest.raises(ValueError, match=f"{next(iter(setting))}=True"):
            MyTrainer(model=tiny_llama(path), args=sft_config(tmp_path, **setting), train_dataset=PackedDataset(path),
                      processing_class=build_tokenizer(path))


TWO_RANKS = """
import json, os, sys
from pathlib import Path
sys.path[:0] = sys.argv[3].split(os.pathsep)  # tests/train, tests (conftest), examples
import torch
import test_trl as T
from hf_trainer import end_process_group
from packer.data import PackedDataset
data, out = sys.argv[1], Path(sys.argv[2])
trainer = T.AuditedTrainer(model=T.tiny_llama(data), args=T.sft_config(out), train_dataset=PackedDataset(data, seed=T.SEED),
                           processing_class=T.build_tokenizer(data))
trainer.train()
rank = torch.distributed.get_rank()
(out / f"rows.{rank}").write_text(json.dumps([step["row_ids"].tolist() for step in trainer.steps]))
del trainer  # its DDP model goes before the process group (else a hang: end_process_group's docstring)
end_process_group()
"""


@pytest.mark.slow  # 2 processes under torchrun: 40 s on the busy 2-core box (2026-12); the one-process twin is fast
def test_sft_trainer_two_ranks(dataset, tmp_path):
    """SFTTrainer with the mixin under torchrun (2 CPU ranks, gloo): each rank steps STEPS times on its own
    PackedDataset share, in its order; the ranks' rows are disjoint."""
    import os
    import sys

    from test_hf_trainer import run_torchrun

    here = Path(__file__).parent
    script = tmp_path / "two_ranks.py"
    script.write_text(TWO_RANKS, encoding="utf-8")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1"}
    returncode, stderr = run_torchrun([sys.executable, "-m", "torch.distributed.run", "--standalone",
                                       "--nproc_per_node=2", str(script), str(dataset), str(tmp_path),
                                       os.pathsep.join(map(str, (here, here.parent, here.parents[1] / "examples")))],
                                      env=env, cwd=tmp_path)
    assert returncode == 0, stderr[-4000:]
    split = {"world_size": 2, "worker": 0, "num_workers": 1}
    seen = [json.loads((tmp_path / f"rows.{r}").read_text()) for r in range(2)]
    for rank, steps in enumerate(seen):
        order = PackedDataset(dataset, seed=SEED).epoch_rows({**split, "rank": rank})
        assert steps == [order[k * BATCH:(k + 1) * BATCH].tolist() for k in range(STEPS)]
    assert not set(sum(seen[0], [])) & set(sum(seen[1], []))
