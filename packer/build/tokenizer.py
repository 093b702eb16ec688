"""Find a tokenizer, load it configured for packing (once, never changed afterwards), and name its special ids.

Configured for packing means three settings, whatever the tokenizer.json says:

    encode_special_tokens = True   "<|endoftext|>" inside a document is text, not the eos id
    no_truncation()                many tokenizer.json files ship `truncation: {max_length: 128}` ...
    no_padding()                   ... and padding on: every document would be cut or padded silently

`encode_special_tokens` is not part of the tokenizer's JSON, so a pickled or `from_str` copy loses
it: code that receives a tokenizer object calls `configured_copy` (or `configure` on its own copy).
"""

from __future__ import annotations

import functools
import glob
import hashlib
import json
import os
from dataclasses import dataclass

import numpy as np

from packer.config import BuildConfig
from packer.io import fs

EOS_CANDIDATES = ("<|endoftext|>", "</s>", "<|end_of_text|>", "<eos>", "<|eot_id|>", "[SEP]")
BOS_CANDIDATES = ("<|begin_of_text|>", "<s>", "<bos>", "<|startoftext|>", "[CLS]")


@dataclass(frozen=True)
class TokenizerInfo:
    """What the manifest records about a tokenizer, and the special ids a build uses.

    shipped_truncation / shipped_padding: what the tokenizer.json itself set (its truncation
    max_length, whether it padded), turned off by load_tokenizer; for the build summary."""

    path: str
    sha256: str
    vocab_size: int
    eos_id: int | None
    bos_id: int | None
    shipped_truncation: int | None = None
    shipped_padding: bool = False

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(np.uint16 if self.vocab_size <= 2**16 else np.uint32)


def resolve_tokenizer(name_or_path: str) -> str:
    """A tokenizer.json path or URI, a directory holding one, or a hub name already in the local HF
    cache ("gpt2", "org/name"; looked up offline, never downloaded) -> the tokenizer.json path."""
    if fs.is_uri(name_or_path):  # s3://, gs://, ... (packer/io/fs.py): read, never downloaded to disk
        loc = fs.location(name_or_path)
        if isinstance(loc, fs.RemotePath):
            for candidate in (loc, loc / "tokenizer.json"):
                if candidate.is_file():
                    return str(candidate)
            raise FileNotFoundError(f"tokenizer not found: {fs.redact(name_or_path)} (neither a tokenizer.json nor a directory holding one)")
        name_or_path = str(loc)  # file:// -> its path
    if os.path.isfile(name_or_path):
        return name_or_path
    if os.path.isfile(os.path.join(name_or_path, "tokenizer.json")):
        return os.path.join(name_or_path, "tokenizer.json")
    home = os.environ.get("HF_HOME", os.path.join(os.path.expanduser("~"), ".cache", "huggingface"))
    cache = os.environ.get("HF_HUB_CACHE", os.path.join(home, "hub"))
    repo = os.path.join(cache, "models--" + name_or_path.replace("/", "--"))
    ref = os.path.join(repo, "refs", "main")
    if os.path.isfile(ref):
        with open(ref, encoding="utf-8") as f:
            candidate = os.path.join(repo, "snapshots", f.read().strip(), "tokenizer.json")
        if os.path.isfile(candidate):
            return candidate
    found = sorted(glob.glob(os.path.join(glob.escape(repo), "snapshots", "*", "tokenizer.json")))
    if found:
        return found[-1]
    raise FileNotFoundError(
        f"tokenizer not found: {name_or_path} (not a file, and not in the local HF cache {cache}; "
        "give the path of a local tokenizer.json, e.g. sample_data/tokenizer.json; nothing is downloaded)"
    )


def configure(tok):
    """Set `tok` up for packing (see the module docstring), in place; return it."""
    tok.encode_special_tokens = True
    tok.no_truncation()
    tok.no_padding()
    return tok


def configured_copy(tok):
    """A copy of a `tokenizers.Tokenizer`, configured for packing; `tok` itself is left as it was."""
    from tokenizers import Tokenizer

    if not isinstance(tok, Tokenizer):
        hint = " (for a transformers tokenizer, pass its .backend_tokenizer)" if hasattr(tok, "backend_tokenizer") else ""
        raise ValueError(f"tokenizer must be a path to a tokenizer.json or a tokenizers.Tokenizer; "
                         f"got {type(tok).__name__}{hint}")
    return configure(Tokenizer.from_str(tok.to_str()))


@functools.lru_cache(maxsize=4)
def load_tokenizer(path: str):
    """Load a tokenizer (path or cached hub name, see resolve_tokenizer) once per process, configured
    for packing. Shared by every caller in the process: never change the object it returns."""
    from tokenizers import Tokenizer

    path = resolve_tokenizer(path)
    try:
        if fs.is_remote(path):
            tok = Tokenizer.from_str(fs.location(path).read_text())
        else:
            tok = Tokenizer.from_file(path)
    except Exception as e:  # tokenizers raises a plain Exception on bad JSON
        raise ValueError(f"{fs.redact(path)}: not a valid tokenizer.json ({fs.redact_text(e)})") from None
    return configure(tok)


def special_id(tok, name: str | None, candidates, what: str, fix: str) -> int:
    """The id of token `name`, or (no name) of the first of `candidates` the tokenizer has.
    `fix` ends the error message: how the caller names the token or turns it off."""
    if tok is None:
        raise ValueError(f"a {what} token id is needed, but no tokenizer was given; {fix}")
    for candidate in (name,) if name else candidates:
        token_id = tok.token_to_id(candidate)
        if token_id is not None:
            return token_id
    if name:
        raise ValueError(f"the tokenizer has no token {name!r}; {fix}")
    raise ValueError(f"cannot find a {what} token in the tokenizer (tried {', '.join(candidates)}); {fix}")


def _shipped_settings(data: bytes) -> tuple[int | None, bool]:
    """(truncation max_length or None, padding on) as the tokenizer.json itself sets them."""
    try:
        shipped = json.loads(data)
    except ValueError:
        return None, False
    truncation = shipped.get("truncation") if isinstance(shipped, dict) else None
    padding = shipped.get("padding") if isinstance(shipped, dict) else None
    max_length = truncation.get("max_length") if isinstance(truncation, dict) else None
    return (int(max_length) if max_length is not None else None), bool(padding)


def tokenizer_info(path: str, config: BuildConfig) -> TokenizerInfo:
    path = resolve_tokenizer(path)
    tok = load_tokenizer(path)
    data = fs.location(path).read_bytes()
    eos_id = special_id(tok, config.eos_token, EOS_CANDIDATES, "end-of-text",
                        "name one it has with --eos-token, or turn it off with --no-eos") if config.eos else None
    bos_id = special_id(tok, config.bos_token, BOS_CANDIDATES, "begin-of-text",
                        "name one it has with --bos-token, or turn it off with --no-bos") if config.bos else None
    truncation, padding = _shipped_settings(data)
    return TokenizerInfo(path, hashlib.sha256(data).hexdigest(), tok.get_vocab_size(with_added_tokens=True),
                         eos_id, bos_id, truncation, padding)
