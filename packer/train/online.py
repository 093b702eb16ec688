"""OnlinePackedDataset: documents from a stream, encoded and packed one bounded buffer at a time
(documents -> ids: packer/train/online_encode.py; the buffer, pack and carry steps: packer/online_pack.py).

Partitions: with R ranks and W DataLoader workers there are n = R * W partitions; partition
p = rank * W + worker owns the source documents i with i % n == p, so the partitions are disjoint
and together cover the stream. Each partition packs, shuffles and carries on its own.
"""

from __future__ import annotations

import collections
import itertools
import warnings
from dataclasses import asdict, replace

import numpy as np
from torch.utils.data import IterableDataset, get_worker_info

from packer.config import RECORD_FIELDS, BuildConfig
from packer.online_pack import CarryPolicy, check_online_args, cut_long, flat_indices, pack_buffer
from packer.train.items import ItemFields
from packer.train.online_encode import DocumentEncoder, Skips
from packer.train.partition import check_rank, current_split


class OnlinePackedDataset(IterableDataset):
    """Pack a stream of documents on the fly into items with exactly PackedDataset's fields.

        ds = OnlinePackedDataset(texts, tokenizer="tokenizer.json", config=BuildConfig(context_length=2048),
                                 fields=ItemFields(pad_to=2048))
        for item in DataLoader(ds, batch_size=None, num_workers=2):
            item["input_ids"], item["labels"], item["position_ids"], item["cu_seqlens"], item["max_seqlen"]

    `config` is the build's own BuildConfig: what a build decides about a sequence's tokens, online
    decides the same way from the same fields (context_length, algorithm, long_docs, seed, text_field,
    eos, bos, eos_token, bos_token, and the record settings input_kind ... long_prompts). A built
    dataset's `BuildConfig(**manifest["config"])`-style config packs the same documents online. The
    fields about files and shards (format, shard_size, unit_bytes, pack_group, plan_memory, text_split,
    strict, on_file_error, max_doc_bytes, max_skip_fraction) mean nothing to a stream and are not read.
    What only online decides is its own keyword: buffer_docs, eos_id / bos_id (ids that win over the
    tokenizer's), fields (ItemFields: padding and the opt-in fields), policy (CarryPolicy: which bins
    of a buffer wait for the next), rank / world_size.

    `source` yields texts, token-id lists (then `tokenizer` may be None) or dicts holding
    config.text_field (an HF `datasets` dataset); it may also be a function returning a fresh iterable.
    Texts become exactly the ids `packer build` stores (the one encode path, packer/encode/text.py);
    `tokenizer` is a tokenizer.json path, or a tokenizers.Tokenizer, which is copied and the copy
    configured, never changed itself; eos and bos are the build's too (DocumentEncoder,
    packer/train/online_encode.py).

    Fine-tuning examples, pre-tokenized, carry a loss mask: a dict {"input_ids": [...], "loss_mask":
    [0/1 ...]} or {"input_ids": [...], "labels": [... -100 ...]} (labels equal to input_ids except
    -100 on untrained tokens, HF's unshifted convention), or a pair (ids, loss_mask). They are taken
    as they are, no bos or eos added, as `packer build --input-kind tokens` takes them; their items'
    labels are -100 on untrained tokens (packer/train/items.py draws it). Long examples split as
    texts do, each piece keeping its part of the mask.

    Fine-tuning records, config.input_kind "prompt-completion" | "chat" | "tokens" (default "text": all
    of the above): dicts as `packer build --input-kind KIND` reads them, encoded RECORD_BATCH at a time
    by the build's own RecordEncoder (packer/encode/records.py), so each accepted example has exactly
    the ids and loss mask the build stores for it. The chat template is the one beside a tokenizer.json
    path (tokenizer_config.json, chat_template.jinja), or config.chat_template, which a tokenizers.Tokenizer
    object needs. input_kind "auto" reads each record's fields as the build's auto reads a file's first
    record: messages_field -> chat, ids_field -> tokens (labels or loss mask required), prompt_field and
    completion_field -> prompt-completion, text_field -> text; what is not a dict (a text, token ids, a
    pair) is taken as "text" takes it. Bad records are skipped, never raised: counted by the build's
    reasons in `skipped`, the first named in one warning (a dict with no kind's field, or a non-dict
    under a record kind: missing_field). A template that cannot give exact spans raises TemplateRefused.
    In a buffer the texts and plain ids come first, then each record kind's examples, in source order.

    fields=ItemFields(role_ids=True) (config.input_kind "chat"; config.role_names as the build's
    --role-names) gives each item the `role_ids` a build with --store-roles stores for its tokens, under
    the role table `roles`, for a packer.masks.RolePolicy (docs/role_masks.md); carried pieces keep
    theirs (the state's carry_roles). config.store_roles is not read: the items' fields decide.

    Resume re-reads the source from its start and skips what was consumed (a list or map-style
    dataset is indexed directly), so the source must give the same documents in the same order; the
    state holds the skip counts, so a resumed run counts what an uninterrupted one counts.
    """

    def __init__(self, source, *, tokenizer=None, config: BuildConfig = BuildConfig(), buffer_docs: int = 10_000,
                 eos_id: int | None = None, bos_id: int | None = None, fields: ItemFields = ItemFields(),
                 policy: CarryPolicy = CarryPolicy(), rank: int | None = None, world_size: int | None = None):
        if not isinstance(config, BuildConfig):
            raise ValueError(f"config must be a packer.BuildConfig (the build's settings), got {type(config).__name__}")
        check_online_args(config.context_length, buffer_docs, config.long_docs)
        if fields.pad_to is not None and fields.pad_to < config.context_length:
            raise ValueError(f"pad_to={fields.pad_to} is shorter than context_length={config.context_length}; "
                             "pad to at least the context length or leave pad_to=None")
        if fields.source_ids:
            raise ValueError("ItemFields(source_ids=True): an online stream has no named sources; build the "
                             "dataset with sources and read it with PackedDataset")
        check_rank(rank, world_size)
        if fields.role_ids and config.input_kind != "chat":
            raise ValueError(f"ItemFields(role_ids=True) gives the roles of chat messages: it needs "
                             f"BuildConfig(input_kind=\"chat\") (got {config.input_kind!r})")
        if config.input_kind == "chat":  # role ids are gathered exactly when the items carry them
            config = replace(config, store_roles=fields.role_ids)
        self.source, self.config, self.buffer_docs = source, config, buffer_docs
        self.encoder = DocumentEncoder(tokenizer, config, eos_id, bos_id)
        self.pad_id = fields.pad_id if fields.pad_id is not None else \
            (self.eos_id if self.eos_id is not None else 0)
        self.fields, self.policy, self.rank, self.world_size = fields, policy, rank, world_size
        self.return_role_ids = fields.role_ids
        self.roles = config.role_table if fields.role_ids else None
        self.epoch = 0
        self._resume: dict | None = None
        self._state: dict | None = None
        self._skipped: collections.Counter = collections.Counter()
        self._warned = False

    @property
    def tokenizer(self):
        return self.encoder.tokenizer

    @property
    def eos_id(self) -> int | None:
        return self.encoder.eos_id

    @property
    def bos_id(self) -> int | None:
        return self.encoder.bos_id

    @property
    def skipped(self) -> dict[str, int]:
        """Bad records this object's iteration skipped so far, by reason (the build's SKIP_REASONS names),
        a resumed state's included. Under DataLoader workers each worker counts its own (in its
        state_dict's "skipped"); the main process's copy never iterates."""
        return dict(sorted(self._skipped.items()))

    # -- resume ---------------------------------------------------------------------------------
    def _config(self) -> dict:
        c = self.config
        records = c.to_dict()  # the record settings only when records are read, as a manifest has them
        return {"context_length": c.context_length, "buffer_docs": self.buffer_docs,
                "algorithm": c.algorithm, "seed": c.seed, "long_docs": c.long_docs,
                "eos_id": self.eos_id, "bos_id": self.bos_id, **asdict(self.policy),
                "input_kind": c.input_kind,
                **{key: records[key] for key in (*RECORD_FIELDS, "store_roles", "role_names") if key in records}}

    def _fresh_state(self, partition: int, n_partitions: int) -> dict:
        return {"config": self._config(), "epoch": self.epoch, "partition": partition,
                "n_partitions": n_partitions, "source_pos": 0, "buffer_index": 0, "n_yielded": 0, "carry": [],
                "carry_masks": [], **({"carry_roles": []} if self.return_role_ids else {}), "skipped": {}}

    def state_dict(self) -> dict:
        """Where this object's iteration stands: after the last item it yielded. Plain ints and lists
        (torch.save and json both take it). Under DataLoader workers, call it in each worker (torchdata's
        StatefulDataLoader does); the main process's copy never iterates."""
        state = self._resume or self._state
        if state is None:
            state = self._fresh_state(*self._partition())
        return _copy_carry(state)

    def load_state_dict(self, state: dict):
        """Make the next iteration continue where `state` stopped (same source, config and partition)."""
        for key, saved in state["config"].items():
            now = self._config().get(key)
            if saved != now:
                raise ValueError(f"cannot resume: the saved state has {key}={saved!r} but this dataset has "
                                 f"{key}={now!r}; construct the dataset with the saved value")
        self.epoch = state["epoch"]
        self._resume = _copy_carry(state)
        self._skipped = collections.Counter(self._resume["skipped"])

    def set_epoch(self, epoch: int):
        """Change the shuffle of the bins (not the order documents are read); restart from the top."""
        self.epoch, self._resume, self._state = epoch, None, None
        self._skipped = collections.Counter()

    # -- iteration ------------------------------------------------------------------------------
    def _partition(self) -> tuple[int, int]:
        split = current_split(self.rank, self.world_size, get_worker_info())
        return split.rank * split.num_workers + split.worker, split.world_size * split.num_workers

    def _documents(self, start: int, partition: int, n_partitions: int):
        """(source position just after the document, the raw document) for this partition, from `start`."""
        source = self.source() if callable(self.source) else self.source
        if hasattr(source, "__getitem__") and hasattr(source, "__len__") and not isinstance(source, dict):
            first = start + (partition - start) % n_partitions
            for i in range(first, len(source), n_partitions):
                yield i + 1, source[i]
            return
        for i, doc in enumerate(itertools.islice(source, start, None), start):
            if i % n_partitions == partition:
                yield i + 1, doc

    def _encode(self, docs: list[tuple[int, object]]) -> list[tuple]:
        """(ids, loss mask or None[, role ids: chat with fields.role_ids]) of each accepted document of a
        buffer (DocumentEncoder.encode); the bad records counted by reason (self._skipped), the first one
        warned about once."""
        out, skips = self.encoder.encode(docs)
        self._count(skips)
        return out

    def _count(self, skips: Skips):
        self._skipped.update(skips.counts)
        if skips.first is not None and not self._warned:
            self._warned = True
            _, where, reason = skips.first
            warnings.warn(f"OnlinePackedDataset skips bad records, counted by reason in .skipped (the build's "
                          f"reasons); the first: {where}: {reason}", stacklevel=4)

    def _pieces(self, docs: list[tuple]) -> list[tuple]:
        """(ids, mask[, roles]) pieces of the documents under the long-document policy; a piece's mask
        (and role ids) is its slice of its document's."""
        docs = [d for d in docs if len(d[0])]
        lengths = np.fromiter((len(d[0]) for d in docs), dtype=np.int64, count=len(docs))
        piece_doc, piece_offset, piece_len = cut_long(lengths, self.config.context_length, self.config.long_docs)
        return [tuple(None if x is None else x[o : o + n] for x in docs[d])
                for d, o, n in zip(piece_doc.tolist(), piece_offset.tolist(), piece_len.tolist())]

    def __iter__(self):
        from packer.train.items import make_item

        partition, n_partitions = self._partition()
        state = self._resume or self._fresh_state(partition, n_partitions)
        self._resume = None
        if (state["partition"], state["n_partitions"]) != (partition, n_partitions):
            raise ValueError(f"cannot resume: the state is for partition {state['partition']} of "
                             f"{state['n_partitions']} but this iterator is partition {partition} of {n_partitions}; "
                             "resume with the same ranks and DataLoader workers")
        self._state = state
        self._skipped = collections.Counter(state.get("skipped", {}))
        carry_masks = state.get("carry_masks") or [None] * len(state["carry"])  # older states: texts only
        carry = [(np.asarray(c, dtype=np.int64), None if m is None else np.asarray(m, dtype=np.uint8))
                 for c, m in zip(state["carry"], carry_masks)]
        if self.return_role_ids:  # chat pieces: (ids, mask, roles)
            carry = [(*piece, np.asarray(r, dtype=np.uint8)) for piece, r in zip(carry, state["carry_roles"])]
        source_pos, buffer_index, skip = state["source_pos"], state["buffer_index"], state["n_yielded"]
        docs = self._documents(source_pos, partition, n_partitions)
        while True:
            at_start = {**state, "source_pos": source_pos, "buffer_index": buffer_index, "n_yielded": 0,
                        **_carry_lists(carry, self.return_role_ids),
                        "skipped": dict(self._skipped)}  # resuming here re-reads this buffer
            raw = list(itertools.islice(docs, self.buffer_docs))
            final = len(raw) < self.buffer_docs
            next_pos = raw[-1][0] if raw else source_pos
            pieces = carry + self._pieces(self._encode(raw))
            lengths = np.fromiter((len(p[0]) for p in pieces), dtype=np.int64, count=len(pieces))
            emitted, carried = pack_buffer(lengths, self.config.context_length, self.config.algorithm, policy=self.policy,
                                           final=final)
            carry = [tuple(None if x is None else x.copy() for x in pieces[i])  # a copy: a view would pin
                     for i in flat_indices(carried)]  # its whole document
            after = {**state, "source_pos": next_pos, "buffer_index": buffer_index + 1, "n_yielded": 0,
                     **_carry_lists(carry, self.return_role_ids), "skipped": dict(self._skipped)}
            order = np.random.default_rng([self.config.seed, self.epoch, partition, buffer_index]).permutation(len(emitted))
            for j in range(skip, len(emitted)):
                self._state = {**at_start, "n_yielded": j + 1} if j + 1 < len(emitted) else after
                bin_pieces = [pieces[i] for i in emitted[order[j]]]
                offsets = np.concatenate([[0], np.cumsum([len(p[0]) for p in bin_pieces])])
                roles = np.concatenate([p[2] for p in bin_pieces]) if self.return_role_ids else None
                yield make_item(np.concatenate([p[0] for p in bin_pieces]), offsets,
                                loss_mask=_bin_mask(bin_pieces), pad_to=self.fields.pad_to, pad_id=self.pad_id,
                                return_attention_mask=self.fields.attention_mask,
                                return_document_ids=self.fields.document_ids, role_ids=roles,
                                pad_multiple=self.fields.pad_multiple, return_seq_idx=self.fields.seq_idx)
            self._state = after  # also when the buffer emitted nothing (every bin carried)
            if final:
                return
            source_pos, buffer_index, skip = next_pos, buffer_index + 1, 0


