"""HF transformers batches: packed rows that `model(**batch)` of an HF causal LM attends per document, on every
attention implementation, and a loader that Trainer and accelerate take without splitting it by rank again.

Two rows [a a a | b b] and [c c c c] give one flattened row (N = 9 tokens, three documents):

    input_ids       int64 [1, N]   a a a b b c c c c
    labels          int64 [1, N]   - a a - b - c c c       (- = -100: no token predicts across a boundary;
                                                            also every untrained token of fine-tuning data)
    position_ids    int64 [1, N]   0 1 2 0 1 0 1 2 3       resets: transformers' packed-sequence signal
    cu_seq_lens_q   int32 [4]      0 3 5 9                 flash_attention_2/3 varlen path (cu_seq_lens_k: the same)
    max_length_q    int            4                       (max_length_k: the same)
    use_cache       bool           False

How each attention implementation (transformers 5.24) reads it:
- eager, sdpa, flex_attention: masking_utils.create_causal_mask finds the documents from the position-id
  resets (find_packed_sequence_indices), but only when attention_mask is None *and there is no KV cache*.
  Llama, Qwen2, Mistral, ... configs default to use_cache=True, which makes the model create a DynamicCache
  in training too: then the mask is plain causal over all N tokens and documents see each other, silently
  (logits off by 0.27 on a 2-layer Llama, 2026-12). The batch carries use_cache=False, which the model's
  forward prefers over its config; and no attention_mask, which would switch detection off as well.
- flash_attention_2/3: with cu_seq_lens_q/k and max_length_q/k (python ints: no device sync) it calls
  flash_attn_varlen_func directly; labels shift inside the model's loss, so the -100 at each document's
  first token keeps the loss per document too.

`collate_hf` is the collate (DataLoader collate_fn, or PackedDataset(..., batch_size=B, collate_fn=collate_hf)).
`HFBatches` and `hf_dataloader` make the same batches with the same number on every rank (DDP steps in
lockstep, no row dropped or repeated); `PackedTrainerMixin` / `PackedTrainer` plug them into transformers.Trainer
(and, mixin first, into TRL's SFTTrainer).
docs/hf.md is the user's page.
"""

from __future__ import annotations

import copy
import inspect
import itertools

import numpy as np
import torch
from torch.utils.data import DataLoader, IterableDataset

from packer import masks
from packer.train.data import PackedDataset
from packer.train.items import collate_varlen

# -- the batch -----------------------------------------------------------------------------


def collate_hf(items: list[dict]) -> dict:
    """The HF batch of some items (see the module docstring): `model(**collate_hf(items))` of an HF causal LM
    equals each document run alone, loss included."""
    if "attention_mask" in items[0]:
        raise ValueError("collate_hf: items carry attention_mask; an HF batch must not (transformers builds the "
                         "block-causal mask from the position-id resets, and a mask passed in turns that off): "
                         "make the dataset without return_attention_mask")
    return hf_batch(collate_varlen(items))


def hf_batch(batch: dict) -> dict:
    """A collate_varlen batch (input_ids [1, N], cu_seqlens, max_seqlen, ...) as the HF batch.

    ItemFields(seq_idx=True): the batch carries `seq_idx` (int32 [1, N], the document index of each token, as
    DataCollatorWithFlattening(return_seq_idx=True) gives it; Mamba-style layers read it). ItemFields(pad_multiple=K)
    (documents padded apart): cu_seq_lens_q/k are the layout's segments, each document's padding one of its own
    (masks.padded_segments), and the batch also carries Transformer Engine's pair `cu_seqlens` (real tokens) and
    `cu_seqlens_padded`, and `n_tokens` (N, a python int)."""
    cu_seqlens, max_seqlen = batch["cu_seqlens"], int(batch["max_seqlen"])
    segments = cu_seqlens
    if "cu_seqlens_padded" in batch:
        segments = masks.padded_segments(cu_seqlens, batch["cu_seqlens_padded"])
        max_seqlen = int(segments.diff().max())  # host tensors: the longest segment, a real document or padding
    out = {"input_ids": batch["input_ids"], "labels": batch["labels"], "position_ids": batch["position_ids"],
           "cu_seq_lens_q": segments, "cu_seq_lens_k": segments, "max_length_q": max_seqlen,
           "max_length_k": max_seqlen, "use_cache": False}
    if "cu_seqlens_padded" in batch:
        out.update(cu_seqlens=cu_seqlens, cu_seqlens_padded=batch["cu_seqlens_padded"], n_tokens=batch["n_tokens"])
    if "seq_idx" in batch:
        out["seq_idx"] = batch["seq_idx"]
    if "source_ids" in batch:  # ItemFields(source_ids=True): pop it before model(**batch)
        out["source_ids"] = batch["source_ids"]
    return out


