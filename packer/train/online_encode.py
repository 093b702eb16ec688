"""Source documents of an online stream -> (ids, loss mask[, role ids]), as `packer build` encodes them:
texts through the one text path, records through the build's RecordEncoder, pre-tokenized ids as given.

A document is a text, token ids, an (ids, loss_mask) pair, or a dict: {text_field: ...},
{"input_ids": [...], "loss_mask" | "labels": [...]}, or a record of config.input_kind. Each becomes

    ids   int64 [T]   bos/eos added as the build adds them (texts, plain ids; records by their encoder)
    mask  uint8 [T]   1 = trained; None when every token is (texts, plain ids)
    roles uint8 [T]   chat records with config.store_roles only: each token's role id (the build's role_ids)
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import os
import re
import tempfile

import numpy as np
import torch

from packer.config import BuildConfig
from packer.encode.chat_source import chat_template_of
from packer.encode.engines import choose_engine
from packer.encode.records import RECORD_BATCH, RECORD_KINDS, RecordEncoder, kind_of_fields
from packer.encode.text import encode_stream, encode_texts
from packer.encode.tokenizer import (
    BOS_CANDIDATES,
    EOS_CANDIDATES,
    configure,
    configured_copy,
    load_encoder,
    load_tokenizer,
    resolve_tokenizer,
    special_id,
    tokenizer_info,
)
from packer.io import atomic
from packer.masks import IGNORE_INDEX


class DocumentEncoder:
    """The build's encoders for one config and tokenizer (a tokenizer.json path, or a tokenizers.Tokenizer,
    copied and the copy configured, never changed itself). eos and bos are the build's: for a path, the
    eos its tokenizer_config.json names and, with config.bos None, a bos where its add_bos_token says so
    (eos_id= / bos_id= override, config.eos / config.bos turn them off or on); a Tokenizer object has no
    config files beside it, so its eos is config.eos_token or guessed by name, and bos is off unless asked for.
    Texts and records are encoded by the build's engine (config.encode_engine) for a path; a Tokenizer
    object's texts by the object (hf)."""

    def __init__(self, tokenizer, config: BuildConfig, eos_id: int | None = None, bos_id: int | None = None):
        self.config = config
        self.tokenizer_path = None  # the tokenizer.json the records' encoders read (beside it: the chat template)
        if isinstance(tokenizer, (str, os.PathLike)):
            self.tokenizer_path = resolve_tokenizer(os.fspath(tokenizer))
            tokenizer = load_tokenizer(self.tokenizer_path)  # shared, configured on load, never changed
        elif tokenizer is not None:
            tokenizer = configured_copy(tokenizer)  # the caller's object stays as it was
        self.tokenizer = tokenizer
        if self.tokenizer_path is not None:  # the build's engine (config.encode_engine), checked now: a forced one may refuse
            choose_engine(self.tokenizer_path, config.encode_engine)
        self.eos_id, self.bos_id = self._specials(eos_id, bos_id)
        self._encoders: dict = {}  # kind -> the build's RecordEncoder, made in the process that encodes
        if config.input_kind in RECORD_KINDS:
            self._check_records_can_encode(config.input_kind)

    def _specials(self, eos_id: int | None, bos_id: int | None):
        """(eos id, bos id) added: ids given win; for a tokenizer path, the build's choice (tokenizer_info:
        the eos its tokenizer_config.json names, bos as its add_bos_token says when bos is None), so texts
        get the ids `packer build` stores; for a Tokenizer object, config's token names or the guesses."""
        c = self.config
        eos, bos = c.eos, c.bos
        if self.tokenizer_path is not None and ((eos and eos_id is None) or (bos is not False and bos_id is None)):
            info = tokenizer_info(self.tokenizer_path, c)
            return (eos_id if eos_id is not None else info.eos_id) if eos else None, \
                (bos_id if bos_id is not None else info.bos_id) if bos is not False else None
        return (_special_id(self.tokenizer, eos_id, c.eos_token, EOS_CANDIDATES, "eos") if eos else None,
                _special_id(self.tokenizer, bos_id, c.bos_token, BOS_CANDIDATES, "bos")
                if bos or (bos is None and bos_id is not None) else None)

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_encoders": {}}  # a worker makes its own (compiled templates do not pickle)

    def __setstate__(self, state: dict):
        """A pickled copy (a spawned DataLoader worker) loses encode_special_tokens, which a
        tokenizer's JSON does not carry: configure the worker's own copy again."""
        self.__dict__.update(state)
        if self.tokenizer is not None:
            configure(self.tokenizer)

    def encode(self, docs: list[tuple[int, object]]) -> tuple[list[tuple], Skips]:
        """(ids int64 [T], loss mask uint8 [T] or None for all trained[, role ids uint8 [T]: chat records
        with config.store_roles]) of each accepted document of a buffer of (source position + 1, document):
        the texts and plain ids first, in source order, then each record kind's examples, in source order,
        encoded RECORD_BATCH at a time by the build's RecordEncoder; and the bad records skipped, by reason."""
        plain, records = [], collections.defaultdict(list)
        skips = Skips()
        for pos, doc in docs:
            kind = self._kind_of(doc)
            if kind == "text":
                plain.append((pos, doc))
            elif kind is None:  # not a record, or a dict holding no kind's fields (auto)
                skips.add("missing_field", f"source document {pos - 1}")
            else:
                records[kind].append((f"source document {pos - 1}", _plain_record(doc, kind, self.config)))
        out = self._tokenize(plain)
        for kind in RECORD_KINDS:
            for start in range(0, len(records[kind]), RECORD_BATCH):
                encoded = self._encoder(kind).encode(records[kind][start : start + RECORD_BATCH], skips)
                bounds = np.cumsum(encoded.lengths)[:-1]
                parts = [np.split(encoded.ids.astype(np.int64), bounds), np.split(encoded.mask, bounds)]
                out += zip(*parts, *([np.split(encoded.roles, bounds)] if encoded.roles is not None else []))
        return out, skips

    def _kind_of(self, doc) -> str | None:
        """The kind a source document is read as; None: skipped (missing_field). `auto` reads a dict's
        fields as the build's auto reads a file's first record (packer/encode/records.kind_of_fields):
        messages -> chat, ids -> tokens, prompt and completion -> prompt-completion, the text field ->
        text; anything not a dict (a text, token ids, an (ids, mask) pair) is taken as the text kind takes it."""
        c = self.config
        kind = c.input_kind
        if kind == "text":
            return "text"
        if kind != "auto":
            return kind if isinstance(doc, dict) else None
        if not isinstance(doc, dict):
            return "text"
        kind = kind_of_fields(doc, c)
        return kind if kind != "text" or c.text_field in doc else None

    def _check_records_can_encode(self, kind: str):
        """The errors a record kind would meet on its first record, raised when the dataset is made."""
        if self.tokenizer is None:
            raise ValueError(f"input_kind={kind!r} encodes records with a tokenizer (and checks ids against its "
                             "vocabulary) but tokenizer=None; pass tokenizer=PATH_TO_tokenizer.json")
        if kind != "chat":
            return
        if self.tokenizer_path is None and self.config.chat_template is None:
            raise ValueError("chat records need a chat template, and a tokenizers.Tokenizer object carries none; "
                             "pass BuildConfig(chat_template=FILE) (a .jinja file or a tokenizer_config.json), or "
                             "tokenizer=PATH to a tokenizer.json with its tokenizer_config.json beside it")
        chat_template_of(self.tokenizer_path or "tokenizer object", self.config.chat_template)

    def _encoder(self, kind: str) -> RecordEncoder:
        """The build's encoder for `kind`, made once per process: its TokenizerInfo is this tokenizer with
        this encoder's eos and bos (as for texts)."""
        if kind not in self._encoders:
            self._check_records_can_encode(kind)
            path = self.tokenizer_path or _saved_tokenizer(self.tokenizer)
            info = tokenizer_info(path, dataclasses.replace(self.config, eos=False, bos=False, eos_token=None,
                                                            bos_token=None))
            token = lambda i: None if i is None else self.tokenizer.id_to_token(i)  # noqa: E731
            info = dataclasses.replace(info, eos_id=self.eos_id, bos_id=self.bos_id, eos_token=token(self.eos_id),
                                       bos_token=token(self.bos_id))
            self._encoders[kind] = RecordEncoder(kind, info, self.config, encode_texts)
        return self._encoders[kind]

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
            batches = list(encode_stream(self._text_encoder(), texts, dtype=np.int64, eos_id=self.eos_id,
                                         bos_id=self.bos_id))
            flat = np.concatenate([ids for ids, _ in batches])
            lengths = np.concatenate([n for _, n in batches])
            for k, ids in zip(where, np.split(flat, np.cumsum(lengths)[:-1])):
                out[k] = (ids, None)
        return out

    def _text_encoder(self):
        """The build's text encoder: a tokenizer path's engine (packer/encode/engines, as `packer build`
        chooses it), a Tokenizer object's own encoding (hf)."""
        if self.tokenizer_path is None:
            return self.tokenizer
        return load_encoder(self.tokenizer_path, choose_engine(self.tokenizer_path, self.config.encode_engine).name)

    def _unpack(self, pos: int, doc):
        """A source document as a text, or (ids int64 [T], loss mask uint8 [T] or None)."""
        text_field = self.config.text_field
        if isinstance(doc, dict):
            if text_field in doc:
                doc = doc[text_field]
            elif "input_ids" in doc:
                return _masked_ids(pos, doc["input_ids"], doc.get("loss_mask"), doc.get("labels"))
            else:
                raise ValueError(f"source document {pos - 1}: a dict without {text_field!r} or 'input_ids' "
                                 f"(keys: {', '.join(map(str, doc))}); pass BuildConfig(text_field=NAME)")
        if isinstance(doc, str):
            return doc
        if isinstance(doc, tuple) and len(doc) == 2 and all(np.ndim(x) == 1 for x in doc):  # (ids, loss_mask)
            return _masked_ids(pos, doc[0], doc[1], None)
        if isinstance(doc, (list, tuple, np.ndarray)) or (torch is not None and torch.is_tensor(doc)):
            return np.asarray(doc, dtype=np.int64).reshape(-1), None
        raise ValueError(f"source document {pos - 1}: expected a text, a list of token ids, an (ids, loss_mask) "
                         f"pair or a dict with {text_field!r} or 'input_ids'; got {type(doc).__name__}")

    def _add_specials(self, ids: np.ndarray) -> np.ndarray:
        """Plain token ids (no mask) with this encoder's bos and eos around them, as texts get them."""
        head = [self.bos_id] if self.bos_id is not None else []
        tail = [self.eos_id] if self.eos_id is not None else []
        if not (head or tail):
            return ids
        return np.concatenate([np.asarray(head, np.int64), ids, np.asarray(tail, np.int64)])


def _special_id(tokenizer, given: int | None, name: str | None, candidates, what: str) -> int:
    if given is not None:
        return int(given)
    return special_id(tokenizer, name, candidates, what,
                      f"pass {what}_id=ID, or BuildConfig({what}=False) if the token ids already carry it")


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


class Skips:
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