def _bin_mask(pieces: list[tuple]) -> np.ndarray | None:
    """The loss mask of a bin of (ids, mask[, roles]) pieces: None when no piece has one (all trained)."""
    if all(p[1] is None for p in pieces):
        return None
    return np.concatenate([np.ones(len(p[0]), np.uint8) if p[1] is None else p[1] for p in pieces])


def _carry_lists(carry: list[tuple], roles: bool = False) -> dict:
    """Carried (ids, mask[, roles]) pieces as the state's plain lists: "carry" (ids), "carry_masks" (mask
    or None) and, with `roles`, "carry_roles"."""
    lists = {"carry": [p[0].tolist() for p in carry], "carry_masks": [None if p[1] is None else p[1].tolist()
                                                                       for p in carry]}
    if roles:
        lists["carry_roles"] = [p[2].tolist() for p in carry]
    return lists


def _copy_carry(state: dict) -> dict:
    masks = state.get("carry_masks") or [None] * len(state["carry"])
    roles = {"carry_roles": [list(r) for r in state["carry_roles"]]} if "carry_roles" in state else {}
    return {**state, "carry": [list(c) for c in state["carry"]],
            "carry_masks": [None if m is None else list(m) for m in masks], **roles,
            "skipped": dict(state.get("skipped", {}))}