# -- the same number of batches on every rank -----------------------------------------------


def _split_sizes(n_items: int, n_smallest: int, batch_size: int) -> list[int]:
    """Batch sizes for a process with n_items when the smallest rank's same worker has n_smallest
    (n_items - n_smallest is 0 or 1): batches of batch_size, the last shorter, and the same count as the
    smallest. 9 items, 8 on the smallest, batch 4: [4, 5] (the ninth joins the last batch, not a third)."""
    n_batches = -(-n_smallest // batch_size)
    if n_items and not n_batches:
        raise ValueError(f"one rank has {n_items} packed rows for a DataLoader worker and another has none: the "
                         "dataset is too small for this world size x num_workers; use fewer workers, or "
                         "PackedDataset(drop_last=True)")
    sizes = [batch_size] * (n_items // batch_size) + ([n_items % batch_size] if n_items % batch_size else [])
    if len(sizes) > n_batches:  # one row more than the smallest, alone in a batch of its own: join the previous
        sizes[-2:] = [sizes[-2] + sizes[-1]]
    return sizes


class HFBatches(IterableDataset):
    """`collate_hf` batches of `batch_size` rows of a PackedDataset (made without batch_size), in its epoch
    order, with the same number of batches on every rank: rank shares differ by one row at most, and where
    that row would make a batch of its own it joins the rank's last batch. So every row is trained once per
    epoch, and DDP ranks step together. 9 rows on 2 ranks, batch_size 2: rank 0 owns 5 rows, rank 1 owns 4;
    rank 0's batches [2, 2, 1] would be one more than rank 1's [2, 2], so its last row joins: [2, 3].

    return_row_ids=True adds "row_ids" (int64 [rows]: the stored index of each row of the batch) for audits;
    pop it before model(**batch) (PackedTrainerMixin does). num_workers: the DataLoader's, for len().
    """

    def __init__(self, dataset: PackedDataset, batch_size: int, *, return_row_ids: bool = False,
                 num_workers: int = 0):
        if not isinstance(dataset, PackedDataset):
            raise TypeError(f"HFBatches takes a packer PackedDataset, got {type(dataset).__name__}")
        if dataset.batch_size is not None:
            raise ValueError(f"HFBatches forms the batches itself: give it PackedDataset({dataset.path!s}) made "
                             f"without batch_size (it has batch_size={dataset.batch_size})")
        if dataset.return_attention_mask:
            raise ValueError("HFBatches: the PackedDataset returns attention_mask; an HF batch must not carry one")
        if batch_size < 1:
            raise ValueError(f"batch_size={batch_size} must be at least 1")
        self.dataset, self.batch_size = dataset, batch_size
        self.return_row_ids, self.num_workers = return_row_ids, num_workers

    def set_epoch(self, epoch: int):
        self.dataset.set_epoch(epoch)

    def _shares(self, split: dict) -> tuple[int, int]:
        """(rows of this process, rows of the same worker on the rank with the fewest)."""
        ds, rank, world = self.dataset, split["rank"], split["world_size"]
        worker, n_workers = split["worker"], split["num_workers"]
        mine, smallest = ds.rank_count(rank, world), ds.rank_count(world - 1, world)
        return len(range(worker, mine, n_workers)), len(range(worker, smallest, n_workers))

    def __len__(self) -> int:
        """Batches per rank and epoch (the same on every rank), over all `num_workers` workers."""
        rank, world = self.dataset.rank_world()
        split = {"rank": rank, "world_size": world, "num_workers": max(1, self.num_workers)}
        return sum(len(_split_sizes(*self._shares({**split, "worker": w}), self.batch_size))
                   for w in range(split["num_workers"]))

    def _row_ids(self, split: dict) -> np.ndarray:
        """Stored row index of each item this process yields this epoch, in order (PackedDataset's order)."""
        return self.dataset.epoch_rows(split)

    def __iter__(self):
        ds = self.dataset
        if ds.resuming:
            raise ValueError("HFBatches: the PackedDataset has a loaded resume state; resume the HF loader by "
                             "skipping batches (Trainer and accelerate.skip_first_batches do)")
        split = ds.split()
        sizes = _split_sizes(*self._shares(split), self.batch_size)
        row_ids = self._row_ids(split) if self.return_row_ids else None
        items, start = iter(ds), 0
        for size in sizes:
            batch = collate_hf(list(itertools.islice(items, size)))
            if row_ids is not None:
                batch["row_ids"] = torch.from_numpy(row_ids[start:start + size])
            start += size
            yield batch


# -- accelerate and Trainer ----------------------------------------------------------------


def hf_dataloader(dataset: PackedDataset, batch_size: int, *, device=None, num_workers: int = 0,
                  return_row_ids: bool = False, **loader_kwargs) -> DataLoader:
    """A DataLoader of `HFBatches` that accelerate takes as it is: `Accelerator.prepare(loader)` (and the
    Trainer) return it unchanged instead of splitting it by rank a second time (PackedDataset already
    splits) or dispatching its batches from rank 0 (which cannot concatenate varlen rows).

    With accelerate installed it is accelerate's own DataLoaderShard for one process: batches moved to
    `device` (default: the device of the Accelerator made before this call; none made: batches stay on
    the CPU), set_epoch each epoch, end-of-epoch state for gradient accumulation. Without accelerate, a
    plain DataLoader.
    """
    batches = HFBatches(dataset, batch_size, return_row_ids=return_row_ids, num_workers=num_workers)
    loader = DataLoader(batches, batch_size=None, num_workers=num_workers, **loader_kwargs)
    try:
        from accelerate import PartialState
        from accelerate.data_loader import prepare_data_loader
    except ImportError:
        return loader
    if device is None and PartialState._shared_state:  # accelerate's device, once an Accelerator (or Trainer) set it up
        device = PartialState().device
    loader = prepare_data_loader(loader, device, num_processes=1, process_index=0, put_on_device=device is not None,
                                 dispatch_batches=False)
    loader._is_accelerate_prepared = True  # Accelerator.prepare_data_loader returns such a loader unchanged
    return loader


class PackedTrainerMixin:
    """For a transformers.Trainer (or a subclass: `class MyTrainer(PackedTrainerMixin, SFTTrainer)`): a
    PackedDataset train_dataset trains through `hf_dataloader` with per_device_train_batch_size rows a
    batch. No TrainingArguments to set: the collator, remove_unused_columns and accelerate's dispatch and
    split settings are not used for it.

    TRL's SFTTrainer (trl 1.16) accepts only a `datasets` Dataset / IterableDataset, reads one sample of it,
    then tokenizes and packs it in `_prepare_dataset`. Before a PackedDataset would reach it, the mixin hands
    it a one-row `datasets.Dataset` stand-in (the first packed row's input_ids and labels), makes
    `_prepare_dataset` return that as it is, and puts the PackedDataset back as train_dataset once the trainer
    is built. So SFTTrainer's collator never sees packer's rows (it ignores a `position_ids` column: without
    `seq_lengths` it numbers each row 0..N-1, one document, attending across packer's boundaries), and its
    compute_loss (the fused LM head: the labels' next-token loss over num_items_in_batch) runs on the
    collate_hf batch. SFTConfig settings that reshape data are refused: packer's build did that.
    """

    def __init__(self, *args, **kwargs):
        if not hasattr(super(), "_prepare_dataset"):  # transformers.Trainer takes a PackedDataset as it is
            super().__init__(*args, **kwargs)
            return
        bound = inspect.signature(super().__init__).bind_partial(*args, **kwargs)
        packed = bound.arguments.get("train_dataset")
        if not isinstance(packed, PackedDataset):
            super().__init__(*args, **kwargs)
            return
        _check_trl_config(bound.arguments.get("args"), type(self).__name__)
        self._packer_stand_in = bound.arguments["train_dataset"] = _trl_stand_in(packed)
        super().__init__(*bound.args, **bound.kwargs)
        self.train_dataset = packed

    def _prepare_dataset(self, dataset, *args, **kwargs):
        """TRL's dataset preparation, skipped for the PackedDataset's stand-in (packer tokenized and packed it)."""
        if dataset is getattr(self, "_packer_stand_in", None):
            return dataset
        if isinstance(dataset, PackedDataset):
            raise ValueError(f"{type(self).__name__}: an eval_dataset that is a PackedDataset ({dataset.path!s}) is "
                             "not taken (only train_dataset is): evaluate with packer.hf.hf_dataloader in your own "
                             "loop (docs/hf.md), or pass a datasets.Dataset")
        return super()._prepare_dataset(dataset, *args, **kwargs)

    def get_train_dataloader(self):
        dataset = self.train_dataset
        if not isinstance(dataset, PackedDataset):
            return super().get_train_dataloader()
        args = self.args
        if torch.distributed.is_initialized() and torch.distributed.get_world_size() != args.world_size:
            raise ValueError(f"{torch.distributed.get_world_size()} processes, but the Trainer runs as "
                             f"{args.world_size}: each rank would train its own model on its own share. On CPU "
                             "pass TrainingArguments(use_cpu=True) (accelerate runs CPU ranks as DDP only then)")
        loader = hf_dataloader(dataset, self._train_batch_size, device=args.device,
                               num_workers=args.dataloader_num_workers, pin_memory=args.dataloader_pin_memory,
                               return_row_ids=getattr(self, "return_row_ids", False))
        return self.accelerator.prepare(loader)  # registers it (save_state, gradient state); no re-wrapping

    def compute_loss(self, model, inputs, *args, **kwargs):
        inputs.pop("row_ids", None)
        inputs.pop("source_ids", None)
        return super().compute_loss(model, inputs, *args, **kwargs)


def _check_trl_config(config, trainer: str):
    """SFTConfig settings that would reshape the data; a PackedDataset was shaped by its build."""
    asked = [name for name in ("packing", "assistant_only_loss", "completion_only_loss")
             if getattr(config, name, None)]
    if asked:
        raise ValueError(f"{trainer}: SFTConfig({', '.join(f'{n}=True' for n in asked)}) with a PackedDataset: packer's "
                         "build already packed the rows and stored their loss mask (chat builds train the assistant "
                         "turns: --train-roles); leave these settings unset")


def _trl_stand_in(packed: PackedDataset):
    """A one-row datasets.Dataset (the PackedDataset's first item: input_ids, labels) for TRL's type check and its
    look at one sample; never trained on."""
    import datasets

    item = next(iter(copy.copy(packed)), None)  # a copy: the dataset's own iteration state stays untouched
    if item is None:
        raise ValueError(f"{packed.path!s}: the PackedDataset yields no row on this rank; use fewer ranks or more data")
    return datasets.Dataset.from_dict({"input_ids": [item["input_ids"].tolist()], "labels": [item["labels"].tolist()]})


_TRAINER = None


def __getattr__(name):  # PackedTrainer imports transformers only when asked for
    global _TRAINER
    if name != "PackedTrainer":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    if _TRAINER is None:
        from transformers import Trainer

        _TRAINER = type("PackedTrainer", (PackedTrainerMixin, Trainer), {
            "__doc__": "transformers.Trainer with PackedTrainerMixin: Trainer(train_dataset=PackedDataset(path))",
            "__module__": __name__})
    return _TRAINER
