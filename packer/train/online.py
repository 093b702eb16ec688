"""OnlinePackedDataset: documents from a stream, tokenized and packed one bounded buffer at a time
(the buffer, pack and carry steps are packer/online_pack.py's).

Partitions: with R ranks and W DataLoader workers there are n = R * W partitions; partition
p = rank * W + worker owns the source documents i with i % n == p, so the partitions are disjoint
and together cover the stream. Each partition packs, shuffles and carries on its own.
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import itertools
import os
import re
import tempfile
import warnings
from dataclasses import asdict

import numpy as np
import torch
from torch.utils.data import IterableDataset, get_worker_info

from packer.config import ALGORITHMS, RECORD_FIELDS, BuildConfig
from packer.encode.chat_source import chat_template_of
from packer.encode.records import RECORD_BATCH, RECORD_KINDS, RecordEncoder, kind_of_fields
from packer.encode.text import encode_stream, encode_texts
from packer.encode.tokenizer import (
    BOS_CANDIDATES,
    EOS_CANDIDATES,
    configure,
    configured_copy,
    load_tokenizer,
    resolve_tokenizer,
    special_id,
    tokenizer_info,
)
from packer.io import atomic
from packer.masks import IGNORE_INDEX
from packer.online_pack import (
    MAX_CARRY_BINS,
    MIN_FILL,
    CarryPolicy,
    check_online_args,
    cut_long,
    flat_indices,
    pack_buffer,
)
from packer.train.partition import check_rank, current_split

_BUILD = BuildConfig()  # the record settings' defaults: the same words mean the same in the build and online


class OnlinePackedDataset(IterableDataset):
    """Pack a stream of documents on the fly into items with exactly PackedDataset's fields.

        ds = OnlinePackedDataset(texts, tokenizer="tokenizer.json", context_length=2048, pad_to=2048)
        for item in DataLoader(ds, batch_size=None, num_workers=2):
            item["input_ids"], item["labels"], item["position_ids"], item["cu_seqlens"], item["max_seqlen"]

    `source` yields texts, token-id lists (then `tokenizer` may be None) or dicts holding
    `text_field` (an HF `datasets` dataset); it may also be a function returning a fresh iterable.
    Texts become exactly the ids `packer build` stores (the one encode path, encode_stream in
    packer/preprocess/tokenize.py); `tokenizer` is a tokenizer.json path, or a tokenizers.Tokenizer, which
    is copied and the copy configured (packer/encode/tokenizer.py), never changed itself. eos and bos
    are the build's too: for a path, the eos its tokenizer_config.json names and, with bos=None, a bos
    where its add_bos_token says so (eos_id= / bos_id= / bos=True|False override); a Tokenizer object
    has no config files beside it, so its eos is guessed by name and bos is off unless asked for.

    Fine-tuning examples, pre-tokenized, carry a loss mask: a dict {"input_ids": [...], "loss_mask":
    [0/1 ...]} or {"input_ids": [...], "labels": [... -100 ...]} (labels equal to input_ids except
    -100 on untrained tokens, HF's unshifted convention), or a pair (ids, loss_mask). They are taken
    as they are, no bos or eos added, as `packer build --input-kind tokens` takes them; their items'
    labels are -100 on untrained tokens (packer/train/items.py draws it). Long examples split as
    texts do, each piece keeping its part of the mask.

    Fine-tuning records, input_kind="prompt-completion" | "chat" | "tokens" (default "text": all of the
    above): dicts as `packer build --input-kind KIND` reads them, encoded RECORD_BATCH at a time by the
    build's own RecordEncoder (packer/encode/records.py), so each accepted example has exactly the ids
    and loss mask the build stores for it. The record settings (prompt_field ... long_prompts) are
    BuildConfig's, names and defaults; the chat template is the one beside a tokenizer.json path
    (tokenizer_config.json, chat_template.jinja), or chat_template=FILE, which a tokenizers.Tokenizer
    object needs. input_kind="auto" reads each record's fields as the build's auto reads a file's first
    record: messages_field -> chat, ids_field -> tokens (labels or loss mask required), prompt_field and
    completion_field -> prompt-completion, text_field -> text; what is not a dict (a text, token ids, a
    pair) is taken as "text" takes it. Bad records are skipped, never raised: counted by the build's
    reasons in `skipped`, the first named in one warning (a dict with no kind's field, or a non-dict
    under a record kind: missing_field). A template that cannot give exact spans raises TemplateRefused.
    In a buffer the texts and plain ids come first, then each record kind's examples, in source order.

    return_role_ids=True (input_kind="chat"; `role_names` as the build's --role-names) gives each item the
    `role_ids` a build with --store-roles stores for its tokens, under the role table `roles`, for a
    packer.masks.RolePolicy (docs/role_masks.md); carried pieces keep theirs (the state's carry_roles).

    Resume re-reads the source from its start and skips what was consumed (a list or map-style
    dataset is indexed directly), so the source must give the same documents in the same order; the
    state holds the skip counts, so a resumed run counts what an uninterrupted one counts.
    """

    def __init__(self, source, *, tokenizer=None, context_length: int, buffer_docs: int = 10_000,
                 algorithm: str = "ffd", seed: int = 0, long_docs: str = "split", eos: bool = True,
                 bos: bool | None = None, eos_id: int | None = None, bos_id: int | None = None,
                 pad_to: int | None = None, pad_id: int | None = None, text_field: str = "text",
                 return_attention_mask: bool = False, return_document_ids: bool = False,
                 rank: int | None = None, world_size: int | None = None,
                 min_fill: float = MIN_FILL, max_carry_bins: int = MAX_CARRY_BINS,
                 input_kind: str = _BUILD.input_kind, prompt_field: str = _BUILD.prompt_field,
                 completion_field: str = _BUILD.completion_field, messages_field: str = _BUILD.messages_field,
                 ids_field: str = _BUILD.ids_field, labels_field: str = _BUILD.labels_field,
                 loss_mask_field: str = _BUILD.loss_mask_field, train_roles: str | tuple = _BUILD.train_roles,
                 chat_template: str | None = _BUILD.chat_template, long_prompts: str = _BUILD.long_prompts,
                 return_role_ids: bool = False, role_names: str = _BUILD.role_names):
        check_online_args(context_length, buffer_docs, long_docs)
        if algorithm not in ALGORITHMS:
            raise ValueError(f"algorithm must be one of {', '.join(ALGORITHMS)}; got {algorithm!r}")
        if pad_to is not None and pad_to < context_length:
            raise ValueError(f"pad_to={pad_to} is shorter than context_length={context_length}; "
                             "pad to at least the context length or leave pad_to=None")
        check_rank(rank, world_size)
        if return_role_ids and input_kind != "chat":
            raise ValueError(f"return_role_ids=True gives the roles of chat messages: it needs input_kind=\"chat\" "
                             f"(got {input_kind!r})")
        self.source, self.text_field = source, text_field
        self._tokenizer_path = None  # the tokenizer.json the records' encoders read (beside it: the chat template)
        if isinstance(tokenizer, (str, os.PathLike)):
            self._tokenizer_path = resolve_tokenizer(os.fspath(tokenizer))
            tokenizer = load_tokenizer(self._tokenizer_path)  # shared, configured on load, never changed
        elif tokenizer is not None:
            tokenizer = configured_copy(tokenizer)  # the caller's object stays as it was
        self.tokenizer = tokenizer
        self.eos_id, self.bos_id = self._specials(eos, bos, eos_id, bos_id)
        self.pad_id = pad_id if pad_id is not None else (self.eos_id if self.eos_id is not None else 0)
        self.context_length, self.buffer_docs, self.algorithm = context_length, buffer_docs, algorithm
        self.seed, self.long_docs, self.pad_to = seed, long_docs, pad_to
        self.return_attention_mask, self.return_document_ids = return_attention_mask, return_document_ids
        self.rank, self.world_size = rank, world_size
        self.policy = CarryPolicy(min_fill=min_fill, max_carry_bins=max_carry_bins)
        # the build's own config type: it checks the record settings, and the build's RecordEncoder reads it
        self.build_config = BuildConfig(
            context_length=context_length, long_docs=long_docs, eos=eos, bos=bos, text_field=text_field,
            shard_size=max(_BUILD.shard_size, context_length), input_kind=input_kind, prompt_field=prompt_field,
            completion_field=completion_field, messages_field=messages_field, ids_field=ids_field,
            labels_field=labels_field, loss_mask_field=loss_mask_field, train_roles=train_roles,
            chat_template=chat_template, long_prompts=long_prompts, store_roles=return_role_ids, role_names=role_names)
        self.return_role_ids = return_role_ids
        self.roles = self.build_config.role_table if return_role_ids else None
        if input_kind in RECORD_KINDS:
            self._check_records_can_encode(input_kind)
        self.epoch = 0
        self._resume: dict | None = None
        self._state: dict | None = None
        self._encoders: dict = {}  # kind -> the build's RecordEncoder, made in the process that iterates
        self._skipped: collections.Counter = collections.Counter()
        self._warned = False

    def _specials(self, eos: bool, bos: bool | None, eos_id: int | None, bos_id: int | None):
        """(eos id, bos id) this dataset adds: ids given win; for a tokenizer path, the build's choice
        (tokenizer_info: the eos its tokenizer_config.json names, bos as its add_bos_token says when bos
        is None), so texts get the ids `packer build` stores; for a Tokenizer object, the guesses."""
        if self._tokenizer_path is not None and ((eos and eos_id is None) or (bos is not False and bos_id is None)):
            info = tokenizer_info(self._tokenizer_path, BuildConfig(eos=eos, bos=bos))
            return (eos_id if eos_id is not None else info.eos_id) if eos else None, \
                (bos_id if bos_id is not None else info.bos_id) if bos is not False else None
        return (_special_id(self.tokenizer, eos_id, EOS_CANDIDATES, "eos") if eos else None,
                _special_id(self.tokenizer, bos_id, BOS_CANDIDATES, "bos") if bos or (bos is None and bos_id is not None)
                else None)

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_encoders": {}}  # a worker makes its own (compiled templates do not pickle)

    def __setstate__(self, state: dict):
        """A pickled copy (a spawned DataLoader worker) loses encode_special_tokens, which a
        tokenizer's JSON does not carry: configure the worker's own copy again."""
        self.__dict__.update(state)
        if self.tokenizer is not None:
            configure(self.tokenizer)

    @property
    def skipped(self) -> dict[str, int]:
        """Bad records this object's iteration skipped so far, by reason (the build's SKIP_REASONS names),
        a resumed state's included. Under DataLoader workers each worker counts its own (in its
        state_dict's "skipped"); the main process's copy never iterates."""
        return dict(sorted(self._skipped.items()))

    # -- resume ---------------------------------------------------------------------------------
    def _config(self) -> dict:
        records = self.build_config.to_dict()  # the record settings only when records are read, as a manifest has them
        return {"context_length": self.context_length, "buffer_docs": self.buffer_docs,
                "algorithm": self.algorithm, "seed": self.seed, "long_docs": self.long_docs,
                "eos_id": self.eos_id, "bos_id": self.bos_id, **asdict(self.policy),
                "input_kind": self.build_config.input_kind,
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
        """(ids int64 [T], loss mask uint8 [T] or None for all trained[, role ids uint8 [T]: chat with
        return_role_ids]) of each accepted document of a buffer: the texts and plain ids first, in source order, then each record kind's examples, in
        source order, encoded RECORD_BATCH at a time by the build's RecordEncoder. Bad records are
        counted by reason (self._skipped), the first one warned about once."""
        plain, records = [], collections.defaultdict(list)
        skips = _Skips()
        for pos, doc in docs:
            kind = self._kind_of(doc)
            if kind == "text":
                plain.append((pos, doc))
            elif kind is None:  # not a record, or a dict holding no kind's fields (auto)
                skips.add("missing_field", f"source document {pos - 1}")
            else:
                records[kind].append((f"source document {pos - 1}", _plain_record(doc, kind, self.build_config)))
        out = self._tokenize(plain)
        for kind in RECORD_KINDS:
            for start in range(0, len(records[kind]), RECORD_BATCH):
                encoded = self._encoder(kind).encode(records[kind][start : start + RECORD_BATCH], skips)
                bounds = np.cumsum(encoded.lengths)[:-1]
                parts = [np.split(encoded.ids.astype(np.int64), bounds), np.split(encoded.mask, bounds)]
                out += zip(*parts, *([np.split(encoded.roles, bounds)] if encoded.roles is not None else []))
        self._count(skips)
        return out

    def _kind_of(self, doc) -> str | None:
        """The kind a source document is read as; None: skipped (missing_field). `auto` reads a dict's
        fields as the build's auto reads a file's first record (packer/preprocess/record_reader.kind_of_fields):
        messages -> chat, ids -> tokens, prompt and completion -> prompt-completion, the text field ->
        text; anything not a dict (a text, token ids, an (ids, mask) pair) is taken as the text kind takes it."""
        kind, c = self.build_config.input_kind, self.build_config
        if kind == "text":
            return "text"
        if kind != "auto":
            return kind if isinstance(doc, dict) else None
        if not isinstance(doc, dict):
            return "text"
        kind = kind_of_fields(doc, c)
        return kind if kind != "text" or self.text_field in doc else None

    def _check_records_can_encode(self, kind: str):
        """The errors a record kind would meet on its first record, raised when the dataset is made."""
        if self.tokenizer is None:
            raise ValueError(f"input_kind={kind!r} encodes records with a tokenizer (and checks ids against its "
                             "vocabulary) but tokenizer=None; pass tokenizer=PATH_TO_tokenizer.json")
        if kind != "chat":
            return
        if self._tokenizer_path is None and self.build_config.chat_template is None:
            raise ValueError("chat records need a chat template, and a tokenizers.Tokenizer object carries none; "
                             "pass chat_template=FILE (a .jinja file or a tokenizer_config.json), or "
                             "tokenizer=PATH to a tokenizer.json with its tokenizer_config.json beside it")
        chat_template_of(self._tokenizer_path or "tokenizer object", self.build_config.chat_template)

    def _encoder(self, kind: str) -> RecordEncoder:
        """The build's encoder for `kind`, made once per process: its TokenizerInfo is this dataset's
        tokenizer with this dataset's eos and bos (as for texts)."""
        if kind not in self._encoders:
            self._check_records_can_encode(kind)
            path = self._tokenizer_path or _saved_tokenizer(self.tokenizer)
            info = tokenizer_info(path, dataclasses.replace(self.build_config, eos=False, bos=False, eos_token=None,
                                                            bos_token=None))
            token = lambda i: None if i is None else self.tokenizer.id_to_token(i)  # noqa: E731
            info = dataclasses.replace(info, eos_id=self.eos_id, bos_id=self.bos_id, eos_token=token(self.eos_id),
                                       bos_token=token(self.bos_id))
            self._encoders[kind] = RecordEncoder(kind, info, self.build_config, encode_texts)
        return self._encoders[kind]

    def _count(self, skips: _Skips):
        self._skipped.update(skips.counts)
        if skips.first is not None and not self._warned:
            self._warned = True
            _, where, reason = skips.first
            warnings.warn(f"OnlinePackedDataset skips bad records, counted by reason in .skipped (the build's "
                          f"reasons); the first: {where}: {reason}", stacklevel=4)

    def _tokenize(self, docs: list[tuple[int, object]]) -> list[tuple[np.ndarray, np.ndarray | None]]:
        """(ids int64 [T], loss mask uint8 [T] or None for all trained) of each source document."""
        out: list = [None] * len(docs)
        texts, where = [], []
        for k, (pos, doc) in enumerate(docs):
            doc = self._unpack(pos, doc)
            if isinstance(doc, str):
                texts.append(doc)
                where.append(k)
            else:
                ids, mask = doc
                out[k] = (ids, mask) if mask is not None else (self._add_specials(ids), None)
        if texts:  # the build's encode path: the same ids, bos/eos included, as `packer build` stores
            if self.tokenizer is None:
                raise ValueError("the source yields texts but tokenizer=None; pass tokenizer=PATH_TO_tokenizer.json")
            batches = list(encode_stream(self.tokenizer, texts, dtype=np.int64, eos_id=self.eos_id, bos_id=self.bos_id))
            flat = np.concatenate([ids for ids, _ in batches])
            lengths = np.concatenate([n for _, n in batches])
            for k, ids in zip(where, np.split(flat, np.cumsum(lengths)[:-1])):
                out[k] = (ids, None)
        return out

    def _unpack(self, pos: int, doc):
        """A source document as a text, or (ids int64 [T], loss mask uint8 [T] or None)."""
        if isinstance(doc, dict):
            if self.text_field in doc:
                doc = doc[self.text_field]
            elif "input_ids" in doc:
                return _masked_ids(pos, doc["input_ids"], doc.get("loss_mask"), doc.get("labels"))
            else:
                raise ValueError(f"source document {pos - 1}: a dict without {self.text_field!r} or 'input_ids' "
                                 f"(keys: {', '.join(map(str, doc))}); pass text_field=NAME")
        if isinstance(doc, str):
            return doc
        if isinstance(doc, tuple) and len(doc) == 2 and all(np.ndim(x) == 1 for x in doc):  # (ids, loss_mask)
            return _masked_ids(pos, doc[0], doc[1], None)
        if isinstance(doc, (list, tuple, np.ndarray)) or (torch is not None and torch.is_tensor(doc)):
            return np.asarray(doc, dtype=np.int64).reshape(-1), None
        raise ValueError(f"source document {pos - 1}: expected a text, a list of token ids, an (ids, loss_mask) "
                         f"pair or a dict with {self.text_field!r} or 'input_ids'; got {type(doc).__name__}")

    def _add_specials(self, ids: np.ndarray) -> np.ndarray:
        """Plain token ids (no mask) with this dataset's bos and eos around them, as texts get them."""
        head = [self.bos_id] if self.bos_id is not None else []
        tail = [self.eos_id] if self.eos_id is not None else []
        if not (head or tail):
            return ids
        return np.concatenate([np.asarray(head, np.int64), ids, np.asarray(tail, np.int64)])

    def _pieces(self, docs: list[tuple]) -> list[tuple]:
        """(ids, mask[, roles]) pieces of the documents under the long-document policy; a piece's mask
        (and role ids) is its slice of its document's."""
        docs = [d for d in docs if len(d[0])]
        lengths = np.fromiter((len(d[0]) for d in docs), dtype=np.int64, count=len(docs))
        piece_doc, piece_offset, piece_len = cut_long(lengths, self.context_length, self.long_docs)
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
            emitted, carried = pack_buffer(lengths, self.context_length, self.algorithm, policy=self.policy,
                                           final=final)
            carry = [tuple(None if x is None else x.copy() for x in pieces[i])  # a copy: a view would pin
                     for i in flat_indices(carried)]  # its whole document
            after = {**state, "source_pos": next_pos, "buffer_index": buffer_index + 1, "n_yielded": 0,
                     **_carry_lists(carry, self.return_role_ids), "skipped": dict(self._skipped)}
            order = np.random.default_rng([self.seed, self.epoch, partition, buffer_index]).permutation(len(emitted))
            for j in range(skip, len(emitted)):
                self._state = {**at_start, "n_yielded": j + 1} if j + 1 < len(emitted) else after
                bin_pieces = [pieces[i] for i in emitted[order[j]]]
                offsets = np.concatenate([[0], np.cumsum([len(p[0]) for p in bin_pieces])])
                roles = np.concatenate([p[2] for p in bin_pieces]) if self.return_role_ids else None
                yield make_item(np.concatenate([p[0] for p in bin_pieces]), offsets,
                                loss_mask=_bin_mask(bin_pieces), pad_to=self.pad_to, pad_id=self.pad_id,
                                return_attention_mask=self.return_attention_mask,
                                return_document_ids=self.return_document_ids, role_ids=roles)
            self._state = after  # also when the buffer emitted nothing (every bin carried)
            if final:
                return
            source_pos, buffer_index, skip = next_pos, buffer_index + 1, 0


def _special_id(tokenizer, given: int | None, candidates, what: str) -> int:
    if given is not None:
        return int(given)
    return special_id(tokenizer, None, candidates, what,
                      f"pass {what}_id=ID, or {what}=False if the token ids already carry it")


def _masked_ids(pos: int, ids, loss_mask, labels) -> tuple[np.ndarray, np.ndarray]:
    """A pre-tokenized example as (ids int64 [T], loss mask uint8 [T]); labels (-100 = untrained,
    else equal to the id) become the mask. Checked here, at the edge: lengths, 0/1 values."""
    ids = np.asarray(ids, dtype=np.int64).reshape(-1)
    if loss_mask is None and labels is None:
        return ids, None
    if labels is not None:
        labels = np.asarray(labels, dtype=np.int64).reshape(-1)
        if len(labels) != len(ids) or ((labels != IGNORE_INDEX) & (labels != ids)).any():
            raise ValueError(f"source document {pos - 1}: labels must equal input_ids except -100 on untrained tokens "
                             f"({len(labels)} labels, {len(ids)} ids); give loss_mask (0/1 per token) instead")
        return ids, (labels != IGNORE_INDEX).astype(np.uint8)
    mask = np.asarray(loss_mask).reshape(-1)
    if len(mask) != len(ids) or not np.isin(mask, (0, 1)).all():
        raise ValueError(f"source document {pos - 1}: loss_mask needs one 0/1 value per token ({len(mask)} values "
                         f"for {len(ids)} ids)")
    return ids, mask.astype(np.uint8)


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


class _Skips:
    """The skips of one buffer, as the build's SkipLog takes them (add(reason, where)): counts by reason and
    the first bad record in source order (the encoder of each kind reports its own records in order)."""

    def __init__(self):
        self.counts: collections.Counter = collections.Counter()
        self.first: tuple[int, str, str] | None = None

    def add(self, reason: str, where: str):
        self.counts[reason] += 1
        at = int(_WHERE.match(where).group(1))  # the encoders' `where` starts with ours: "source document N"
        if self.first is None or at < self.first[0]:
            self.first = (at, where, reason)


_WHERE = re.compile(r"source document (\d+)")


def _plain_record(record: dict, kind: str, config: BuildConfig) -> dict:
    """A record as the build's readers hand it over: numpy arrays and tensors (an HF dataset in numpy or
    torch format) become lists, so the encoder checks the same values it would read from JSON."""
    fields = {"tokens": (config.ids_field, config.labels_field, config.loss_mask_field)}.get(kind, ())
    arrays = [f for f in fields if isinstance(record.get(f), np.ndarray)
              or (torch is not None and torch.is_tensor(record.get(f)))]
    return {**record, **{f: record[f].tolist() for f in arrays}} if arrays else record


def _saved_tokenizer(tok) -> str:
    """A tokenizers.Tokenizer object as a tokenizer.json file (the build's encoder reads a path), once per
    content: <tmp>/packer-online-<sha256>/tokenizer.json, written atomically, nothing beside it.
    TODO(online-records): drop once RecordEncoder can take a tokenizer object beside its TokenizerInfo."""
    data = tok.to_str().encode("utf-8")
    path = os.path.join(tempfile.gettempdir(), f"packer-online-{hashlib.sha256(data).hexdigest()[:16]}",
                        "tokenizer.json")
    if not os.path.isfile(path):
        os.makedirs(os.path.dirname(path), exist_ok=True)
        atomic.write_bytes(path, data)
    return path
